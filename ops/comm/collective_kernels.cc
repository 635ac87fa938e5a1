// CPU kernels of the ops that talk to other replicas: ai.onnxtrain AllReduce,
// SyncBatchNormalization and SyncBatchNormalizationGrad (schemas: ops/comm/collective_ops.cc,
// ops/nn/sync_batch_norm.cc). They reach the replica's communicator through
// KernelContext::collectives(); AllReduce finishes through KernelContext::defer_completion.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "graph/bfloat16.h"
#include "graph/error.h"
#include "ops/collectives.h"
#include "ops/comm/all_reduce_inputs.h"
#include "ops/elementwise/dtypes.h"
#include "ops/op_api.h"

namespace onnxtrain::ops::comm {
namespace {

using graph::DataType;
using graph::Node;

// Element i of a float32, float64, bf16 or f16 (mixed precision's activations) tensor.
double at(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DataType::kDouble:
      return v.as<double>()[i];
    case DataType::kBFloat16:
      return static_cast<float>(v.as<ops::ew::BFloat16>()[i]);
    case DataType::kFloat16:
      return static_cast<float>(v.as<ops::ew::Half>()[i]);
    default:
      return v.as<float>()[i];
  }
}
void put(TensorView& v, int64_t i, double x) {
  switch (v.dtype) {
    case DataType::kDouble:
      v.as<double>()[i] = x;
      return;
    case DataType::kBFloat16:
      v.as<ops::ew::BFloat16>()[i] = static_cast<float>(x);
      return;
    case DataType::kFloat16:
      v.as<ops::ew::Half>()[i] = static_cast<float>(x);
      return;
    default:
      v.as<float>()[i] = static_cast<float>(x);
  }
}

// One replica's share of ai.onnxtrain.AllReduce: its G inputs (the other replicas' slots are
// omitted) are reduced across the replicas as one block.
//   inputs/outputs: replica-major [g0/r0 .. gG-1/r0, g0/r1, ...]; reduction "sum" | "mean".
//   Float32/float64 wire: the block is AllReduceInputs' packed layout (each input 64-byte
//   aligned). Where the runtime placed the inputs there with each output over its input
//   (OpSchema::packed_inputs) the reduction runs on the gradients themselves; otherwise they are
//   copied into a packed buffer of the same layout and back. The gaps are reduced too (no one
//   reads them), so every rank reduces the same count whichever way it went.
//   wire_dtype bfloat16: float32 packed densely into a bf16 buffer and widened back.
class AllReduceKernel final : public Kernel {
 public:
  explicit AllReduceKernel(const Node& n) : mean_(n.attr_string("reduction", "sum") == "mean") {}
  // Allocates the packed buffer before the first run when one will be needed (its size is
  // known from the dims; a CPU plan's buffers are already placed here).
  void prepare(KernelContext& ctx) override {
    const AllReduceInputs inputs = all_reduce_inputs(ctx, ctx.node().describe());
    if (!inputs.slots.empty() && !packed(ctx, inputs)) packed_buffer(ctx, inputs);
  }
  void run(KernelContext& ctx) override {
    Collectives& comm = ctx.require_collectives();
    const std::string where = ctx.node().describe();
    const AllReduceInputs inputs = all_reduce_inputs(ctx, where);
    const std::vector<int>& slots = inputs.slots;
    const DataType dt = inputs.dtype;
    if (slots.empty()) return;
    OT_CHECK(dt == DataType::kFloat || dt == DataType::kDouble, where,
             ": AllReduce supports float32/float64");
    const double scale = mean_ ? 1.0 / comm.size() : 1.0;
    if (inputs.wire == DataType::kBFloat16) return run_bf16(ctx, comm, inputs, scale);
    bool direct = packed(ctx, inputs);
    std::vector<std::byte*> outs;
    for (int i : slots) {
      outs.push_back(static_cast<std::byte*>(ctx.output(i, ctx.input(i)->dims).data));
      direct = direct && outs.back() == ctx.input(i)->data;
    }
    auto* buf = direct ? static_cast<std::byte*>(ctx.input(slots[0])->data)
                       : packed_buffer(ctx, inputs);
    std::vector<std::pair<std::byte*, size_t>> dst;  // (output, bytes) when copied back
    for (size_t k = 0; k < slots.size() && !direct; ++k) {
      const TensorView* in = ctx.input(slots[k]);
      if (in->nbytes()) std::memcpy(buf + inputs.packed_offsets[k], in->data, in->nbytes());
      dst.emplace_back(outs[k], in->nbytes());
    }
    // Asynchronous: the reduction runs on the communicator's worker while this replica's
    // backward continues; it is finished (scaled, copied out) when the first reader (an
    // optimizer update) needs the outputs. Output buffers are fixed for the run.
    const size_t es = dt == DataType::kDouble ? sizeof(double) : sizeof(float);
    const auto count = static_cast<int64_t>(inputs.packed_bytes / es);
    CollectiveHandle handle = comm.all_reduce_async(buf, count, dt);
    std::vector<size_t> offsets = inputs.packed_offsets;
    ctx.defer_completion([handle, buf, count, dt, scale, offsets = std::move(offsets),
                          dst = std::move(dst)] {
      handle.wait();
      if (scale != 1.0) {
        if (dt == DataType::kDouble)
          for (int64_t j = 0; j < count; ++j) reinterpret_cast<double*>(buf)[j] *= scale;
        else
          for (int64_t j = 0; j < count; ++j)
            reinterpret_cast<float*>(buf)[j] *= static_cast<float>(scale);
      }
      for (size_t k = 0; k < dst.size(); ++k)
        if (dst[k].second) std::memcpy(dst[k].first, buf + offsets[k], dst[k].second);
    });
  }

