// Collective communication between replicas: the transport-neutral interface the trainer's
// AllReduce nodes call (in-process threads today; MPI and NCCL implement the same interface).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "graph/dtype.h"

namespace onnxtrain::runtime {

using graph::DataType;

enum class ReduceOp { kSum };

// "sum".
std::string_view reduce_op_name(ReduceOp op);
// Bytes per element of a dtype the collectives move (f32, f64, f16, bf16, i8-i64, u8-u64,
// bool); throws Error naming `what` for strings, packed 4-bit and undefined types.
int64_t comm_element_size(DataType dtype, std::string_view what);
// True for the dtypes ReduceOp::kSum adds: f32, f64, i32, i64 (integers wrap on overflow).
bool comm_can_reduce(DataType dtype);
// Throws Error "<what>: ..." for a negative count, a null buffer with count > 0, a dtype the
// collectives cannot move, or (reduce = true) one that ReduceOp::kSum cannot add.
void check_comm_args(const void* buf, int64_t count, DataType dtype, bool reduce,
                     std::string_view what);

// One outstanding asynchronous collective, as an implementation tracks it.
class CommWork {
 public:
  virtual ~CommWork() = default;
  // Blocks until the collective finished; rethrows its Error (every call does).
  virtual void wait() = 0;
  virtual bool done() const = 0;
};

// What all_reduce_async returns. Copyable; an empty handle is already done.
class CommHandle {
 public:
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<CommWork> work) : work_(std::move(work)) {}
  // Blocks until the buffer holds the result; throws the collective's Error.
  void wait() const {
    if (work_) work_->wait();
  }
  bool done() const { return !work_ || work_->done(); }

 private:
  std::shared_ptr<CommWork> work_;
};

// One object per rank (replica). Every rank must issue the same collectives, with the same
// count / dtype / op / root, in the same order; collectives on one communicator complete in
// issue order (synchronous ones after every earlier asynchronous one). Buffers are device or
// host pointers as the implementation documents, and must stay valid until the call returns
// (async: until the handle is done). An Error in any collective is reported on every rank.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: buf[i] = sum over ranks of buf[i]; every rank ends with identical bytes.
  virtual void all_reduce(void* buf, int64_t count, DataType dtype,
                          ReduceOp op = ReduceOp::kSum) = 0;
  // Same, returning at once; the buffer must not be touched until the handle is done.
  virtual CommHandle all_reduce_async(void* buf, int64_t count, DataType dtype,
                                      ReduceOp op = ReduceOp::kSum) = 0;
  // Every rank's buf becomes a copy of rank `root`'s buf.
  virtual void broadcast(void* buf, int64_t count, DataType dtype, int root) = 0;
  // recv (count * size() elements) = send of rank 0, send of rank 1, ...
  virtual void all_gather(const void* send, void* recv, int64_t count, DataType dtype) = 0;
  // recv (count_per_rank elements) of rank k = sum over ranks of chunk k of their send
  // (count_per_rank * size() elements).
  virtual void reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DataType dtype,
                              ReduceOp op = ReduceOp::kSum) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
};

// The size-1 communicator: single-replica code runs the same path with no other rank.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op = ReduceOp::kSum) override;
  CommHandle all_reduce_async(void* buf, int64_t count, DataType dtype,
                              ReduceOp op = ReduceOp::kSum) override;
  void broadcast(void* buf, int64_t count, DataType dtype, int root) override;
  void all_gather(const void* send, void* recv, int64_t count, DataType dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DataType dtype,
                      ReduceOp op = ReduceOp::kSum) override;
  void barrier() override {}
};

}  // namespace onnxtrain::runtime
