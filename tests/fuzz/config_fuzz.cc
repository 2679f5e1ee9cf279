// Fuzzes config.json reading: arbitrary bytes through the JSON parser into ModelConfig::from_json.
// Either a config that passes validate() and whose sizes are computable, or a blend::Error;
// never a JSON exception, crash or huge allocation.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const blend::ModelConfig c = blend::ModelConfig::from_json(j);
    c.validate();
    volatile int64_t sink = c.num_parameters() + blend::llama_tensor_count(c);
    (void)sink;
    (void)blend::ModelConfig::from_json(c.to_json());  // what we write we read back
  } catch (const blend::Error&) {
  }
  return 0;
}
