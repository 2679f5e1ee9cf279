// What describes the server rather than generating: /health, /metrics, /v1/models.
#include <nlohmann/json.hpp>

#include "server/server_impl.h"

namespace blend {

using nlohmann::json;

void Server::Impl::info_routes() {
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("", "text/plain");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "blend"},
                  {"max_model_len", max_sequence_tokens}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(),
                    "application/json");
  });
}

}  // namespace blend
