// CUDA kernels of the shape family: the pure relabelings (Identity, Flatten, Reshape, Squeeze,
// Unsqueeze: a device copy into the planned output), Expand and Transpose (one strided gather),
// Concat, Gather, inference-mode Dropout, DropoutGrad and ai.onnxtrain.ShardBatch. Element
// moves dispatch on element width, so every fixed-size dtype works; strings fall back.
#include <numeric>

#include "ops/cuda/eltwise_util.cuh"
#include "ops/shape_util.h"

namespace onnxtrain::ops::cuda {
namespace {

// x: any -> y: the planned dims, same elements in the same order
class CopyKernel final : public Kernel {
 public:
  explicit CopyKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override { elem_bytes(need_input(ctx, 0).dtype); }
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    TensorView& y = ctx.output(0);
    OT_CHECK(y.nbytes() == x.nbytes(), ctx.node().describe(), ": planned output holds ", y.nbytes(),
             " bytes, input ", x.nbytes());
    copy_async(y.data, x.data, x.nbytes(), stream_of(ctx));
  }
};

// x: (broadcastable to s), shape: s (constant) -> y: broadcast(x.dims, s)
class ExpandKernel final : public Kernel {
 public:
  explicit ExpandKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    bytes_ = elem_bytes(x.dtype);
    const TensorView* shape = ctx.host_constant(1);
    if (!shape) throw DeviceFallback{"shape input is not a plan-time constant"};
    std::vector<int64_t> target = host_ints(*shape);
    for (int64_t d : target)
      if (d < 0) throw DeviceFallback{"negative shape entry"};
    if (!broadcast_dims_of({x.dims, target}, out_dims_))
      throw DeviceFallback{"input does not broadcast to the shape"};
    map_ = make_map(out_dims_, {broadcast_strides(x.dims, out_dims_.size())});
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    check_dims(y, out_dims_, ctx.node(), "output");
    launch_strided_gather(map_, bytes_, ctx.input(0)->data, y.data, stream_of(ctx));
  }

 private:
  size_t bytes_ = 0;
  std::vector<int64_t> out_dims_;
  StridedMap map_;
};

// x: (d0..dn) -> y: (d[perm[0]]..d[perm[n]])
class TransposeKernel final : public Kernel {
 public:
  explicit TransposeKernel(const graph::Node& n)
      : has_perm_(n.find_attr("perm") != nullptr), perm_(n.attr_ints("perm")) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    bytes_ = elem_bytes(x.dtype);
    const size_t rank = x.dims.size();
    std::vector<int64_t> perm = perm_;
    if (!has_perm_) {
      perm.resize(rank);
      std::iota(perm.rbegin(), perm.rend(), 0);
    }
    if (perm.size() != rank) throw DeviceFallback{"perm does not match the rank"};
    std::vector<bool> seen(rank, false);
    for (int64_t& p : perm) {
      if (p < -static_cast<int64_t>(rank) || p >= static_cast<int64_t>(rank))
        throw DeviceFallback{"perm entry out of range"};
      if (p < 0) p += static_cast<int64_t>(rank);
      if (seen[static_cast<size_t>(p)]) throw DeviceFallback{"perm repeats an axis"};
      seen[static_cast<size_t>(p)] = true;
    }
    const std::vector<int64_t> in_strides = row_major_strides(x.dims);
    out_dims_.clear();
    std::vector<int64_t> strides;
    for (int64_t p : perm) {
      out_dims_.push_back(x.dims[static_cast<size_t>(p)]);
      strides.push_back(in_strides[static_cast<size_t>(p)]);
    }
    map_ = make_map(out_dims_, {strides});
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    check_dims(y, out_dims_, ctx.node(), "output");
    launch_strided_gather(map_, bytes_, ctx.input(0)->data, y.data, stream_of(ctx));
  }

 private:
  bool has_perm_;
  std::vector<int64_t> perm_;
  size_t bytes_ = 0;
  std::vector<int64_t> out_dims_;
  StridedMap map_;
};

// src: (outer, src_row) -> dst: (outer, dst_row) at column `offset` (rows in elements)
template <typename U>
__global__ void copy_rows_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t outer,
                                 int64_t src_row, int64_t dst_row, int64_t offset) {
  const int64_t total = outer * src_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = i / src_row;
    dst[o * dst_row + offset + (i - o * src_row)] = src[i];
  }
}

void launch_copy_rows(size_t bytes, const void* src, void* dst, int64_t outer, int64_t src_row,
                      int64_t dst_row, int64_t offset, cudaStream_t s) {
  if (outer * src_row == 0) return;
  dispatch_width(bytes, [&]<typename U>() {
    copy_rows_kernel<U><<<blocks_for(outer * src_row, kThreads), kThreads, 0, s>>>(
        static_cast<const U*>(src), static_cast<U*>(dst), outer, src_row, dst_row, offset);
    OT_CUDA_CHECK_LAUNCH();
  });
}

