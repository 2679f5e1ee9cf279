// Fuzzes JSON schema compilation (response_format and tool parameters come from clients) under
// a size budget: arbitrary bytes, when they are JSON, through json_schema_grammar. Either a
// grammar within the budget whose matcher can never get stuck (from every state it reaches,
// some byte continues the output or the output is complete: schemas that match nothing finite
// are refused, their dead branches cut), or a blend::Error; never a crash, a hang, an
// exception of another type or a grammar past the budget.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/json_schema.h"

namespace {

// Bytes of the output a walk may write; it picks, at each step, the allowed byte named by the
// input (so the fuzzer steers it too).
constexpr int kWalkBytes = 48;

bool complete(const blend::Grammar& g, const std::vector<blend::GrammarStack>& state) {
  for (const blend::GrammarStack& s : state)
    if (g.can_finish(s)) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json schema = nlohmann::json::parse(data, data + size, nullptr, false);
  if (schema.is_discarded()) return 0;
  blend::GrammarBudget budget;  // a sixteenth of the nodes and work a server allows: fast runs
  budget.max_nodes /= 16;
  budget.max_work /= 16;
  std::shared_ptr<blend::Grammar> g;
  try {
    g = blend::json_schema_grammar(schema, budget);
  } catch (const blend::Error&) {
    return 0;  // refused with a message: fine
  }
  if (g->num_nodes() > budget.max_nodes) std::abort();
  std::vector<blend::GrammarStack> state = g->initial();
  for (int step = 0; step < kWalkBytes; ++step) {
    std::vector<uint8_t> allowed;
    for (int b = 0; b < 256; ++b)
      if (!g->advance(state, static_cast<uint8_t>(b)).empty())
        allowed.push_back(static_cast<uint8_t>(b));
    if (allowed.empty()) {
      if (!complete(*g, state)) std::abort();  // stuck: neither a byte nor the end is allowed
      break;
    }
    state = g->advance(state, allowed[data[static_cast<size_t>(step) % size] % allowed.size()]);
  }
  return 0;
}