 private:
  // True when input k sits at its packed offset from input 0 (the outputs are checked in run()).
  static bool packed(const KernelContext& ctx, const AllReduceInputs& inputs) {
    if (inputs.wire != inputs.dtype) return false;
    const auto* base = static_cast<const std::byte*>(ctx.input(inputs.slots[0])->data);
    if (!base) return false;
    for (size_t k = 0; k < inputs.slots.size(); ++k)
      if (ctx.input(inputs.slots[k])->data != base + inputs.packed_offsets[k]) return false;
    return true;
  }
  // The node's own packed buffer, zeroed when first made (the gaps between inputs stay zero).
  std::byte* packed_buffer(KernelContext& ctx, const AllReduceInputs& inputs) {
    const size_t bytes = inputs.wire == DataType::kBFloat16
                             ? static_cast<size_t>(inputs.total) * sizeof(uint16_t)
                             : inputs.packed_bytes;
    auto* buf = static_cast<std::byte*>(ctx.persistent_scratch(bytes + 64));
    if (!zeroed_) std::memset(buf, 0, bytes + 64);
    zeroed_ = true;
    return buf;
  }
  void run_bf16(KernelContext& ctx, Collectives& comm, const AllReduceInputs& inputs,
                double scale) {
    auto* w = reinterpret_cast<uint16_t*>(packed_buffer(ctx, inputs));
    std::vector<std::pair<float*, int64_t>> dst;
    int64_t off = 0;
    for (int i : inputs.slots) {  // float32 -> the bf16 wire, nearest even
      const TensorView* in = ctx.input(i);
      const float* x = in->as<float>();
      uint16_t* p = w + off;
      ctx.parallel_for(in->numel(), 4096, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) p[j] = graph::bf16_from_float(x[j]);
      });
      dst.emplace_back(ctx.output(i, in->dims).as<float>(), in->numel());
      off += in->numel();
    }
    CollectiveHandle handle = comm.all_reduce_async(w, inputs.total, DataType::kBFloat16);
    ctx.defer_completion([handle, w, scale, dst = std::move(dst)] {
      handle.wait();
      const auto s = static_cast<float>(scale);
      const uint16_t* q = w;
      for (const auto& [y, n] : dst) {
        for (int64_t j = 0; j < n; ++j) y[j] = graph::bf16_to_float(q[j]) * s;
        q += n;
      }
    });
  }

  bool mean_;
  bool zeroed_ = false;
};

