// /v1/completions and /v1/chat/completions: parse and check the body, hand the request to the
// engine thread, answer with one JSON object or a Server-Sent Events stream (OpenAI's chunks).
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/json_limits.h"
#include "api/stream.h"
#include "server/server_impl.h"

namespace blend {
namespace {

using nlohmann::json;
using server_internal::BatchJob;
using server_internal::Clock;
using server_internal::dump;
using server_internal::Pending;
using server_internal::seconds_between;

std::string sse(const json& chunk) {
  return "data: " + dump(chunk) + "\n\n";
}

}  // namespace

void Server::Impl::completions_routes() {
  route("POST", "/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, Endpoint::kCompletions);
  });
  route("POST", "/v1/chat/completions",
        [this](const httplib::Request& req, httplib::Response& res) {
          completion(req, res, Endpoint::kChatCompletions);
        });
}

std::shared_ptr<Pending> Server::Impl::submit(const ApiRequest& request, RequestClass cls,
                                              int32_t index) {
  auto p = std::make_shared<Pending>();
  p->cls = cls;
  // Choice `index` is sample index % n of prompt index / n (several prompts: OpenAI's order).
  GenerationRequest gen{make_id("req-"),  request.prompt_at(static_cast<size_t>(index / request.n)),
                        request.params,   cls,
                        request.ttft_slo, request.tpot_slo};
  gen.index = index;
  gen.model = request.model_id;
  gen.adaptive_blocks = request.adaptive_blocks;
  loop->post([this, p, gen = std::move(gen)](Engine& engine) mutable {
    metrics.on_queued(p->cls);
    auto on_token = [this, p](const SampledToken& token, std::string_view delta) {
      if (!p->had_first_token) {
        p->had_first_token = true;
        p->first_token = Clock::now();
        metrics.on_first_token(p->cls, seconds_between(p->arrival, p->first_token));
      }
      {
        std::lock_guard lock(p->mu);
        p->text += delta;
        p->tokens.push_back(token);
      }
      // A token whose text is held back (a possible stop string, a partial UTF-8 character)
      // rides with the next chunk that has text.
      if (!delta.empty()) p->cv.notify_all();
    };
    auto on_done = [this, p](GenerationResult&& r) {
      const auto now = Clock::now();
      const int64_t n = static_cast<int64_t>(r.tokens.size());
      const double tpot =
          n > 1 ? seconds_between(p->first_token, now) / static_cast<double>(n - 1) : 0.0;
      metrics.on_finished(p->cls, p->had_first_token, finish_reason_name(r.finish), r.prompt_tokens,
                          n, seconds_between(p->arrival, now), tpot);
      {
        std::lock_guard lock(p->mu);
        if (r.finish == FinishReason::kError) {  // failed while generating: no answer
          const ApiError e = generation_error(r);
          p->error = e.body();
          p->error_status = e.status();
        }
        p->result = std::move(r);
        p->done = true;
      }
      p->cv.notify_all();
    };
    try {
      p->seq = engine.submit(std::move(gen), on_done, on_token);
      p->submitted = true;
    } catch (const Error& e) {
      metrics.on_cancelled(p->cls, false);
      {
        std::lock_guard lock(p->mu);
        p->error = ApiError(400, e.what()).body();
        p->error_status = 400;
        p->done = true;
      }
      p->cv.notify_all();
    }
  });
  return p;
}

void Server::Impl::cancel(const std::shared_ptr<Pending>& p) {
  loop->post([this, p](Engine& engine) {
    if (p->submitted && engine.cancel(p->seq)) metrics.on_cancelled(p->cls, p->had_first_token);
  });
}

