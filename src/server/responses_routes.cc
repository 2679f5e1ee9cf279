// /v1/responses (OpenAI's Responses API, api/responses.h): the body is translated into the chat
// request it means and served on the chat path (the same body reader and limits, parser,
// engine hand-off and stream chunks as /v1/chat/completions), the answer translated back.
// Responses are not stored: retrieving, deleting or cancelling one is a 404 saying so.
#include <chrono>
#include <memory>

#include <nlohmann/json.hpp>

#include "api/json_limits.h"
#include "api/responses.h"
#include "api/stream.h"
#include "server/server_impl.h"

namespace blend {

using nlohmann::json;
using server_internal::Pending;

void Server::Impl::responses_routes() {
  route("POST", "/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    responses_create(req, res);
  });
  const auto not_stored = [this](const httplib::Request& req, httplib::Response& res) {
    send_error(res, 404,
               "No response with id '" + req.matches[1].str() +
                   "' is stored: blend does not store responses (each is answered as with "
                   "'store': false)",
               "response_id");
  };
  const std::string one = R"(/v1/responses/([A-Za-z0-9_-]+))";
  route("GET", one, not_stored);
  route("DELETE", one, not_stored);
  route("GET", one + "/input_items", not_stored);
  route("POST", one + "/cancel", not_stored);
}

void Server::Impl::responses_create(const httplib::Request& req, httplib::Response& res) {
  auto responses = std::make_shared<ResponsesRequest>();
  try {
    *responses = parse_responses_request(parse_client_json(req.body, "the request body"), req.body);
  } catch (const ApiError& e) {
    return send_error(res, e);
  }
  ApiRequest request;
  try {
    const ModelId model_id = model_of(responses->chat_body);
    const ServedModel& served_model = served[static_cast<size_t>(model_id)];
    request = parse_api_request(Endpoint::kChatCompletions, responses->chat_body,
                                *served_model.tokenizer, served_model.chat_template,
                                request_limits(req, model_id), responses->chat_raw_body);
    request.model_id = model_id;
  } catch (const ApiError& e) {
    return send_error(res, responses_error(e));
  } catch (const Error& e) {
    return send_error(res, 400, e.what());
  }
  const RequestClass cls = responses->chat_body.value("service_tier", "") == "flex"
                               ? RequestClass::kBestEffort
                               : RequestClass::kRealtime;
  const std::string id = make_id("resp_");
  const int64_t created = unix_seconds();
  const std::string& model = model_name(request.model_id);
  const Tokenizer& tokenizer = tokenizer_of(request.model_id);
  std::shared_ptr<Pending> p = submit(request, cls);

  if (!responses->stream) {
    if (!wait_done(*p, request_socket(req))) {
      cancel(p);
      if (stopping) return send_error(res, 503, "the server is shutting down");
      res.status = 499;  // the client closed the request (as the chat route answers)
      return res.set_content("{}", "application/json");
    }
    std::lock_guard lock(p->mu);
    if (p->error) {
      metrics.on_error(p->error_status);
      res.status = p->error_status;
      return res.set_content(server_internal::dump(*p->error), "application/json");
    }
    const json chat = make_response(request, *p->result, id, model, created, tokenizer);
    server_internal::request_log().prompt_tokens = chat["usage"]["prompt_tokens"];
    server_internal::request_log().completion_tokens = chat["usage"]["completion_tokens"];
    return res.set_content(
        server_internal::dump(responses_from_chat(*responses, chat, id, created)),
        "application/json");
  }

  // The chat stream's chunks (api/stream.h: text as it is decided, each tool call whole) become
  // the Responses events.
  request.prompt.clear();
  struct Stream {
    std::shared_ptr<ResponsesRequest> responses;
    std::shared_ptr<Pending> p;
    StreamChunks chunks;
    ResponsesEvents events;
    bool started = false;
  };
  auto stream = std::make_shared<Stream>(
      Stream{responses, p, StreamChunks(request, id, model, created, tokenizer),
             ResponsesEvents(*responses, id, model, created)});
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, stream](size_t, httplib::DataSink& sink) {
        Pending& pending = *stream->p;
        std::string out;
        if (!stream->started) {
          out = stream->events.start();
          stream->started = true;
        }
        std::string delta;
        std::vector<SampledToken> tokens;
        bool done;
        {
          std::unique_lock lock(pending.mu);
          pending.cv.wait_for(lock, std::chrono::milliseconds(100),
                              [&] { return pending.done || !pending.text.empty() || stopping; });
          if (stopping) return false;
          delta.swap(pending.text);
          tokens.swap(pending.tokens);
          done = pending.done;
        }
        if (!delta.empty()) out += stream->events.chat_chunk(stream->chunks.delta(delta, tokens));
        if (done) {
          std::lock_guard lock(pending.mu);
          if (pending.error) {
            metrics.on_error(pending.error_status);
            out += stream->events.error(*pending.error);
          } else {
            out += stream->events.chat_chunk(stream->chunks.flush());
            const json usage =
                make_usage(std::span<const GenerationResult>(&*pending.result, 1), 1);
            server_internal::request_log().prompt_tokens = usage["prompt_tokens"];
            server_internal::request_log().completion_tokens = usage["completion_tokens"];
            out += stream->events.finish(pending.result->finish, usage);
          }
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (done) sink.done();
        return true;
      },
      // Not a success: the client went away (or we are stopping). Free the sequence now.
      [this, p](bool success) {
        if (!success) cancel(p);
      });
}

}  // namespace blend
