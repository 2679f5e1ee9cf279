#include "blocks/adaptive.h"

#include <fstream>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"

namespace blend {
namespace {

using nlohmann::json;

const json& member(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) throw Error(where + ": no \"" + key + "\"");
  return *it;
}

}  // namespace

std::vector<AdaptiveChain> adaptive_chains(
    const json& analysis, double threshold, int64_t num_layers,
    const std::function<std::optional<ModelId>(const std::string&)>& find_model) {
  const std::string where = "adaptive blocks";
  if (!analysis.is_object()) throw Error(where + ": not a JSON object (blend zoo analyze --out)");
  const json& against_name = member(analysis, "against", where);
  const json& models = member(analysis, "models", where);
  if (!against_name.is_string() || !models.is_array())
    throw Error(where + ": \"against\" must be a model name and \"models\" a list");
  if (threshold <= 0) {
    const json& t = member(analysis, "threshold", where);
    if (!t.is_number()) throw Error(where + ": \"threshold\" must be a number");
    threshold = t.get<double>();
  }
  if (!(threshold > 0 && threshold <= 1))
    throw Error(where + ": the threshold " + std::to_string(threshold) + " is outside (0, 1]");
  auto resolve = [&](const std::string& name) {
    const std::optional<ModelId> id = find_model(name);
    if (!id)
      throw Error(where + ": the analysis names model '" + name +
                  "', which is not served here (an analysis of another zoo?)");
    return *id;
  };
  const ModelId against = resolve(against_name.get<std::string>());

  std::vector<AdaptiveChain> out;
  for (const json& m : models) {
    if (!m.is_object()) throw Error(where + ": a \"models\" entry is not an object");
    const json& name = member(m, "model", where);
    const json& blocks = member(m, "blocks", where);
    if (!name.is_string() || !blocks.is_array())
      throw Error(where + ": a model entry needs \"model\" (a name) and \"blocks\" (a list)");
    const std::string model_where = where + ", model '" + name.get<std::string>() + "'";
    AdaptiveChain c;
    c.model = resolve(name.get<std::string>());
    c.against = against;
    if (c.model == against) throw Error(model_where + ": compared with itself");
    c.chain.base = c.model;
    c.chain.attention.assign(static_cast<size_t>(num_layers), c.model);
    c.chain.ffn.assign(static_cast<size_t>(num_layers), c.model);
    std::set<std::pair<int64_t, std::string>> seen;
    for (const json& b : blocks) {
      if (!b.is_object()) throw Error(model_where + ": a block entry is not an object");
      const json &layer = member(b, "layer", model_where), &kind = member(b, "block", model_where),
                 &similarity = member(b, "similarity", model_where);
      if (!layer.is_number_integer() || !kind.is_string() || !similarity.is_number())
        throw Error(model_where +
                    ": a block needs an integer \"layer\", a \"block\" name and a "
                    "numeric \"similarity\"");
      const auto l = layer.get<int64_t>();
      const std::string k = kind.get<std::string>();
      if (l < 0 || l >= num_layers)
        throw Error(model_where + ": layer " + std::to_string(l) + " is outside the model's " +
                    std::to_string(num_layers) + " layers");
      if (k != "attention" && k != "ffn")
        throw Error(model_where + ": block \"" + k + "\" is neither \"attention\" nor \"ffn\"");
      if (!seen.insert({l, k}).second)
        throw Error(model_where + ": layer " + std::to_string(l) + " " + k + " is listed twice");
      const bool identical = b.value("identical", false);
      if (!identical && similarity.get<double>() < threshold) continue;
      // A byte-identical block is the same block either way; naming it `against`'s says so to
      // the engine, which places the chain's rows by how many blocks it does not borrow.
      (k == "attention" ? c.chain.attention : c.chain.ffn)[static_cast<size_t>(l)] = against;
      c.replaced += identical ? 0 : 1;
    }
    if (c.replaced > 0) out.push_back(std::move(c));
  }
  return out;
}

std::vector<AdaptiveChain> enable_adaptive_serving(Engine& engine,
                                                   const std::filesystem::path& path,
                                                   double threshold) {
  if (threshold != 0 && !(threshold > 0 && threshold <= 1))
    throw Error("--adaptive-threshold must be in (0, 1]");
  std::ifstream in(path);
  if (!in) throw Error("--adaptive-blocks " + path.string() + ": cannot read");
  json analysis;
  try {
    in >> analysis;
  } catch (const json::exception& e) {
    throw Error("--adaptive-blocks " + path.string() + ": not JSON (" + e.what() + ")");
  }
  std::vector<AdaptiveChain> chains;
  try {
    chains = adaptive_chains(analysis, threshold, engine.config().num_layers,
                             [&](const std::string& name) { return engine.find_model(name); });
  } catch (const Error& e) {
    throw Error("--adaptive-blocks " + path.string() + ": " + e.what());
  }
  for (const AdaptiveChain& c : chains) engine.add_adaptive_chain(c.model, c.chain, c.against);
  return chains;
}

std::string describe_adaptive_chains(const Engine& engine,
                                     const std::vector<AdaptiveChain>& chains) {
  std::string s;
  for (const AdaptiveChain& c : chains)
    s += "adaptive serving: '" + engine.model_name(c.model) + "' may run " +
         std::to_string(c.replaced) + " blocks of '" + engine.model_name(c.against) +
         "' in place of its own\n";
  if (chains.empty())
    s = "adaptive serving: no block reaches the threshold; every model runs its own\n";
  return s;
}

}  // namespace blend
