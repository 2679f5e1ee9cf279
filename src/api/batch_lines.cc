#include "api/batch_lines.h"

#include <utility>

#include "core/error.h"

namespace blend {
namespace {

const char* endpoint_url(Endpoint e) {
  return e == Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
}

void check_line(const BatchInputLine& line, const BatchLineContext& context,
                PreparedBatchLine& out) {
  if (line.error) throw ApiError(400, *line.error, line.error_param);
  const Endpoint endpoint = parse_endpoint(line.url);
  if (context.endpoint && endpoint != *context.endpoint)
    throw ApiError(400,
                   "the line's url '" + line.url + "' differs from the batch's endpoint '" +
                       endpoint_url(*context.endpoint) + "'",
                   "url");
  const nlohmann::json& body = line.body;
  const ModelId model = resolve_model(body, context.models, context.any_model_name);
  const ServedModel& served = context.models.at(static_cast<size_t>(model));
  if (auto s = body.find("stream"); s != body.end() && *s == true)
    throw ApiError(400, "a batch request cannot be streamed ('stream' must be false)", "stream");
  RequestLimits limits;
  limits.max_prompt_bytes = served.max_prompt_bytes;
  limits.sampling_defaults = served.sampling_defaults;
  limits.grammars = served.grammars;
  if (!served.tokenizer) throw Error("batch line context: the model has no tokenizer attached");
  out.api = parse_api_request(endpoint, body, *served.tokenizer, served.chat_template, limits);
  out.api.model_id = model;
  check_context(out.api, body, context.max_sequence_tokens);
  out.generation.id = line.custom_id;
  out.generation.model = model;
  out.generation.prompt = std::move(out.api.prompt);
  out.api.prompt.clear();
  out.generation.params = out.api.params;
  out.generation.request_class = context.request_class;
  out.generation.ttft_slo = out.api.ttft_slo;
  out.generation.tpot_slo = out.api.tpot_slo;
  out.generation.adaptive_blocks = out.api.adaptive_blocks;
}

}  // namespace

PreparedBatchLine prepare_batch_line(const BatchInputLine& line, const BatchLineContext& context) {
  PreparedBatchLine out;
  out.custom_id = line.custom_id;
  try {
    check_line(line, context, out);
  } catch (const ApiError& e) {
    out.error = e;
  } catch (const Error& e) {
    out.error = ApiError(400, e.what());
  }
  return out;
}

}  // namespace blend
