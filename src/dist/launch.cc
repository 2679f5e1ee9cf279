// Whether Open MPI's mpirun started this process: what `blend batch` asks before anything else,
// with or without MPI built in (dist/data_parallel.h).
#include <cstdlib>

#include "dist/data_parallel.h"

namespace blend::dist {

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

}  // namespace blend::dist
