// Fixed rearrangements: DepthToSpace / SpaceToDepth (a 6-D view of the input, permuted; their
// gradients permute back),
// ReverseSequence (per-batch reversed strided windows), Trilu and EyeLike (triangle / diagonal
// masks).
#include <algorithm>
#include <cstring>

#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

// ---- DepthToSpace / SpaceToDepth: x (N,C,H,W), blocksize b.

struct BlockView {
  std::vector<int64_t> view, perm, out;  // 6-D view of x, its permutation, the 4-D result
};

BlockView depth_to_space(std::span<const int64_t> x, int64_t b, bool crd,
                         const std::string& where) {
  OT_CHECK(x.size() == 4, where, ": input must have rank 4, got ", x.size());
  OT_CHECK(b > 0 && x[1] % (b * b) == 0, where, ": channels ", x[1],
           " are not divisible by blocksize^2 (blocksize ", b, ")");
  const int64_t n = x[0], c = x[1] / (b * b), h = x[2], w = x[3];
  std::vector<int64_t> out{n, c, h * b, w * b};
  if (crd) return BlockView{{n, c, b, b, h, w}, {0, 1, 4, 2, 5, 3}, out};
  return BlockView{{n, b, b, c, h, w}, {0, 3, 4, 1, 5, 2}, out};  // DCR
}

BlockView space_to_depth(std::span<const int64_t> x, int64_t b, const std::string& where) {
  OT_CHECK(x.size() == 4, where, ": input must have rank 4, got ", x.size());
  OT_CHECK(b > 0 && x[2] % b == 0 && x[3] % b == 0, where, ": spatial dims ", x[2], "x", x[3],
           " are not divisible by blocksize ", b);
  const int64_t n = x[0], c = x[1], h = x[2] / b, w = x[3] / b;
  return BlockView{{n, c, h, b, w, b}, {0, 3, 5, 1, 2, 4}, {n, c * b * b, h, w}};
}

// The forward op of `node`: DepthToSpace / SpaceToDepth, or their ai.onnxtrain ...Grad (which
// carry the forward's attributes).
bool is_space_to_depth(const graph::Node& node) {
  return node.op_type == "SpaceToDepth" || node.op_type == "SpaceToDepthGrad";
}

BlockView block_view(const graph::Node& node, std::span<const int64_t> x) {
  const int64_t b = node.attr_int("blocksize", 0);
  if (is_space_to_depth(node)) return space_to_depth(x, b, node.describe());
  const std::string mode = node.attr_string("mode", "DCR");
  OT_CHECK(mode == "DCR" || mode == "CRD", node.describe(), ": unknown mode '", mode, "'");
  return depth_to_space(x, b, mode == "CRD", node.describe());
}

void infer_block(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  auto dims = known_dims(x);
  std::optional<std::vector<int64_t>> out;
  if (dims) out = block_view(ctx.node, *dims).out;
  set_output_dims(ctx, 0, x.dtype, out, x.shape ? 4 : -1);
}

// x: (N,C,H,W) -> DepthToSpace (N,C/b²,H*b,W*b) | SpaceToDepth (N,C*b²,H/b,W/b)
class BlockKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const ElemKind e = addressable_elem(x.dtype, ctx.node().describe());
    BlockView v = block_view(ctx.node(), x.dims);
    permute_copy(&ctx, e, v.view, v.perm, out_elems(ctx.output(0, v.out)), elems(x));
  }
};

// The forward's input dims from its output dims y (the inverse of BlockView::out).
std::vector<int64_t> block_input_dims(const graph::Node& node, std::span<const int64_t> y) {
  const std::string where = node.describe();
  OT_CHECK(y.size() == 4, where, ": dY must have rank 4, got ", y.size());
  const int64_t b = node.attr_int("blocksize", 0);
  OT_CHECK(b > 0, where, ": blocksize ", b, " must be > 0");
  if (is_space_to_depth(node)) {
    OT_CHECK(y[1] % (b * b) == 0, where, ": dY's channels ", y[1],
             " are not divisible by blocksize^2");
    return {y[0], y[1] / (b * b), y[2] * b, y[3] * b};
  }
  OT_CHECK(y[2] % b == 0 && y[3] % b == 0, where, ": dY's spatial dims are not divisible by ",
           "blocksize ", b);
  return {y[0], y[1] * b * b, y[2] / b, y[3] / b};
}

