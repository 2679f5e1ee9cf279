// Adaptive serving on one engine (BlockLLM §5.3): a request that allows it may run through a
// chain in which its model's blocks are replaced by equivalent blocks of another model (§4.1,
// blocks/equivalence.h), as `blend zoo analyze --out FILE` recorded them.
//
// BlockLLM dispatches such a request to whichever candidate block instance adds the least
// latency (queueing, compute, transfer, loading). On one engine every block runs in every step
// that has rows for it, so the candidate that adds least is always the block another model's
// rows already run: its GEMM grows by the request's rows instead of a GEMM of its own running for
// them. The chain is therefore fixed when the engine starts: every block whose similarity to the
// analysis' reference model reaches the threshold (or that is byte-identical to it) is the
// reference's, the others (and the embedding and head) stay the model's own. A request keeps its
// chain for its whole life, so its KV cache is always written by the blocks that read it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/backend.h"
#include "core/types.h"

namespace blend {

class Engine;

struct AdaptiveChain {
  ModelId model = 0;     // whose requests may run it
  ModelId against = 0;   // the model whose equivalent blocks it borrows
  ChainSpec chain;       // base = model; each block `model`'s own or `against`'s
  int32_t replaced = 0;  // blocks borrowed that are not byte-identical to the model's own
};

// The chains an analysis (the JSON `blend zoo analyze --out` writes) allows at `threshold` (a
// block is replaced when its similarity is at least that; <= 0: the analysis' own threshold).
// A model none of whose measured blocks reaches it gets no chain. `find_model` maps a model name
// to its id (nullopt: not served). Throws blend::Error for malformed JSON content, a model the
// analysis names that is not served, a layer outside [0, num_layers), or a block listed twice.
std::vector<AdaptiveChain> adaptive_chains(
    const nlohmann::json& analysis, double threshold, int64_t num_layers,
    const std::function<std::optional<ModelId>(const std::string&)>& find_model);

// Reads the analysis at `path` and adds its chains to `engine` (Engine::add_adaptive_chain).
// Returns them, for the caller to report. Throws blend::Error for an unreadable or malformed
// file, a threshold outside (0, 1] other than 0, and a backend that cannot assemble chains.
std::vector<AdaptiveChain> enable_adaptive_serving(Engine& engine,
                                                   const std::filesystem::path& path,
                                                   double threshold);

// One line per chain for a log: "t3: 8 blocks of 'base' (layers 0-3 attention, ffn)".
std::string describe_adaptive_chains(const Engine& engine,
                                     const std::vector<AdaptiveChain>& chains);

}  // namespace blend
