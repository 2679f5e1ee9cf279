// Data parallelism for offline batch jobs on Open MPI (BlendServe §5.5; DESIGN.md "Dist"):
//
//   mpirun -np N blend batch --model DIR --input in.jsonl --output out.jsonl
//
// runs N engine replicas, one per rank. Rank 0 reads the input, skips the custom_ids the
// output already holds (resume), checks and tokenizes every line (bad lines get their error
// result at once), builds the global resource-aware prefix tree and cuts it into N partitions of
// equal predicted work that keep the root's compute density (plan/dp_partition: the dual
// scanner's two cursors; only the cut paths lose sharing). Each rank gets its partition's input
// lines over MPI, plans and runs them like a single-process `blend batch` (offline/batch_job,
// the same --policy), and streams every result to rank 0 as it finishes; rank 0 runs its own
// partition meanwhile and writes the one output file, in the single-process format, each
// custom_id exactly once (lines in the order they finish).
//
// What it promises when a rank dies (killed, crashed, its host lost): with
// `mpirun --enable-recovery` the other ranks finish their partitions, rank 0 writes their
// results, reports the rank and the custom_ids lost with it (stderr and --stats), and exits 1;
// rerunning with the same --output, with any number of ranks, runs exactly those. Without
// --enable-recovery mpirun stops the whole job when one rank dies: every result written before
// stays, and a rerun completes the rest the same way. If rank 0 dies the workers stop too:
// each lists the custom_ids of its partition that the output lacks (rank 1 those of rank 0's
// partition too; read from the output file where this host can read it, else all of them) and
// aborts the job, so that mpirun fails even with --enable-recovery (it used to end 0 with lines
// lost and no word of them). No --stats is written then.
//
// Launching: the usual MPI way (a hostfile across hosts; every host needs the model folder at
// the same path, the input and output live on rank 0's). Rank 0 must be reachable over TCP
// from the other ranks, as MPI's TCP transport needs anyway (dist/liveness.h).
//
// Test hook (not a user option): BLEND_DIST_TEST_KILL=RANK:N makes rank RANK kill itself with
// SIGKILL right after sending (a worker) or writing (rank 0, its own lines) its N-th result.
#pragma once

#include <filesystem>
#include <string>

#include "engine/engine.h"
#include "offline/batch_job.h"

namespace blend::dist {

// Whether Open MPI's mpirun started this process (its environment says so).
bool launched_by_mpirun();
// Whether this blend was built with MPI (find_package(MPI) found it).
bool built_with_mpi();

struct BatchRun {
  std::filesystem::path model, input, output, stats;
  EngineOptions engine;
  BatchJobOptions job;
  // Re-cuts after the first (BlendServe §5.5 with replica times): rank 0 simulates each part on
  // the --hardware profile and cuts again by the simulated rates (plan::cut_data_parallel).
  int32_t dp_recuts = 0;
  bool quiet = false;
};

// Runs the job on every rank of MPI_COMM_WORLD (MPI is initialised and finalised here). Every
// rank calls it; rank 0 throws blend::Error for bad input and for lost requests, the other
// ranks report their failures to rank 0 and return. Built without MPI: throws, saying so.
void run_batch(const BatchRun& run);

}  // namespace blend::dist
