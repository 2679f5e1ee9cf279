// make_backend (backend/registry.h): what it refuses before building anything.
#include "backend/registry.h"

#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"

namespace blend {
namespace {

// A --cuda-NAME knob on another backend would change nothing: refused, naming the flag and the
// backend the run uses (issue 55: the cuda knobs are flags).
TEST(BackendRegistry, CudaKnobsOnAnotherBackendAreRefusedByName) {
  ModelConfig config;
  BackendInputs in;
  in.config = &config;
  in.options.cuda_knobs = {{"attention", "warps"}};
  for (const char* kind : {"cpu", "sim"}) {
    try {
      make_backend(kind, in);
      ADD_FAILURE() << kind << " accepted a cuda knob";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--cuda-attention is a knob of the cuda "
                                                   "backend; this run uses --backend ") +
                                           kind);
    }
  }
}

}  // namespace
}  // namespace blend