bool Server::Impl::wait_done(Pending& p, int socket) {
  std::unique_lock lock(p.mu);
  while (!p.done) {
    if (stopping) return false;
    // A client that hung up gets no answer: stop generating it (as a stream's end does).
    if (socket >= 0 && peer_hung_up(socket)) return false;
    p.cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  return true;
}

RequestLimits Server::Impl::request_limits(const httplib::Request& req, ModelId model) {
  const ServedModel& served_model = served[static_cast<size_t>(model)];
  RequestLimits limits;
  limits.max_prompt_bytes = served_model.max_prompt_bytes;
  limits.sampling_defaults = served_model.sampling_defaults;
  limits.grammars = served_model.grammars;
  limits.max_sequence_tokens = max_sequence_tokens;
  // A schema compiling for a client that left stops (the socket is found once, when asked).
  limits.cancelled = [&req, socket = -2]() mutable {
    if (socket == -2) socket = request_socket(req);
    return socket >= 0 && peer_hung_up(socket);
  };
  return limits;
}

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res,
                              Endpoint endpoint) {
  json body;
  ApiRequest request;
  try {
    body = parse_client_json(req.body, "the request body");
  } catch (const ApiError& e) {
    return send_error(res, e.status(), e.what());
  }
  try {
    const ModelId model = model_of(body);
    const ServedModel& served_model = served[static_cast<size_t>(model)];
    RequestLimits limits = request_limits(req, model);
    limits.prompt_lists = true;  // each prompt's choices are submitted below
    request = parse_api_request(endpoint, body, *served_model.tokenizer, served_model.chat_template,
                                limits, req.body);
    request.model_id = model;
    // Limits the engine would quietly apply become errors, as in vLLM: a client asking for
    // more than fits should know.
    check_context(request, body, max_sequence_tokens);
  } catch (const ApiError& e) {
    return send_error(res, e);
  } catch (const Error& e) {
    return send_error(res, 400, e.what());
  }
  const RequestClass cls = body.value("service_tier", "") == "flex" ? RequestClass::kBestEffort
                                                                    : RequestClass::kRealtime;
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const std::string id = make_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_seconds();
  // n samples: n sequences of each prompt; the first to be admitted computes the prompt and
  // the others take its KV from the prefix cache (one prefill).
  const auto num_choices = static_cast<int32_t>(request.prompt_count()) * request.n;
  std::vector<std::shared_ptr<Pending>> ps;
  for (int32_t i = 0; i < num_choices; ++i) ps.push_back(submit(request, cls, i));
  auto cancel_all = [this, ps] {
    for (const auto& p : ps) cancel(p);
  };

  if (!request.stream) {
    for (const auto& p : ps) {
      if (wait_done(*p, request_socket(req))) continue;
      cancel_all();
      if (stopping) return send_error(res, 503, "the server is shutting down");
      // Nobody reads this answer; 499 (nginx's "client closed request") keeps the access log
      // honest. The body is set so that the error handler leaves it alone.
      res.status = 499;
      return res.set_content("{}", "application/json");
    }
    std::vector<GenerationResult> results;
    for (const auto& p : ps) {
      std::lock_guard lock(p->mu);
      if (p->error) {
        cancel_all();
        metrics.on_error(p->error_status);
        res.status = p->error_status;
        return res.set_content(dump(*p->error), "application/json");
      }
      results.push_back(*p->result);
    }
    const json body_out = make_response(request, results, id, model_name(request.model_id), created,
                                        tokenizer_of(request.model_id));
    server_internal::request_log().prompt_tokens = body_out["usage"]["prompt_tokens"];
    server_internal::request_log().completion_tokens = body_out["usage"]["completion_tokens"];
    res.set_content(body_out.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    return;
  }

  // Server-Sent Events in OpenAI's chunk format (api/stream), logprobs included when asked;
  // with n > 1 the choices' chunks interleave, each with its index.
  struct Choice {
    std::shared_ptr<Pending> p;
    std::unique_ptr<StreamChunks> chunks;
    bool sent_role = false, finished = false;
  };
  auto choices = std::make_shared<std::vector<Choice>>();
  for (int32_t i = 0; i < num_choices; ++i)
    choices->push_back(
        {ps[static_cast<size_t>(i)],
         std::make_unique<StreamChunks>(request, id, model_name(request.model_id), created,
                                        tokenizer_of(request.model_id), i)});
  request.prompt.clear();
  request.more_prompts.clear();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, choices, cancel_all, include_usage = request.include_usage, n = request.n,
       logprobs = request.params.logprobs.has_value()](size_t, httplib::DataSink& sink) {
        // Wait a little for news from the first unfinished choice (any choice's news is
        // taken below).
        for (Choice& c : *choices) {
          if (c.finished) continue;
          std::unique_lock lock(c.p->mu);
          c.p->cv.wait_for(lock, std::chrono::milliseconds(choices->size() > 1 ? 20 : 100),
                           [&] { return c.p->done || !c.p->text.empty() || stopping; });
          break;
        }
        if (stopping) return false;
        std::string out;
        bool failed = false;
        for (Choice& c : *choices) {
          if (c.finished) continue;
          Pending& p = *c.p;
          std::string delta;
          std::vector<SampledToken> tokens;
          bool done;
          {
            std::lock_guard lock(p.mu);
            delta.swap(p.text);
            // Without text, the tokens wait for the chunk that brings it (or the last one).
            if (!delta.empty() || p.done) tokens.swap(p.tokens);
            done = p.done;
          }
          if (!c.sent_role && !(done && p.error)) {
            if (const json role = c.chunks->role(); !role.is_null()) out += sse(role);
            c.sent_role = true;
          }
          if (!delta.empty() || (logprobs && !tokens.empty() && !p.error)) {
            if (const json d = c.chunks->delta(delta, tokens); !d.is_null()) out += sse(d);
          } else {
            c.chunks->count(tokens);  // held-back text's tokens still count in the usage
          }
          if (!done) continue;
          c.finished = true;
          std::lock_guard lock(p.mu);
          if (p.error) {
            metrics.on_error(p.error_status);
            out += sse(*p.error);
            failed = true;
            cancel_all();  // the answer has failed: the other choices are not wanted
            break;
          }
          if (const json rest = c.chunks->flush(); !rest.is_null()) out += sse(rest);
          out += sse(c.chunks->finish(p.result->finish, p.result->stop_reason));
        }
        const bool all_done = failed || std::all_of(choices->begin(), choices->end(),
                                                    [](const Choice& c) { return c.finished; });
        if (all_done) {
          if (!failed) {
            std::vector<GenerationResult> results;
            for (const Choice& c : *choices) {
              std::lock_guard lock(c.p->mu);
              results.push_back(*c.p->result);
            }
            const json usage = make_usage(results, n);
            server_internal::request_log().prompt_tokens = usage["prompt_tokens"];
            server_internal::request_log().completion_tokens = usage["completion_tokens"];
            if (include_usage) out += sse((*choices)[0].chunks->usage(results));
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (all_done) sink.done();
        return true;
      },
      // Not a success: the client went away (or we are stopping). Free the sequences now.
      [cancel_all](bool success) {
        if (!success) cancel_all();
      });
}

}  // namespace blend
