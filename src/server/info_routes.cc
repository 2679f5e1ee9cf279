// What describes the server rather than generating: /health, /version, /metrics, /v1/models,
// /v1/models/{id}, and vLLM's /tokenize and /detokenize.
#include <nlohmann/json.hpp>

#include <span>
#include <vector>

#include "api/json_limits.h"
#include "server/server_impl.h"
#include "server/version.h"

namespace blend {

using nlohmann::json;
using server_internal::dump;

namespace {

// vLLM's model card: a LoRA model's "parent" is its base, "root" the folder it was read from.
json model_object(const ServedModel& model, int64_t max_model_len) {
  return {{"id", model.name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "blend"},
          {"root", model.root},
          {"parent", model.parent ? json(*model.parent) : json(nullptr)},
          {"max_model_len", max_model_len}};
}

}  // namespace

void Server::Impl::info_routes() {
  route("GET", "/health",
        [](const httplib::Request&, httplib::Response& res) { res.set_content("", "text/plain"); });
  route("GET", "/version", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"version", kBlendVersion}}.dump(), "application/json");
  });
  route("GET", "/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  route("GET", "/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const ServedModel& m : served) {
      data.push_back(model_object(m, max_sequence_tokens));
      for (const std::string& alias : m.aliases) {  // as vLLM lists every served name
        data.push_back(model_object(m, max_sequence_tokens));
        data.back()["id"] = alias;
      }
    }
    json list = {{"object", "list"}, {"data", std::move(data)}};
    res.set_content(list.dump(), "application/json");
  });
  // Model ids may hold '/' ("org/name").
  route("GET", R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1].str();
    const std::optional<ModelId> model = find_served_model(served, name);
    if (!model)
      return send_error(res, 404, "The model '" + name + "' does not exist.", "model",
                        "model_not_found");
    res.set_content(model_object(served[static_cast<size_t>(*model)], max_sequence_tokens).dump(),
                    "application/json");
  });
  route("POST", "/tokenize",
        [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
  route("POST", "/detokenize",
        [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
}

// vLLM's shapes: {"prompt": text} or {"messages": [...]} (rendered by the chat template, as a
// chat request would be) -> {"count", "max_model_len", "tokens", "token_strs"}. The tokens are
// the ones /v1/completions and /v1/chat/completions would count for the same input.
void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  try {
    const json body = parse_client_json(req.body, "the request body");
    if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
    const ModelId model = model_of(body);
    const bool chat = body.contains("messages");
    if (chat == body.contains("prompt"))
      throw ApiError(400, "give either 'prompt' or 'messages'", chat ? "messages" : "prompt");
    json request = {{chat ? "messages" : "prompt", body[chat ? "messages" : "prompt"]}};
    if (body.contains("add_special_tokens"))
      request["add_special_tokens"] = body["add_special_tokens"];
    if (!chat && !body["prompt"].is_string())
      throw ApiError(400, "'prompt' must be a string", "prompt");
    bool token_strs = false;
    if (auto t = body.find("return_token_strs"); t != body.end()) {
      if (!t->is_boolean()) throw ApiError(400, "'return_token_strs' must be a boolean", t.key());
      token_strs = t->get<bool>();
    }
    for (const auto& [key, value] : body.items())
      if (key != "model" && key != "prompt" && key != "messages" && key != "return_token_strs" &&
          key != "add_special_tokens")
        throw ApiError(400, "'" + key + "' is not supported by /tokenize", key);
    RequestLimits limits;
    limits.max_prompt_bytes = served[static_cast<size_t>(model)].max_prompt_bytes;
    const Tokenizer& tokenizer = tokenizer_of(model);
    const ApiRequest parsed =
        parse_api_request(chat ? Endpoint::kChatCompletions : Endpoint::kCompletions, request,
                          tokenizer, served[static_cast<size_t>(model)].chat_template, limits);
    json strs = nullptr;
    if (token_strs) {
      strs = json::array();
      for (TokenId t : parsed.prompt) strs.push_back(tokenizer.decode(std::span(&t, 1)));
    }
    json out = {{"count", parsed.prompt.size()},
                {"max_model_len", max_sequence_tokens},
                {"tokens", parsed.prompt},
                {"token_strs", strs}};
    res.set_content(dump(out), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const Error& e) {
    send_error(res, 400, e.what());
  }
}

// {"tokens": [ids]} -> {"prompt": text}, as vLLM.
void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  try {
    const json body = parse_client_json(req.body, "the request body");
    if (!body.is_object()) throw ApiError(400, "the body must be a JSON object");
    const ModelId model = model_of(body);  // an unknown model is a 404 here too
    auto t = body.find("tokens");
    if (t == body.end() || !t->is_array())
      throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
    const Tokenizer& tokenizer = tokenizer_of(model);
    const int64_t vocab = loop->engine().config().vocab_size;
    std::vector<TokenId> ids;
    for (const json& x : *t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
        throw ApiError(
            400,
            "token ids must be integers in [0, " + std::to_string(vocab) + "), got " + x.dump(),
            "tokens");
      ids.push_back(static_cast<TokenId>(x.get<int64_t>()));
    }
    res.set_content(dump(json{{"prompt", tokenizer.decode(ids)}}), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

}  // namespace blend