// x_i: (.., a_i, ..) -> y: (.., sum a_i, ..) along `axis`
class ConcatKernel final : public Kernel {
 public:
  explicit ConcatKernel(const graph::Node& n)
      : node_axis_(n.find_attr("axis") != nullptr), axis_attr_(n.attr_int("axis", 1)) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x0 = need_input(ctx, 0);
    bytes_ = elem_bytes(x0.dtype);
    if (!node_axis_ && ctx.opset() >= 4) throw DeviceFallback{"axis attribute missing"};
    const auto rank = static_cast<int64_t>(x0.dims.size());
    if (axis_attr_ < -rank || axis_attr_ >= rank) throw DeviceFallback{"axis out of range"};
    const auto axis = static_cast<size_t>(axis_attr_ < 0 ? axis_attr_ + rank : axis_attr_);
    outer_ = 1;
    for (size_t k = 0; k < axis; ++k) outer_ *= x0.dims[k];
    int64_t inner = 1;
    for (size_t k = axis + 1; k < x0.dims.size(); ++k) inner *= x0.dims[k];
    rows_.clear();
    dst_row_ = 0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView& x = need_input(ctx, i);
      if (x.dtype != x0.dtype || x.dims.size() != x0.dims.size())
        throw DeviceFallback{"inputs differ in dtype or rank"};
      for (size_t k = 0; k < x.dims.size(); ++k)
        if (k != axis && x.dims[k] != x0.dims[k]) throw DeviceFallback{"inputs differ in dims"};
      rows_.push_back(x.dims[axis] * inner);
      dst_row_ += rows_.back();
    }
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    OT_CHECK(y.numel() == outer_ * dst_row_, ctx.node().describe(),
             ": planned output size differs from the inputs'");
    int64_t offset = 0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      launch_copy_rows(bytes_, ctx.input(i)->data, y.data, outer_, rows_[static_cast<size_t>(i)],
                       dst_row_, offset, stream_of(ctx));
      offset += rows_[static_cast<size_t>(i)];
    }
  }

 private:
  bool node_axis_;
  int64_t axis_attr_;
  size_t bytes_ = 0;
  int64_t outer_ = 1, dst_row_ = 0;
  std::vector<int64_t> rows_;
};

// data: (outer, n, inner) viewed around `axis`, idx: (m) -> out: (outer, m, inner).
// An out-of-range index (the CPU throws) writes `bad` (NaN bits for float data, else 0).
template <typename U, typename I>
__global__ void gather_kernel(const U* __restrict__ data, const I* __restrict__ idx,
                              U* __restrict__ out, int64_t outer, int64_t n, int64_t m,
                              int64_t inner, U bad) {
  const int64_t total = outer * m * inner;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t % inner;
    const int64_t j = (t / inner) % m;
    const int64_t o = t / (inner * m);
    int64_t k = static_cast<int64_t>(idx[j]);
    if (k < 0) k += n;
    out[t] = (k < 0 || k >= n) ? bad : data[(o * n + k) * inner + i];
  }
}

