// make_backend (backend/registry.h): what it refuses before building anything.
#include "backend/registry.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
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

// What a command needs of one backend kind it asks for by name, never by a cast of its own
// (issue 55): a backend without op timing reports no statistics, and a cpu-only analysis on
// another backend is refused naming both.
TEST(BackendRegistry, OtherKindsReportNoOpStatisticsAndAreNotTheCpuBackend) {
  ModelConfig config;
  config.eos_token_ids = {2};  // the simulator's one token
  BackendInputs in;
  in.config = &config;
  in.step_cost = [](const ForwardBatch&, bool) { return SimStepTime{}; };
  const std::unique_ptr<Backend> sim = make_backend("sim", in);
  const OpStatistics ops = sim->op_statistics();
  EXPECT_TRUE(ops.seconds.empty());
  EXPECT_EQ(ops.steps, 0);
  try {
    cpu_backend_for(*sim, "zoo analyze");
    ADD_FAILURE() << "the simulator passed as the cpu backend";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "zoo analyze needs the cpu backend (this is sim)");
  }
}

}  // namespace
}  // namespace blend
