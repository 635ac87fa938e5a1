// NCCL collectives between CUDA devices: one NcclCommunicator per GPU (rank), in one process
// (ncclCommInitAll) or across the processes of a ProcessWorld (ncclUniqueId broadcast over MPI).
// Compiled only with the CUDA backend; CUDA-free code uses runtime/comm/nccl_factory.h.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/process_world.h"

namespace onnxtrain::runtime {

// Throws Error "NCCL rank <rank>: <what>: <ncclGetErrorString> (<last NCCL message>)" unless
// `result` is ncclSuccess. `comm` (may be null) supplies the last message.
void check_nccl(ncclResult_t result, int rank, ncclComm_t comm, std::string_view what);
// Same for a CUDA runtime call.
void check_cuda(cudaError_t result, int rank, std::string_view what);

// Rank k of an NCCL communicator, driving one CUDA device. Every collective runs on this
// communicator's own non-blocking stream (comm_stream()), so communication overlaps the
// replica's compute stream.
//
// Buffers: DEVICE pointers of device() (or managed memory) are used in place; they must hold
// their data when the call is made (the producing stream synchronized: the comm stream does not
// order itself after other streams; the CUDA AllReduce kernel orders by events instead). A HOST
// pointer is staged through a device buffer synchronously (copy in, collective, copy out), so
// host-side callers (the sync-BN CPU kernels, a training loop's loss sum) keep working.
// Synchronous calls return after cudaStreamSynchronize(comm stream); all_reduce_async on device
// memory returns at once with a handle that waits on an event recorded after the collective.
// Sums (all_reduce, reduce_scatter) take f32, f64, f16, bf16, i32, i64, u8, i8; broadcast and
// all_gather move any fixed-size dtype (as bytes). Use one communicator from one thread at a
// time (its replica's thread); the calling thread's current device is restored on return.
class NcclCommunicator final : public Communicator {
 public:
  // One communicator per local GPU in one process (ncclCommInitAll); rank k drives
  // cuda_devices[k].
  static std::vector<std::unique_ptr<NcclCommunicator>> create_local(
      const std::vector<int>& cuda_devices);
  // One communicator spanning every process of `world` x its local GPUs: global rank
  // world.rank() * cuda_devices.size() + k. Every process must pass the same number of devices
  // (checked over `world`, an error on every process otherwise). Rank 0 makes the ncclUniqueId
  // and broadcasts its bytes over world.broadcast; each local GPU then joins with
  // ncclCommInitRank inside one ncclGroupStart/End.
  static std::vector<std::unique_ptr<NcclCommunicator>> create_world(
      ProcessWorld& world, const std::vector<int>& cuda_devices);

  // Waits for the queued collectives, then destroys the NCCL communicator and the stream.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op = ReduceOp::kSum) override;
  CommHandle all_reduce_async(void* buf, int64_t count, DataType dtype,
                              ReduceOp op = ReduceOp::kSum) override;
  void broadcast(void* buf, int64_t count, DataType dtype, int root) override;
  void all_gather(const void* send, void* recv, int64_t count, DataType dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count_per_rank, DataType dtype,
                      ReduceOp op = ReduceOp::kSum) override;
  void barrier() override;

  // For the CUDA AllReduce kernel (ops/cuda/all_reduce.cu), which enqueues ncclAllReduce
  // itself on comm_stream(), ordered by events: kind kNccl, device, comm and stream.
  ops::NativeCollectives native() const override {
    return {ops::NativeCollectives::Kind::kNccl, device_, comm_, stream_};
  }
  int device() const { return device_; }
  cudaStream_t comm_stream() const { return stream_; }
  ncclComm_t comm() const { return comm_; }

 private:
  // Takes ownership of `comm`; creates the stream on `device`.
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size);
  // True for memory the collectives may use in place (device memory of device(), managed);
  // throws for device memory of another GPU.
  bool is_device_memory(const void* p, std::string_view what) const;
  // Device staging memory of at least `bytes` (grown on demand, kept).
  std::byte* staging(size_t bytes);
  void sync(std::string_view what) const;
  void check(ncclResult_t r, std::string_view what) const { check_nccl(r, rank_, comm_, what); }
  void check(cudaError_t r, std::string_view what) const { check_cuda(r, rank_, what); }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t stream_ = nullptr;
  std::byte* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace onnxtrain::runtime