// One replica's share of ai.onnxtrain.Broadcast (passes::shard_updates): the root replica sends
// its present inputs, every other replica receives them into its outputs (its inputs only
// give the types). Asynchronous like AllReduce: finished before the first reader of an
// output, or at the end of the step.
class BroadcastKernel final : public Kernel {
 public:
  explicit BroadcastKernel(const Node& n)
      : replicas_(n.attr_int("replicas", 0)), root_(static_cast<int>(n.attr_int("root", 0))) {}
  void run(KernelContext& ctx) override {
    Collectives& comm = ctx.require_collectives();
    const std::string where = ctx.node().describe();
    OT_CHECK(comm.size() == replicas_, where, ": broadcasts among ", replicas_,
             " replicas, but the step's group has ", comm.size(),
             " ranks (sharded updates are built for the replicas of one process)");
    const bool root = comm.rank() == root_;
    std::vector<CollectiveBuffer> bufs;
    DataType dt = DataType::kUndefined;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView* in = ctx.input(i);
      if (!in) continue;
      OT_CHECK(dt == DataType::kUndefined || in->dtype == dt, where,
               ": inputs of one Broadcast must share a dtype");
      dt = in->dtype;
      if (root) {
        bufs.push_back({const_cast<void*>(static_cast<const void*>(in->data)), in->numel()});
        continue;
      }
      OT_CHECK(ctx.has_output(i), where, ": replica ", comm.rank(), " receives input ", i,
               " but its output ", i, " is absent");
      TensorView& out = ctx.output(i, in->dims);
      bufs.push_back({out.data, out.numel()});
    }
    if (bufs.empty()) return;
    CollectiveHandle handle = comm.broadcast_async(bufs, dt, root_);
    ctx.defer_completion([handle] { handle.wait(); });
  }

 private:
  int64_t replicas_;
  int root_;
};

// Layout of x: (N, C, D...) -> n, c, inner.
struct BnDims {
  int64_t n = 0, c = 0, inner = 1;
};
BnDims bn_dims(const TensorView& x, const std::string& where) {
  OT_CHECK(x.rank() >= 2, where, ": X must have rank >= 2 (N, C, ...), got rank ", x.rank());
  BnDims d{x.dims[0], x.dims[1], 1};
  for (int64_t k = 2; k < x.rank(); ++k) d.inner *= x.dims[k];
  return d;
}

// Global batch mean and biased variance per channel: local sums of x and x^2 and the element
// count, summed over the replicas in float64.
void global_stats(Collectives& comm, const TensorView& x, const BnDims& d,
                  std::vector<double>& mean, std::vector<double>& var, double& count,
                  const KernelContext& ctx) {
  std::vector<double> buf(static_cast<size_t>(2 * d.c + 1), 0.0);
  ctx.parallel_for(d.c, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      double s1 = 0, s2 = 0;
      for (int64_t i = 0; i < d.n; ++i) {
        const int64_t base = (i * d.c + c) * d.inner;
        for (int64_t j = 0; j < d.inner; ++j) {
          const double v = at(x, base + j);
          s1 += v;
          s2 += v * v;
        }
      }
      buf[c] = s1;
      buf[d.c + c] = s2;
    }
  });
  buf[2 * d.c] = static_cast<double>(d.n * d.inner);
  comm.all_reduce(buf.data(), static_cast<int64_t>(buf.size()), DataType::kDouble);
  count = buf[2 * d.c];
  mean.assign(d.c, 0.0);
  var.assign(d.c, 0.0);
  for (int64_t c = 0; c < d.c; ++c) {
    if (count <= 0) continue;
    mean[c] = buf[c] / count;
    var[c] = std::max(0.0, buf[d.c + c] / count - mean[c] * mean[c]);
  }
}

// x: (N,C,D...), scale/B/running_mean/running_var: (C) -> y: (N,C,D...), running_mean',
// running_var': (C) with the global batch statistics (momentum as BatchNormalization).
class SyncBatchNormKernel final : public Kernel {
 public:
  explicit SyncBatchNormKernel(const Node& n)
      : eps_(n.attr_float("epsilon", 1e-5f)), momentum_(n.attr_float("momentum", 0.9f)) {}
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& x = *ctx.input(0);
    const TensorView &scale = *ctx.input(1), &bias = *ctx.input(2);
    const BnDims d = bn_dims(x, where);
    std::vector<double> mean, var;
    double count = 0;
    global_stats(ctx.require_collectives(), x, d, mean, var, count, ctx);
    TensorView& y = ctx.output(0, x.dims);
    ctx.parallel_for(d.c, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const double inv = 1.0 / std::sqrt(var[c] + eps_);
        const double a = at(scale, c) * inv, sh = at(bias, c) - mean[c] * a;
        for (int64_t i = 0; i < d.n; ++i) {
          const int64_t base = (i * d.c + c) * d.inner;
          for (int64_t j = 0; j < d.inner; ++j) put(y, base + j, at(x, base + j) * a + sh);
        }
      }
    });
    const std::vector<int64_t> cdims{d.c};
    for (int k = 1; k <= 2 && k < ctx.num_outputs(); ++k) {
      if (!ctx.has_output(k)) continue;
      const TensorView& running = *ctx.input(k + 2);
      TensorView& out = ctx.output(k, cdims);
      const std::vector<double>& batch = k == 1 ? mean : var;
      for (int64_t c = 0; c < d.c; ++c)
        put(out, c, at(running, c) * momentum_ + batch[c] * (1.0 - momentum_));
    }
  }

 private:
  double eps_, momentum_;
};

