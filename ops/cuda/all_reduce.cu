// CUDA kernel of ai.onnxtrain.AllReduce over an NCCL communicator (CUDA builds only): the
// reduction runs on the communicator's stream (KernelContext::collectives()->native()), ordered
// against the replica's compute stream by events, so it overlaps the rest of backward. Other
// communicators fall back to the CPU kernel (ops/comm/collective_kernels.cc).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/bfloat16.h"
#include "graph/error.h"
#include "ops/collectives.h"
#include "ops/comm/all_reduce_inputs.h"
#include "ops/cuda/cuda_common.h"
#include "ops/op_api.h"

namespace onnxtrain::ops::cuda {
namespace {

using graph::DataType;
using graph::Node;

// Errors name the rank, as the communicator's own: "NCCL rank <r>: <what>: <reason>".
void check_cuda(cudaError_t result, int rank, std::string_view what) {
  if (result != cudaSuccess)
    fail("NCCL rank ", rank, ": ", what, ": CUDA error: ", cudaGetErrorString(result));
}
void check_nccl(ncclResult_t result, int rank, ncclComm_t comm, std::string_view what) {
  if (result == ncclSuccess) return;
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  fail("NCCL rank ", rank, ": ", what, ": ", ncclGetErrorString(result),
       last && *last ? cat(" (", last, ")") : std::string());
}

// The bf16 gradient wire (wire_dtype = bfloat16): float32 rounded to nearest-even bf16 when
// packed, widened (and scaled) when unpacked; the rule is graph/bfloat16.h's, as on the CPU.
__global__ void pack_bf16(const float* x, uint16_t* w, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    w[i] = graph::bf16_from_float(x[i]);
}
__global__ void unpack_bf16(const uint16_t* w, float* y, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = graph::bf16_to_float(w[i]) * scale;
}

// The native handles of the step's communicator; kind kNone without one.
NativeCollectives native_nccl(const KernelContext& ctx) {
  const Collectives* c = ctx.collectives();
  return c ? c->native() : NativeCollectives{};
}

// One replica's share of AllReduce, as the CPU kernel: its G present inputs are packed into one
// device buffer, summed across the ranks in place, and unpacked into the outputs.
//   inputs/outputs: replica-major [g0/r0 .. gG-1/r0, g0/r1, ...] (other replicas' slots omitted);
//   reduction "sum" | "mean"; f32 or f64; wire_dtype bfloat16 (f32 inputs) reduces in bf16.
// run() enqueues: pack (compute stream) -> ready event -> ncclAllReduce (comm stream) -> done
// event; the deferred finish enqueues: wait for done (compute stream) -> [scale] -> unpack.
class CudaAllReduceKernel final : public Kernel {
 public:
  explicit CudaAllReduceKernel(const Node& n)
      : mean_(n.attr_string("reduction", "sum") == "mean") {}
  ~CudaAllReduceKernel() override {
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
  }
  CudaAllReduceKernel(const CudaAllReduceKernel&) = delete;
  CudaAllReduceKernel& operator=(const CudaAllReduceKernel&) = delete;

