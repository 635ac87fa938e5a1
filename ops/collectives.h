// What a collective kernel (AllReduce, SyncBatchNormalization) sees of the step's communicator:
// rank, size and in-place all-reduce, blocking or asynchronous. The runtime's communicators
// (runtime/comm) implement it; a kernel reaches it through KernelContext::collectives().
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "graph/dtype.h"

namespace onnxtrain::ops {

enum class ReduceOp { kSum };

// One outstanding asynchronous collective, as an implementation tracks it.
class CollectiveWork {
 public:
  virtual ~CollectiveWork() = default;
  // Blocks until the collective finished; rethrows its Error (every call does).
  virtual void wait() = 0;
  virtual bool done() const = 0;
};

// What all_reduce_async returns. Copyable; an empty handle is already done.
class CollectiveHandle {
 public:
  CollectiveHandle() = default;
  explicit CollectiveHandle(std::shared_ptr<CollectiveWork> work) : work_(std::move(work)) {}
  // Blocks until the buffer holds the result; throws the collective's Error.
  void wait() const {
    if (work_) work_->wait();
  }
  bool done() const { return !work_ || work_->done(); }

 private:
  std::shared_ptr<CollectiveWork> work_;
};

// One buffer of a multi-buffer collective: `count` elements at `data`.
struct CollectiveBuffer {
  void* data = nullptr;
  int64_t count = 0;
};

// A device communicator's own handles, for a device kernel that enqueues the collective on the
// device itself (the CUDA AllReduce kernel calls ncclAllReduce). kind kNone: the communicator
// only offers the calls below (host or staged buffers).
struct NativeCollectives {
  enum class Kind { kNone, kNccl };
  Kind kind = Kind::kNone;
  int device = -1;         // the CUDA device ordinal it drives
  void* comm = nullptr;    // kNccl: ncclComm_t
  void* stream = nullptr;  // kNccl: the cudaStream_t its collectives run on
};

// One object per rank (replica). Every rank issues the same collectives, with the same count
// and dtype, in the same order; they complete in issue order. An Error in a collective is
// reported on every rank.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: buf[i] = sum over ranks of buf[i]; every rank ends with identical bytes.
  virtual void all_reduce(void* buf, int64_t count, graph::DataType dtype,
                          ReduceOp op = ReduceOp::kSum) = 0;
  // Same, returning at once; the buffer must not be touched until the handle is done.
  virtual CollectiveHandle all_reduce_async(void* buf, int64_t count, graph::DataType dtype,
                                            ReduceOp op = ReduceOp::kSum) = 0;
  // Every rank's bufs[i] becomes a copy of rank `root`'s bufs[i] (every rank passes as many
  // buffers, with the same counts), returning at once; no buffer may be touched until the
  // handle is done (the root's are only read).
  virtual CollectiveHandle broadcast_async(const std::vector<CollectiveBuffer>& bufs,
                                           graph::DataType dtype, int root) = 0;
  // The native handles of a device communicator (NCCL); kind kNone for the others.
  virtual NativeCollectives native() const { return {}; }
};

}  // namespace onnxtrain::ops
