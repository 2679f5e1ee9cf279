#include "offline/batch_job.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <unordered_map>
#include <utility>

#include "api/api_error.h"
#include "api/openai.h"
#include "core/error.h"
#include "kv/radix_cache.h"

namespace blend {
namespace {

std::optional<ChatTemplate> load_chat_template(const std::filesystem::path& dir) {
  try {
    return ChatTemplate::from_dir(dir);
  } catch (const Error&) {
    return std::nullopt;  // chat requests then fail one by one with a clear message
  }
}

}  // namespace

BatchJob::BatchJob(Engine& engine, BatchJobOptions options)
    : engine_(engine), options_(std::move(options)) {
  plan::parse_policy(options_.policy);  // an unknown name fails before any line runs
  if (engine_.num_models() > 1 && !options_.served_model_name.empty())
    throw Error(
        "--served-model-name names the one model of a run; with several models, lines "
        "pick them by their folder names");
  for (ModelId m = 0; m < engine_.num_models(); ++m)
    chat_templates_.push_back(load_chat_template(chat_template_dir(engine_.model_folder(m))));
  for (ModelId m = 0; m < engine_.num_models(); ++m) {
    const auto& chat_template = chat_templates_[static_cast<size_t>(m)];
    context_.models.push_back({.name = m == 0 && !options_.served_model_name.empty()
                                           ? options_.served_model_name
                                           : engine_.model_name(m),
                               .chat_template = chat_template ? &*chat_template : nullptr,
                               .sampling_defaults = &engine_.config(m).sampling_defaults});
  }
  context_.any_model_name = engine_.num_models() == 1 && options_.served_model_name.empty();
  context_.max_sequence_tokens = engine_.max_sequence_tokens();
  std::vector<ModelText> text;  // each model reads and writes text with its own tokenizer
  for (ModelId m = 0; m < engine_.num_models(); ++m)
    text.push_back({&engine_.tokenizer(m), engine_.config(m).vocab_size,
                    engine_.config(m).eos_token_ids, engine_.tokenizer_owner(m)});
  grammars_ = attach_model_text(context_.models, text, context_.max_sequence_tokens);
  if (!options_.endpoint.empty()) {
    try {
      context_.endpoint = parse_endpoint(options_.endpoint);
    } catch (const ApiError& e) {
      throw Error(std::string("--endpoint: ") + e.what());
    }
  }
}

std::vector<PreparedBatchLine> BatchJob::prepare(const std::vector<BatchInputLine>& lines,
                                                 const BatchResultSink& sink) {
  std::vector<PreparedBatchLine> out;
  for (const BatchInputLine& line : lines) {
    ++stats_.requests;
    try {
      PreparedBatchLine prepared = prepare_batch_line(line, context_);
      if (prepared.error) throw *prepared.error;
      engine_.check_request(prepared.generation);
      out.push_back(std::move(prepared));
    } catch (const ApiError& e) {
      sink.error(line.custom_id, e.status(), e.body());
      ++stats_.failed;
    } catch (const Error& e) {
      sink.error(line.custom_id, 400, ApiError(400, e.what()).body());
      ++stats_.failed;
    }
  }
  return out;
}

OfflineRequest BatchJob::offline_request(const GenerationRequest& gen) const {
  return std::move(line_samples(gen, 1, options_.assumed_output).front());
}

plan::PlanRequest BatchJob::plan_request(const PreparedBatchLine& line) const {
  const OfflineRequest q = offline_request(line.generation);
  return {q.request.id, q.request.prompt, q.output_estimate, q.output_known, 0, q.request.model};
}

CostModel BatchJob::planner_cost() const {
  const Hardware hw =
      options_.hardware == "cpu" ? default_cpu_hardware() : resolve_hardware(options_.hardware);
  return CostModel(ModelShape::from_config(engine_.config(), model_name()), hw);
}

void BatchJob::run(std::vector<PreparedBatchLine> lines, const BatchResultSink& sink,
                   const std::function<void(int64_t answered, int64_t token_bound)>& progress) {
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  // By model, for the optimal sharing ratio (models share no KV).
  std::vector<std::vector<std::vector<TokenId>>> prompts(static_cast<size_t>(engine_.num_models()));
  // Each line's request settings for the response, and its samples finished so far (a line
  // with n > 1 runs n requests and answers once, with n choices).
  struct Line {
    ApiRequest api;
    std::vector<GenerationResult> samples;
  };
  std::unordered_map<std::string, Line> line_of;
  std::vector<OfflineRequest> planned;  // --policy other than fcfs
  const bool use_plan = options_.policy != "fcfs";
  int64_t token_bound = 0;
  auto on_result = [&](GenerationResult&& r) {
    auto it = line_of.find(r.id);
    Line& line = it->second;
    const ApiRequest& request = line.api;
    token_bound -= std::max<int64_t>(
        0, static_cast<int64_t>(request.params.max_tokens) - static_cast<int64_t>(r.tokens.size()));
    line.samples.push_back(std::move(r));
    if (static_cast<int32_t>(line.samples.size()) < request.n) return;
    const char* prefix = request.endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-";
    // A sample that failed while generating (NaN logits) fails the line, not the job.
    const auto failed =
        std::find_if(line.samples.begin(), line.samples.end(),
                     [](const GenerationResult& s) { return s.finish == FinishReason::kError; });
    if (failed != line.samples.end()) {
      const ApiError e = generation_error(*failed);
      sink.error(it->first, e.status(), e.body());
      ++stats_.failed;
    } else {
      sink.success(it->first, make_response(request, line.samples, make_id(prefix),
                                            engine_.model_name(request.model_id), created,
                                            engine_.tokenizer(request.model_id)));
      ++stats_.completed;
    }
    line_of.erase(it);
  };
  for (PreparedBatchLine& line : lines) {
    GenerationRequest& gen = line.generation;
    const int32_t n = line.api.n;
    prompts.at(static_cast<size_t>(gen.model)).push_back(gen.prompt);
    // An unset max_tokens runs to the context's end at most.
    const auto prompt = static_cast<int64_t>(gen.prompt.size());
    token_bound += prompt + n * std::min<int64_t>(gen.params.max_tokens,
                                                  context_.max_sequence_tokens - prompt);
    line_of.emplace(line.custom_id, Line{std::move(line.api), {}});
    if (use_plan) {
      for (OfflineRequest& q : line_samples(gen, n, options_.assumed_output))
        planned.push_back(std::move(q));
      continue;
    }
    for (int32_t i = 0; i < n; ++i) {
      GenerationRequest sample = i + 1 < n ? gen : std::move(gen);
      sample.index = i;
      engine_.submit(std::move(sample), on_result);
    }
  }
  const auto report = [&] {
    if (progress) progress(stats_.completed + stats_.failed, token_bound);
  };
  if (use_plan && !planned.empty()) {
    const CostModel cost = planner_cost();
    stats_.plan = run_planned(
        engine_, planned, plan::parse_policy(options_.policy), cost,
        static_cast<double>(engine_.stats().kv_capacity_bytes),
        [&](GenerationResult&& r) {
          on_result(std::move(r));
          report();
        },
        options_.sampling, options_.planner);
  }
  while (engine_.has_work()) {
    engine_.step();
    report();
  }
  for (const auto& of_model : prompts) {
    std::vector<std::span<const TokenId>> spans(of_model.begin(), of_model.end());
    stats_.optimal_shared_tokens += optimal_shared_tokens(std::move(spans));
  }
}

nlohmann::json batch_run_stats(const Engine& engine, const BatchJobStats& job,
                               double wall_seconds) {
  const EngineStats s = engine.stats();
  const int64_t tokens = s.prompt_tokens + s.output_tokens;
  const auto ratio = [&](int64_t shared) {
    return s.prompt_tokens > 0 ? static_cast<double>(shared) / static_cast<double>(s.prompt_tokens)
                               : 0.0;
  };
  const double wall = wall_seconds;
  nlohmann::json stats = {
      {"requests", job.requests},
      {"completed", job.completed},
      {"failed", job.failed},
      {"input_tokens", s.prompt_tokens},
      {"output_tokens", s.output_tokens},
      {"wall_seconds", wall},
      {"throughput_tokens_per_s", wall > 0 ? static_cast<double>(tokens) / wall : 0.0},
      {"output_tokens_per_s", wall > 0 ? static_cast<double>(s.output_tokens) / wall : 0.0},
      {"steps", s.steps},
      {"mean_batch_tokens",
       s.steps ? static_cast<double>(s.batch_tokens) / static_cast<double>(s.steps) : 0.0},
      {"preemptions", s.preemptions},
      {"schedule_seconds", s.schedule_seconds},
      {"step_seconds", s.step_seconds},
      {"backend_seconds", s.backend_seconds},
      {"cached_prompt_tokens", s.cached_prompt_tokens},
      {"sharing_ratio", ratio(s.cached_prompt_tokens)},
      {"sharing_optimal", ratio(job.optimal_shared_tokens)},
      {"cache_evicted_pages", s.cache_evicted_pages},
      {"kv_offloaded_pages", s.kv_offloaded_pages},
      {"kv_loaded_pages", s.kv_loaded_pages},
      {"kv_peak_bytes", s.kv_peak_bytes},
      {"kv_capacity_bytes", s.kv_capacity_bytes}};
  const WeightStats w = engine.weight_stats();
  stats["weight_bytes"] = w.bytes;
  if (engine.num_models() > 1) {
    // Several models in one engine: weights in memory with shared blocks counted once, and
    // what the same models would take loaded apart (BlockLLM §4).
    stats["models"] = engine.num_models();
    stats["weight_bytes_unshared"] = w.unshared_bytes;
    stats["blocks_unique"] = w.unique_blocks;
    stats["blocks"] = w.blocks;
    stats["adaptive_requests"] = s.adaptive_requests;
  }
  if (job.plan) {
    stats["sampled_requests"] = job.plan->sampled_requests;
    stats["sampling_seconds"] = job.plan->sampling_seconds;
  }
  return stats;
}

}  // namespace blend