  void prepare(KernelContext& ctx) override {
    const NativeCollectives nccl = native_nccl(ctx);
    if (nccl.kind != NativeCollectives::Kind::kNccl)
      throw DeviceFallback{"AllReduce: not an NCCL communicator"};
    const int rank = ctx.collectives()->rank();
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView* in = ctx.input(i);
      if (in && in->dtype != DataType::kFloat && in->dtype != DataType::kDouble)
        throw DeviceFallback{"AllReduce: the CUDA kernel takes float32/float64 only"};
    }
    if (ready_) return;  // prepare() runs again for every new plan of a dynamic step
    const std::string where = ctx.node().describe();
    int current = -1;
    check_cuda(cudaGetDevice(&current), rank, cat(where, ": cudaGetDevice"));
    // The events and the scratch buffer live on the current device; NCCL runs on the
    // communicator's: they must be one GPU.
    OT_CHECK(current == nccl.device, where, ": replica runs on CUDA device ", current,
             " but its NCCL communicator (rank ", rank, ") drives device ", nccl.device);
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), rank,
               cat(where, ": cudaEventCreateWithFlags"));
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), rank,
               cat(where, ": cudaEventCreateWithFlags"));
  }

  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const NativeCollectives nccl = native_nccl(ctx);
    OT_CHECK(nccl.kind == NativeCollectives::Kind::kNccl && ready_, where,
             ": CUDA AllReduce runs only after prepare() on an NCCL communicator");
    const int rank = ctx.collectives()->rank();
    auto* comm = static_cast<ncclComm_t>(nccl.comm);
    const AllReduceInputs inputs = all_reduce_inputs(ctx, where);
    const std::vector<int>& slots = inputs.slots;
    const int64_t total = inputs.total;
    const DataType dt = inputs.dtype;
    if (slots.empty()) return;
    // Output buffers are fixed for the run: take them now, fill them in the deferred finish.
    std::vector<std::pair<void*, size_t>> dst;
    for (int i : slots) {
      const TensorView* in = ctx.input(i);
      TensorView& out = ctx.output(i, in->dims);
      dst.emplace_back(out.data, in->nbytes());
    }
    if (total == 0) return;  // every rank holds the same bucket shapes: all skip together

    const bool bf16 = inputs.wire == DataType::kBFloat16;
    const size_t es =
        bf16 ? sizeof(uint16_t) : dt == DataType::kDouble ? sizeof(double) : sizeof(float);
    auto* buf = static_cast<std::byte*>(ctx.persistent_scratch(static_cast<size_t>(total) * es));
    cudaStream_t compute = stream_of(ctx);
    auto comm_stream = static_cast<cudaStream_t>(nccl.stream);
    size_t off = 0;
    for (int i : slots) {
      const TensorView* in = ctx.input(i);
      if (bf16) {
        const int64_t n = in->numel();
        if (n)
          pack_bf16<<<blocks_for(n), 256, 0, compute>>>(
              in->as<float>(), reinterpret_cast<uint16_t*>(buf) + off, n);
        check_cuda(cudaGetLastError(), rank, cat(where, ": pack input ", i, " to bf16"));
        off += static_cast<size_t>(n);
        continue;
      }
      if (in->nbytes())
        check_cuda(
            cudaMemcpyAsync(buf + off, in->data, in->nbytes(), cudaMemcpyDeviceToDevice, compute),
            rank, cat(where, ": pack input ", i));
      off += in->nbytes();
    }
    check_cuda(cudaEventRecord(ready_, compute), rank, cat(where, ": cudaEventRecord (ready)"));
    check_cuda(cudaStreamWaitEvent(comm_stream, ready_, 0), rank,
               cat(where, ": cudaStreamWaitEvent (comm stream)"));
    check_nccl(ncclAllReduce(buf, buf, static_cast<size_t>(total),
                             bf16 ? ncclBfloat16
                                  : dt == DataType::kDouble ? ncclFloat64 : ncclFloat32,
                             ncclSum, comm,
                             comm_stream),
               rank, comm, cat(where, ": ncclAllReduce of ", total, " elements"));
    check_cuda(cudaEventRecord(done_, comm_stream), rank, cat(where, ": cudaEventRecord (done)"));

    const double scale = mean_ ? 1.0 / ctx.collectives()->size() : 1.0;
    ctx.defer_completion(
        [done = done_, compute, buf, total, dt, bf16, scale, rank, where, dst = std::move(dst)] {
          // Enqueued only: the compute stream waits for the reduction, nothing blocks the host.
          check_cuda(cudaStreamWaitEvent(compute, done, 0), rank,
                     cat(where, ": cudaStreamWaitEvent (compute stream)"));
          if (bf16) {
            const auto* w = reinterpret_cast<const uint16_t*>(buf);
            for (const auto& [p, bytes] : dst) {
              const auto n = static_cast<int64_t>(bytes / sizeof(float));
              if (n)
                unpack_bf16<<<blocks_for(n), 256, 0, compute>>>(
                    w, static_cast<float*>(p), n, static_cast<float>(scale));
              check_cuda(cudaGetLastError(), rank, cat(where, ": unpack bf16 output"));
              w += n;
            }
            return;
          }
          if (scale != 1.0) {
            cublasHandle_t h = cublas_handle(compute);
            if (dt == DataType::kDouble) {
              OT_CUBLAS_CHECK(cublasDscal_64(h, total, &scale, reinterpret_cast<double*>(buf), 1));
            } else {
              const float s = static_cast<float>(scale);
              OT_CUBLAS_CHECK(cublasSscal_64(h, total, &s, reinterpret_cast<float*>(buf), 1));
            }
          }
          size_t off = 0;
          for (const auto& [p, n] : dst) {
            if (n)
              check_cuda(cudaMemcpyAsync(p, buf + off, n, cudaMemcpyDeviceToDevice, compute), rank,
                         cat(where, ": unpack output"));
            off += n;
          }
        });
  }

 private:
  bool mean_;
  cudaEvent_t ready_ = nullptr;  // pack finished on the compute stream
  cudaEvent_t done_ = nullptr;   // reduction finished on the comm stream
};

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(all_reduce_cuda, kOnnxtrainDomain, "AllReduce", kCuda) {
  return std::make_unique<CudaAllReduceKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