class GatherKernel final : public Kernel {
 public:
  explicit GatherKernel(const graph::Node& n) : axis_attr_(n.attr_int("axis", 0)) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& data = need_input(ctx, 0);
    const TensorView& idx = need_input(ctx, 1);
    bytes_ = elem_bytes(data.dtype);
    need_dtype(idx.dtype, {DataType::kInt64, DataType::kInt32}, "Gather indices");
    const int64_t rank = data.rank();
    if (axis_attr_ < -rank || axis_attr_ >= rank) throw DeviceFallback{"axis out of range"};
    const auto axis = static_cast<size_t>(axis_attr_ < 0 ? axis_attr_ + rank : axis_attr_);
    outer_ = 1;
    inner_ = 1;
    for (size_t k = 0; k < axis; ++k) outer_ *= data.dims[k];
    for (size_t k = axis + 1; k < data.dims.size(); ++k) inner_ *= data.dims[k];
    n_ = data.dims[axis];
    m_ = idx.numel();
    idx64_ = idx.dtype == DataType::kInt64;
    // Constant indices are checked here, so the CPU kernel reports a bad one.
    if (const TensorView* c = ctx.host_constant(1)) {
      for (int64_t k : host_ints(*c))
        if (k < -n_ || k >= n_) throw DeviceFallback{"index out of range"};
    }
    bad_ = 0;
    if (data.dtype == DataType::kFloat) bad_ = 0x7fc00000u;
    if (data.dtype == DataType::kDouble) bad_ = 0x7ff8000000000000ull;
  }
  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    const int64_t total = outer_ * m_ * inner_;
    OT_CHECK(y.numel() == total, ctx.node().describe(), ": planned output size differs");
    if (total == 0) return;
    const void* data = ctx.input(0)->data;
    const void* idx = ctx.input(1)->data;
    const cudaStream_t s = stream_of(ctx);
    dispatch_width(bytes_, [&]<typename U>() {
      const U bad = static_cast<U>(bad_);
      if (idx64_)
        gather_kernel<U, int64_t><<<blocks_for(total, kThreads), kThreads, 0, s>>>(
            static_cast<const U*>(data), static_cast<const int64_t*>(idx), static_cast<U*>(y.data),
            outer_, n_, m_, inner_, bad);
      else
        gather_kernel<U, int32_t><<<blocks_for(total, kThreads), kThreads, 0, s>>>(
            static_cast<const U*>(data), static_cast<const int32_t*>(idx), static_cast<U*>(y.data),
            outer_, n_, m_, inner_, bad);
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  int64_t axis_attr_;
  size_t bytes_ = 0;
  int64_t outer_ = 1, n_ = 1, m_ = 0, inner_ = 1;
  bool idx64_ = true;
  uint64_t bad_ = 0;
};

// Scalar of a host-constant float tensor (Dropout's ratio).
double host_float(const TensorView& v) {
  if (v.dtype == DataType::kFloat) return *v.as<float>();
  if (v.dtype == DataType::kDouble) return *v.as<double>();
  throw DeviceFallback{"ratio dtype not handled on CUDA"};
}

// x: (any) [, ratio, training_mode] -> y: x [, mask: all true]. Only the identity cases run here
// (inference, or training with ratio 0); random masks fall back to the CPU's generator.
class DropoutKernel final : public Kernel {
 public:
  explicit DropoutKernel(const graph::Node& n) : ratio_attr_(n.attr_float("ratio", 0.5f)) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    elem_bytes(x.dtype);
    double ratio = ctx.opset() >= 12 ? 0.5 : ratio_attr_;
    bool training = false;
    if (ctx.opset() >= 12) {
      if (const TensorView* r = ctx.input(1); r && r->numel() > 0) {
        const TensorView* c = ctx.host_constant(1);
        if (!c) throw DeviceFallback{"ratio is not a plan-time constant"};
        ratio = host_float(*c);
      }
      if (const TensorView* t = ctx.input(2); t && t->numel() > 0) {
        const TensorView* c = ctx.host_constant(2);
        if (!c || c->dtype != DataType::kBool)
          throw DeviceFallback{"training_mode is not a plan-time bool constant"};
        training = *static_cast<const uint8_t*>(c->data) != 0;
      }
    }
    if (!(ratio >= 0.0 && ratio <= 1.0)) throw DeviceFallback{"ratio outside [0, 1]"};
    if (training && ratio != 0.0) throw DeviceFallback{"training-mode dropout draws on the CPU"};
    want_mask_ = ctx.num_outputs() > 1 && ctx.has_output(1);
    if (want_mask_ && ctx.opset() < 10) throw DeviceFallback{"mask of dtype T (opset < 10)"};
  }
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    TensorView& y = ctx.output(0);
    copy_async(y.data, x.data, x.nbytes(), stream_of(ctx));
    if (want_mask_) {
      TensorView& m = ctx.output(1);
      if (m.nbytes() > 0) OT_CUDA_CHECK(cudaMemsetAsync(m.data, 1, m.nbytes(), stream_of(ctx)));
    }
  }

 private:
  float ratio_attr_;
  bool want_mask_ = false;
};

// dy: (n), keep: (n) bool -> dx = keep ? dy * scale : 0, in T (the CPU's DropoutGrad)
template <typename T>
__global__ void dropout_grad_kernel(const T* __restrict__ dy, const bool* __restrict__ keep,
                                    T* __restrict__ dx, int64_t n, T scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dx[i] = keep[i] ? dy[i] * scale : T(0);
}

