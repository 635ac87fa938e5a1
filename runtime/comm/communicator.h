// Collective communication between replicas: the transport-neutral interface every
// communicator implements (in-process threads, MPI-hierarchical, NCCL). It extends
// ops::Collectives, which is what the collective op kernels see (KernelContext::collectives).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "graph/dtype.h"
#include "ops/collectives.h"

namespace onnxtrain::runtime {

using graph::DataType;

using ops::ReduceOp;

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

// The handle types of ops/collectives.h, under the runtime's names.
using CommWork = ops::CollectiveWork;
using CommHandle = ops::CollectiveHandle;

// One object per rank (replica). Every rank must issue the same collectives, with the same
// count / dtype / op / root, in the same order; collectives on one communicator complete in
// issue order (synchronous ones after every earlier asynchronous one). Buffers are device or
// host pointers as the implementation documents, and must stay valid until the call returns
// (async: until the handle is done). An Error in any collective is reported on every rank.
class Communicator : public ops::Collectives {
 public:
  // rank, size, all_reduce and all_reduce_async: ops::Collectives.
  // Every rank's buf becomes a copy of rank `root`'s buf.
  virtual void broadcast(void* buf, int64_t count, DataType dtype, int root) = 0;
  // ops::Collectives' multi-buffer broadcast; by default one synchronous broadcast per buffer
  // (an already finished handle).
  CommHandle broadcast_async(const std::vector<ops::CollectiveBuffer>& bufs, DataType dtype,
                             int root) override;
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
