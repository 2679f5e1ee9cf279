// Failure detection between the data-parallel ranks. Open MPI 4 has none an application can use
// (ULFM arrived in Open MPI 5): with `mpirun --enable-recovery` the survivors keep running when
// a rank dies, but nothing tells them, and a receive from the dead rank waits forever. So every
// worker rank keeps one TCP connection open to rank 0, beside MPI: the kernel closes it when the
// process ends, however it ends (SIGKILL included), and rank 0 learns in its next poll which
// rank is gone, as a worker learns that rank 0 is gone. Nothing else travels on it; the data
// goes over MPI.
//
// The connection is made the usual MPI way: rank 0 listens on all interfaces and broadcasts
// its addresses (every IPv4 address of its host, loopback last) with a random token; a worker
// tries them in turn and keeps the first that answers the token, so a port that happens to be
// open on the worker's own loopback is never mistaken for rank 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace blend::dist {

class LivenessServer {
 public:
  LivenessServer();  // throws blend::Error when no socket can listen
  ~LivenessServer();
  LivenessServer(const LivenessServer&) = delete;
  LivenessServer& operator=(const LivenessServer&) = delete;

  // What the workers need to connect (token, port, addresses), as one line of text.
  const std::string& address() const { return address_; }
  // Accepts the connections of ranks 1 .. size-1, for up to `timeout`; a rank that has not
  // connected by then is reported gone by the first poll_gone().
  void accept_workers(int size, std::chrono::milliseconds timeout);
  // Waits up to `timeout` for news and returns the ranks whose connection closed since the
  // last call (each rank once).
  std::vector<int> poll_gone(std::chrono::milliseconds timeout);

 private:
  int listen_fd_ = -1;
  uint64_t token_ = 0;
  std::string address_;
  std::vector<int> fds_;  // by rank; -1: none (rank 0, or reported gone)
  std::vector<int> never_connected_;
};

class LivenessClient {
 public:
  // Connects to rank 0 as `rank`; throws blend::Error when no address answers.
  LivenessClient(const std::string& address, int rank);
  ~LivenessClient();
  LivenessClient(const LivenessClient&) = delete;
  LivenessClient& operator=(const LivenessClient&) = delete;
  // Whether rank 0's end has closed (non-blocking).
  bool peer_gone();

 private:
  int fd_ = -1;
  bool gone_ = false;
};

}  // namespace blend::dist
