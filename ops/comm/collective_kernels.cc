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
#include "ops/op_api.h"

namespace onnxtrain::ops::comm {
namespace {

using graph::DataType;
using graph::Node;

double at(const TensorView& v, int64_t i) {
  return v.dtype == DataType::kDouble ? v.as<double>()[i] : v.as<float>()[i];
}
void put(TensorView& v, int64_t i, double x) {
  if (v.dtype == DataType::kDouble)
    v.as<double>()[i] = x;
  else
    v.as<float>()[i] = static_cast<float>(x);
}

// Bytes per element of the reduction buffer: the wire dtype's.
size_t wire_size(const AllReduceInputs& in) {
  return in.wire == DataType::kDouble ? 8 : in.wire == DataType::kBFloat16 ? 2 : 4;
}

// One replica's share of ai.onnxtrain.AllReduce: its G inputs (the other replicas' slots are
// omitted) are packed into one buffer, reduced across the replicas in place, and unpacked.
//   inputs/outputs: replica-major [g0/r0 .. gG-1/r0, g0/r1, ...]; reduction "sum" | "mean";
//   wire_dtype bfloat16: float32 packed into a bf16 buffer and widened back when unpacked.
class AllReduceKernel final : public Kernel {
 public:
  explicit AllReduceKernel(const Node& n) : mean_(n.attr_string("reduction", "sum") == "mean") {}
  // Allocates the packed buffer before the first run (its size is known from the dims).
  void prepare(KernelContext& ctx) override {
    const AllReduceInputs inputs = all_reduce_inputs(ctx, ctx.node().describe());
    if (!inputs.slots.empty())
      ctx.persistent_scratch(static_cast<size_t>(inputs.total) * wire_size(inputs) + 64);
  }
  void run(KernelContext& ctx) override {
    Collectives& comm = ctx.require_collectives();
    const std::string where = ctx.node().describe();
    const AllReduceInputs inputs = all_reduce_inputs(ctx, where);
    const std::vector<int>& slots = inputs.slots;
    const int64_t total = inputs.total;
    const DataType dt = inputs.dtype;
    if (slots.empty()) return;
    OT_CHECK(dt == DataType::kFloat || dt == DataType::kDouble, where,
             ": AllReduce supports float32/float64");
    const bool bf16 = inputs.wire == DataType::kBFloat16;
    auto* buf = static_cast<std::byte*>(
        ctx.persistent_scratch(static_cast<size_t>(total) * wire_size(inputs) + 64));
    size_t off = 0;
    for (int i : slots) {
      const TensorView* in = ctx.input(i);
      if (bf16) {  // float32 -> the bf16 wire, nearest even
        auto* w = reinterpret_cast<uint16_t*>(buf) + off;
        const float* x = in->as<float>();
        ctx.parallel_for(in->numel(), 4096, [&](int64_t b, int64_t e) {
          for (int64_t j = b; j < e; ++j) w[j] = graph::bf16_from_float(x[j]);
        });
        off += static_cast<size_t>(in->numel());
      } else {
        if (in->nbytes()) std::memcpy(buf + off, in->data, in->nbytes());
        off += in->nbytes();
      }
    }
    // Asynchronous: the reduction runs on the communicator's worker while this replica's
    // backward continues; the outputs are unpacked when the first reader (an optimizer
    // update) needs them. Output buffers are fixed for the run, so their addresses are taken now.
    CollectiveHandle handle = comm.all_reduce_async(buf, total, inputs.wire);
    std::vector<std::pair<std::byte*, size_t>> dst;
    for (int i : slots) {
      const TensorView* in = ctx.input(i);
      TensorView& out = ctx.output(i, in->dims);
      dst.emplace_back(static_cast<std::byte*>(out.data), in->nbytes());
    }
    const double scale = mean_ ? 1.0 / comm.size() : 1.0;
    if (bf16) {
      ctx.defer_completion([handle, buf, scale, dst = std::move(dst)] {
        handle.wait();
        const auto* w = reinterpret_cast<const uint16_t*>(buf);
        const auto s = static_cast<float>(scale);
        for (const auto& [p, n] : dst) {
          auto* y = reinterpret_cast<float*>(p);
          const size_t count = n / sizeof(float);
          for (size_t j = 0; j < count; ++j) y[j] = graph::bf16_to_float(w[j]) * s;
          w += count;
        }
      });
      return;
    }
    ctx.defer_completion([handle, buf, total, dt, scale, dst = std::move(dst)] {
      handle.wait();
      if (scale != 1.0) {
        if (dt == DataType::kDouble)
          for (int64_t j = 0; j < total; ++j) reinterpret_cast<double*>(buf)[j] *= scale;
        else
          for (int64_t j = 0; j < total; ++j)
            reinterpret_cast<float*>(buf)[j] *= static_cast<float>(scale);
      }
      size_t off = 0;
      for (const auto& [p, n] : dst) {
        if (n) std::memcpy(p, buf + off, n);
        off += n;
      }
    });
  }

 private:
  bool mean_;
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
ONNXTRAIN_REGISTER_KERNEL(sync_batch_norm_cpu, kOnnxtrainDomain, "SyncBatchNormalization", kCpu) {
  return std::make_unique<SyncBatchNormKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(sync_batch_norm_grad_cpu, kOnnxtrainDomain, "SyncBatchNormalizationGrad",
                          kCpu) {
  return std::make_unique<SyncBatchNormGradKernel>(n);
}

}  // namespace onnxtrain::ops::comm
