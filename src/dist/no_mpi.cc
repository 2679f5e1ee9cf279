// dist/data_parallel.h in a blend built without MPI (CMake found none): a run under mpirun says
// so instead of running N unrelated copies of the job.
#include "core/error.h"
#include "dist/data_parallel.h"

namespace blend::dist {

bool built_with_mpi() {
  return false;
}

void run_batch(const BatchRun&) {
  throw Error(
      "this blend was built without MPI, so it cannot run under mpirun (install Open MPI, "
      "e.g. Debian's openmpi-bin and libopenmpi-dev, and rebuild)");
}

}  // namespace blend::dist
