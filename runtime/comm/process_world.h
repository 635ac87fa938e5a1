// The processes of a multi-process run (MPI) as the runtime sees them: rank, size and the few
// host-memory collectives the hierarchical communicator and the training loop need. No MPI
// header here; runtime/comm/mpi.h implements it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "graph/dtype.h"
#include "graph/error.h"

namespace onnxtrain::runtime {

// An error every process of the job raises at the same point for the same reason (no peer is
// left waiting in a collective), so each may exit normally instead of aborting the job.
class WorldConsistentError : public Error {
 public:
  using Error::Error;
};

// Every process must issue the same calls with the same count / dtype / root in the same order,
// one call at a time per process (any thread, never two at once). `what` names the collective
// in the error a process prints when a peer dies or stalls.
class ProcessWorld {
 public:
  virtual ~ProcessWorld() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // How long a collective waits for a peer before the job ends with an error.
  virtual std::chrono::milliseconds timeout() const = 0;
  // In place: buf[i] = sum over processes; every process ends with identical bytes. f32, f64,
  // bf16 (summed in float32 pairwise, rounded after each addition), i32, i64. The order of the
  // additions is the implementation's (MpiWorld: the MPI library's allreduce algorithm).
  virtual void all_reduce(void* buf, int64_t count, graph::DataType dtype, std::string_view what) = 0;
  // The same sum started now and finished by all_reduce_wait(ticket): the processes' transfer
  // overlaps what the caller does in between (buf must not be touched until the wait returns).
  // Every process starts and waits in the same order. The default runs it synchronously.
  virtual uint64_t all_reduce_start(void* buf, int64_t count, graph::DataType dtype,
                                    std::string_view what) {
    all_reduce(buf, count, dtype, what);
    return 0;
  }
  virtual void all_reduce_wait(uint64_t ticket) { (void)ticket; }
  // Every process's buf becomes a copy of process `root`'s.
  virtual void broadcast(void* buf, int64_t count, graph::DataType dtype, int root,
                         std::string_view what) = 0;
  // recv (count * size() elements) = send of rank 0, send of rank 1, ...
  virtual void all_gather(const void* send, void* recv, int64_t count, graph::DataType dtype,
                          std::string_view what) = 0;
  virtual void barrier(std::string_view what) = 0;
  // How sums are computed (library, algorithm), for the processes to compare before step 1:
  // every rank must run the same, or they could disagree in the last bits. "" = no choice.
  virtual std::string reduction_algorithm() const { return ""; }
};

}  // namespace onnxtrain::runtime