// dY: (any), mask: (dY dims, bool) [, ratio, training_mode] -> dX = dY * mask / (1 - ratio) in
// training mode (0 for ratio 1), dY otherwise; ratio / training_mode must be plan-time constants.
class DropoutGradKernel final : public Kernel {
 public:
  explicit DropoutGradKernel(const graph::Node&) {}
  void prepare(KernelContext& ctx) override {
    const TensorView& dy = need_input(ctx, 0);
    const TensorView& mask = need_input(ctx, 1);
    if (mask.dtype != DataType::kBool || mask.dims != dy.dims)
      throw DeviceFallback{"mask is not a bool tensor of dY's dims"};
    double ratio = 0.5;
    training_ = false;
    if (const TensorView* t = ctx.input(3); t && t->numel() > 0) {
      const TensorView* c = ctx.host_constant(3);
      if (!c || c->dtype != DataType::kBool)
        throw DeviceFallback{"training_mode is not a plan-time bool constant"};
      training_ = *static_cast<const uint8_t*>(c->data) != 0;
    }
    if (const TensorView* r = ctx.input(2); training_ && r && r->numel() > 0) {
      const TensorView* c = ctx.host_constant(2);
      if (!c) throw DeviceFallback{"ratio is not a plan-time constant"};
      ratio = host_float(*c);
    }
    if (training_)
      need_dtype(dy.dtype, {DataType::kFloat, DataType::kDouble}, "DropoutGrad dY");
    else
      elem_bytes(dy.dtype);
    scale_ = ratio < 1.0 ? 1.0 / (1.0 - ratio) : 0.0;
    dtype_ = dy.dtype;
  }
  void run(KernelContext& ctx) override {
    const TensorView& dy = *ctx.input(0);
    TensorView& dx = ctx.output(0);
    const cudaStream_t s = stream_of(ctx);
    if (!training_) {
      copy_async(dx.data, dy.data, dy.nbytes(), s);
      return;
    }
    const int64_t n = dy.numel();
    if (n == 0) return;
    dispatch_types(FloatT{}, dtype_, [&]<typename T>() {
      dropout_grad_kernel<T><<<blocks_for(n, kThreads), kThreads, 0, s>>>(
          dy.as<T>(), ctx.input(1)->as<bool>(), dx.as<T>(), n, static_cast<T>(scale_));
      OT_CUDA_CHECK_LAUNCH();
    });
  }

 private:
  bool training_ = false;
  double scale_ = 1.0;
  DataType dtype_ = DataType::kUndefined;
};

// Rows of replica k when n rows are split over r replicas, the first n % r getting one more.
int64_t shard_size(int64_t n, int64_t r, int64_t k) {
  return n / r + (k < n % r ? 1 : 0);
}
int64_t shard_start(int64_t n, int64_t r, int64_t k) {
  return k * (n / r) + std::min(k, n % r);
}

// x: (N, ...) -> out_k: (size_k, ...), rows [start_k, start_k + size_k) of x
class ShardBatchKernel final : public Kernel {
 public:
  explicit ShardBatchKernel(const graph::Node& n) : r_(n.attr_int("replicas", 0)) {
    if (r_ < 1) throw DeviceFallback{"replicas attribute missing or < 1"};
  }
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    bytes_ = elem_bytes(x.dtype);
    if (x.rank() < 1 || ctx.num_outputs() != r_) throw DeviceFallback{"rank 0 or output count"};
  }
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const int64_t n = x.dims[0];
    const int64_t row = n > 0 ? x.numel() / n : 0;
    for (int64_t k = 0; k < r_; ++k) {
      if (!ctx.has_output(static_cast<int>(k))) continue;
      TensorView& out = ctx.output(static_cast<int>(k));
      const int64_t count = shard_size(n, r_, k) * row;
      OT_CHECK(out.numel() == count, ctx.node().describe(), ": planned output ", k, " holds ",
               out.numel(), " elements, its shard ", count);
      // cudaMemcpyDefault: a replica's output may live on another device (peer copy).
      copy_async(out.data, static_cast<const char*>(x.data) + shard_start(n, r_, k) * row * bytes_,
                 static_cast<size_t>(count) * bytes_, stream_of(ctx));
    }
  }

 private:
  int64_t r_;
  size_t bytes_ = 0;
};

template <typename K>
std::unique_ptr<Kernel> make(const graph::Node& n) {
  return std::make_unique<K>(n);
}

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(identity_cuda, "", "Identity", kCuda) {
  return make<CopyKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(flatten_cuda, "", "Flatten", kCuda) {
  return make<CopyKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(reshape_cuda, "", "Reshape", kCuda) {
  return make<CopyKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(squeeze_cuda, "", "Squeeze", kCuda) {
  return make<CopyKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(unsqueeze_cuda, "", "Unsqueeze", kCuda) {
  return make<CopyKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(expand_cuda, "", "Expand", kCuda) {
  return make<ExpandKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(transpose_cuda, "", "Transpose", kCuda) {
  return make<TransposeKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(concat_cuda, "", "Concat", kCuda) {
  return make<ConcatKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(gather_cuda, "", "Gather", kCuda) {
  return make<GatherKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(dropout_cuda, "", "Dropout", kCuda) {
  return make<DropoutKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(dropout_grad_cuda, kOnnxtrainDomain, "DropoutGrad", kCuda) {
  return make<DropoutGradKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(shard_batch_cuda, kOnnxtrainDomain, "ShardBatch", kCuda) {
  return make<ShardBatchKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