// dy, x: (N,C,D...), scale: (C) -> dx: (N,C,D...), dscale, dB: (C) (this replica's share).
//   dx = scale * inv / M * (M dy - sum_g(dy) - xhat sum_g(dy xhat)), M and sum_g over all replicas.
class SyncBatchNormGradKernel final : public Kernel {
 public:
  explicit SyncBatchNormGradKernel(const Node& n) : eps_(n.attr_float("epsilon", 1e-5f)) {}
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    Collectives& comm = ctx.require_collectives();
    const TensorView &dy = *ctx.input(0), &x = *ctx.input(1), &scale = *ctx.input(2);
    const BnDims d = bn_dims(x, where);
    std::vector<double> mean, var;
    double count = 0;
    global_stats(comm, x, d, mean, var, count, ctx);
    std::vector<double> local(static_cast<size_t>(2 * d.c), 0.0);  // sum dy, sum dy*xhat
    ctx.parallel_for(d.c, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        const double inv = 1.0 / std::sqrt(var[c] + eps_);
        double sdy = 0, sdyx = 0;
        for (int64_t i = 0; i < d.n; ++i) {
          const int64_t base = (i * d.c + c) * d.inner;
          for (int64_t j = 0; j < d.inner; ++j) {
            const double g = at(dy, base + j);
            sdy += g;
            sdyx += g * (at(x, base + j) - mean[c]) * inv;
          }
        }
        local[c] = sdy;
        local[d.c + c] = sdyx;
      }
    });
    std::vector<double> global = local;
    comm.all_reduce(global.data(), static_cast<int64_t>(global.size()), DataType::kDouble);
    const std::vector<int64_t> cdims{d.c};
    if (ctx.has_output(0)) {
      TensorView& dx = ctx.output(0, x.dims);
      ctx.parallel_for(d.c, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c) {
          const double inv = 1.0 / std::sqrt(var[c] + eps_);
          const double k = count > 0 ? at(scale, c) * inv / count : 0.0;
          for (int64_t i = 0; i < d.n; ++i) {
            const int64_t base = (i * d.c + c) * d.inner;
            for (int64_t j = 0; j < d.inner; ++j) {
              const double xhat = (at(x, base + j) - mean[c]) * inv;
              put(dx, base + j,
                  k * (count * at(dy, base + j) - global[c] - xhat * global[d.c + c]));
            }
          }
        }
      });
    }
    for (int k = 1; k <= 2 && k < ctx.num_outputs(); ++k) {
      if (!ctx.has_output(k)) continue;
      TensorView& out = ctx.output(k, cdims);
      for (int64_t c = 0; c < d.c; ++c) put(out, c, local[(k == 1 ? d.c : 0) + c]);
    }
  }

 private:
  double eps_;
};

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(all_reduce_cpu, kOnnxtrainDomain, "AllReduce", kCpu) {
  return std::make_unique<AllReduceKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(broadcast_cpu, kOnnxtrainDomain, "Broadcast", kCpu) {
  return std::make_unique<BroadcastKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sync_batch_norm_cpu, kOnnxtrainDomain, "SyncBatchNormalization", kCpu) {
  return std::make_unique<SyncBatchNormKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sync_batch_norm_grad_cpu, kOnnxtrainDomain, "SyncBatchNormalizationGrad",
                          kCpu) {
  return std::make_unique<SyncBatchNormGradKernel>(n);
}

}  // namespace onnxtrain::ops::comm
