// The layer sequence's operations as Backend::op_statistics reports them, for a backend whose
// op-time record has one field per operation (CpuOpTimes, CudaOpTimes): one list of names,
// written once, in layer order.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace blend {

// `times`' per-operation fields, times `to_seconds` (1 for seconds, 1e-3 for milliseconds).
template <typename Times>
std::vector<std::pair<std::string, double>> layer_op_seconds(const Times& times,
                                                             double to_seconds) {
  return {{"embed", times.embed * to_seconds},
          {"norm", times.norm * to_seconds},
          {"qkv", times.qkv * to_seconds},
          {"rope_kv", times.rope_kv * to_seconds},
          {"attention", times.attention * to_seconds},
          {"o_proj", times.o_proj * to_seconds},
          {"gate_up", times.gate_up * to_seconds},
          {"act", times.act * to_seconds},
          {"down", times.down * to_seconds},
          {"lm_head", times.lm_head * to_seconds}};
}

}  // namespace blend