void infer_block_grad(InferenceContext& ctx) {
  const ValueType& dy = tensor_input(ctx, 0);
  auto dims = known_dims(dy);
  std::optional<std::vector<int64_t>> x;
  if (dims) x = block_input_dims(ctx.node, *dims);
  set_output_dims(ctx, 0, dy.dtype, x, dy.shape ? 4 : -1);
}

// ai.onnxtrain DepthToSpaceGrad / SpaceToDepthGrad(dY) with the forward's attributes -> dX: the
// forward is a permutation of a 6-D view, so dX is dY viewed as the permuted 6-D shape and
// permuted back.
class BlockGradKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& dy = *ctx.input(0);
    const ElemKind e = addressable_elem(dy.dtype, ctx.node().describe());
    const std::vector<int64_t> x = block_input_dims(ctx.node(), dy.dims);
    const BlockView v = block_view(ctx.node(), x);
    std::vector<int64_t> permuted(6), inverse(6);
    for (size_t i = 0; i < 6; ++i) {
      permuted[i] = v.view[static_cast<size_t>(v.perm[i])];
      inverse[static_cast<size_t>(v.perm[i])] = static_cast<int64_t>(i);
    }
    permute_copy(&ctx, e, permuted, inverse, out_elems(ctx.output(0, x)), elems(dy));
  }
};

void block_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  b.set_input_grad(0, b.emit1(b.node().op_type + "Grad", {b.output_grad(0)}, b.node().attributes,
                              kOnnxtrainDomain));
}

OpSchema block_op(const char* op_type) {
  OpSchema s = make_op(op_type, infer_block, factory_of<BlockKernel>());
  s.gradient = block_gradient;
  return s;
}

OpSchema block_grad_op(const char* op_type) {
  OpSchema s = make_op(op_type, infer_block_grad, factory_of<BlockGradKernel>());
  s.domain = kOnnxtrainDomain;
  return s;
}

// ---- ReverseSequence: x (.., T, .., B, ..), sequence_lens (B) -> x with each batch's first
// sequence_lens[b] time steps reversed.

class ReverseSequenceKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const std::string where = ctx.node().describe();
    const ElemKind e = addressable_elem(x.dtype, where);
    const auto t_axis =
        static_cast<size_t>(normalize_axis(ctx.node().attr_int("time_axis", 0), x.rank(), where));
    const auto b_axis =
        static_cast<size_t>(normalize_axis(ctx.node().attr_int("batch_axis", 1), x.rank(), where));
    OT_CHECK(t_axis != b_axis && x.rank() >= 2, where, ": time_axis and batch_axis must differ");
    const auto lens = view_ints(*ctx.input(1), where);
    OT_CHECK(static_cast<int64_t>(lens.size()) == x.dims[b_axis], where, ": ", lens.size(),
             " sequence lengths for a batch of ", x.dims[b_axis]);
    TensorView& y = ctx.output(0, x.dims);
    copy_all(ctx, x, y);
    if (y.numel() == 0) return;
    const auto strides = contiguous_strides(x.dims);
    std::vector<int64_t> dims = x.dims, src_strides = strides;
    dims[b_axis] = 1;
    src_strides[t_axis] = -strides[t_axis];
    void* dst = out_elems(y);
    for (size_t b = 0; b < lens.size(); ++b) {
      OT_CHECK(lens[b] >= 0 && lens[b] <= x.dims[t_axis], where, ": sequence length ", lens[b],
               " is outside [0, ", x.dims[t_axis], "]");
      if (lens[b] < 2) continue;
      dims[t_axis] = lens[b];
      const int64_t base = static_cast<int64_t>(b) * strides[b_axis];
      strided_copy(&ctx, e, dims, advance(dst, e, base), strides,
                   advance(elems(x), e, base + (lens[b] - 1) * strides[t_axis]), src_strides);
    }
  }
};

// ---- Trilu: x (.., M, N) [, k: ()] -> x with the elements outside the triangle zeroed.

class TriluKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const std::string where = ctx.node().describe();
    const ElemKind e = addressable_elem(x.dtype, where);
    OT_CHECK(x.rank() >= 2 && !e.is_string, where, ": expects a numeric tensor of rank >= 2");
    auto k_in = input_ints(ctx, 1);
    const int64_t k = k_in && !k_in->empty() ? k_in->front() : 0;
    const bool upper = ctx.node().attr_int("upper", 1) != 0;
    TensorView& y = ctx.output(0, x.dims);
    const int64_t m = x.dims[x.dims.size() - 2], n = x.dims.back();
    const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
    if (n == 0) return;
    const auto eb = static_cast<int64_t>(e.bytes);
    auto* dst = static_cast<std::byte*>(y.data);
    const auto* src = static_cast<const std::byte*>(x.data);
    ctx.parallel_for(rows, std::max<int64_t>(1, 4096 / n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t i = r % m;
        // Kept columns: j >= i + k (upper) or j <= i + k (lower), clamped to [0, n].
        const int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, n) : 0;
        const int64_t hi = upper ? n : std::clamp<int64_t>(i + k + 1, 0, n);
        std::byte* row = dst + r * n * eb;
        std::memset(row, 0, static_cast<size_t>(n * eb));
        if (hi > lo)
          std::memcpy(row + lo * eb, src + (r * n + lo) * eb, static_cast<size_t>((hi - lo) * eb));
      }
    });
  }
};

// ---- EyeLike: x (M, N) -> (M, N) of dtype (default x's), ones on the diagonal j = i + k.

DataType eye_dtype(const graph::Node& node, DataType input) {
  const int64_t d = node.attr_int("dtype", 0);
  if (d == 0) return input;
  OT_CHECK(graph::is_known_dtype(static_cast<int32_t>(d)), node.describe(), ": dtype ", d,
           " is not a valid ONNX data type");
  return static_cast<DataType>(d);
}

void infer_eye_like(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  set_output(ctx, 0, eye_dtype(ctx.node, x.dtype), x.shape);
}

class EyeLikeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    const std::string where = ctx.node().describe();
    OT_CHECK(x.rank() == 2, where, ": input must have rank 2, got ", x.rank());
    TensorView& y = ctx.output(0, x.dims);
    const ElemKind e = addressable_elem(y.dtype, where);
    OT_CHECK(!e.is_string, where, ": dtype string is not supported");
    if (y.numel() == 0) return;
    std::memset(y.data, 0, y.nbytes());
    alignas(16) std::byte one[16];
    scalar_bytes(y.dtype, 1.0, one, where);
    const int64_t k = ctx.node().attr_int("k", 0), m = x.dims[0], n = x.dims[1];
    // Diagonal from (max(0, -k), max(0, k)), stepping n + 1 elements.
    const int64_t i0 = std::max<int64_t>(0, -k), j0 = std::max<int64_t>(0, k);
    const int64_t count = std::max<int64_t>(0, std::min(m - i0, n - j0));
    if (count == 0) return;
    const int64_t zero = 0, step = n + 1;
    strided_copy(&ctx, e, std::span<const int64_t>(&count, 1), advance(y.data, e, i0 * n + j0),
                 std::span<const int64_t>(&step, 1), one, std::span<const int64_t>(&zero, 1));
  }
};

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_depth_to_space) {
  return block_op("DepthToSpace");
}
ONNXTRAIN_REGISTER_OP(shape_space_to_depth) {
  return block_op("SpaceToDepth");
}
ONNXTRAIN_REGISTER_OP(shape_depth_to_space_grad) {
  return block_grad_op("DepthToSpaceGrad");
}
ONNXTRAIN_REGISTER_OP(shape_space_to_depth_grad) {
  return block_grad_op("SpaceToDepthGrad");
}
ONNXTRAIN_REGISTER_OP(shape_reverse_sequence) {
  return make_op("ReverseSequence", infer_like_input, factory_of<ReverseSequenceKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_trilu) {
  return make_op("Trilu", infer_like_input, factory_of<TriluKernel>());
}
ONNXTRAIN_REGISTER_OP(shape_eye_like) {
  return make_op("EyeLike", infer_eye_like, factory_of<EyeLikeKernel>());
}

}  // namespace onnxtrain::ops::shape
