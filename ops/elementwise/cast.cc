// Cast and CastLike between every numeric type, bool, float16, bfloat16 and string.
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "ops/bf16_rows.h"
#include "ops/elementwise/grad_util.h"
#include "ops/elementwise/kernels.h"
#include "ops/simd_clones.h"

namespace onnxtrain::ops::ew {
namespace {

DataType cast_target(const graph::Node& n) {
  const graph::Attribute* a = n.find_attr("to");
  OT_CHECK(a && a->type == graph::AttrType::kInt, n.describe(), ": attribute 'to' is missing");
  OT_CHECK(graph::is_known_dtype(static_cast<int32_t>(a->i())), n.describe(), ": 'to' = ", a->i(),
           " is not a known data type");
  return static_cast<DataType>(a->i());
}

// Shortest text that parses back to the same value (what numpy's str() prints for floats).
template <typename T>
std::string format_value(T v) {
  char buf[64];
  std::to_chars_result r;
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    r = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>)
    r = std::to_chars(buf, buf + sizeof(buf), static_cast<int>(v));
  else
    r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// strtod accepts what the ONNX tests write: "0.5", "NaN", "INF", "+INF", "-INF".
double parse_value(const std::string& s, const std::string& where) {
  const char* begin = s.c_str();
  char* end = nullptr;
  double v = std::strtod(begin, &end);
  OT_CHECK(end != begin && *end == '\0', where, ": cannot parse '", s, "' as a number");
  return v;
}

// Cast's conversion: convert(), except that float -> bfloat16 truncates (the ONNX backend tests'
// bits, opset 13 to 21), where arithmetic on BFloat16 rounds to nearest even.
template <typename O, typename I>
O cast_value(I v) {
  if constexpr (std::is_same_v<O, BFloat16> && !std::is_same_v<I, BFloat16>)
    return BFloat16::truncated(static_cast<float>(convert<float>(v)));
  else
    return convert<O>(v);
}

// float32 -> bf16 as bits, BFloat16::truncated's rule, in the CPU's widest vectors (through
// broadcast_apply the BFloat16 conversions ran scalar: ResNet-50's classifier weight gradient,
// 2M elements, 1.35 ms); the widening is ops/bf16_rows.h's.
OT_SIMD_CLONES void truncate_to_bf16(const uint32_t* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t upper = x[i] >> 16;
    const bool nan = (x[i] & 0x7fffffffu) > 0x7f800000u;
    y[i] = static_cast<uint16_t>(nan ? upper | 0x40u : upper);  // NaN stays NaN
  }
}

// x: any dims, any dtype -> y: same dims, dtype `to`.
void cast_tensor(KernelContext& ctx, const TensorView& x, DataType to) {
  const std::string where = ctx.node().describe();
  TensorView& y = ctx.output(0, x.dims);
  const auto n = static_cast<size_t>(x.numel());
  if (x.dtype == to) {
    if (to == DataType::kString)
      *y.strings = *x.strings;
    else if (n > 0 && y.data != x.data)
      std::memcpy(y.data, x.data, x.nbytes());
    return;
  }
  if ((x.dtype == DataType::kBFloat16 && to == DataType::kFloat) ||
      (x.dtype == DataType::kFloat && to == DataType::kBFloat16)) {
    const bool widen = x.dtype == DataType::kBFloat16;
    ctx.parallel_for(static_cast<int64_t>(n), 16384, [&](int64_t begin, int64_t end) {
      if (widen)
        widen_row_from_bf16(static_cast<const uint16_t*>(x.data) + begin,
                            static_cast<float*>(y.data) + begin, end - begin);
      else
        truncate_to_bf16(static_cast<const uint32_t*>(x.data) + begin,
                         static_cast<uint16_t*>(y.data) + begin, end - begin);
    });
    return;
  }
  if (x.dtype == DataType::kString) {
    OT_CHECK(x.strings, where, ": string storage is missing");
    dispatch(AllTypes{}, to, where, [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      O* out = y.as<O>();
      for (size_t i = 0; i < n; ++i) out[i] = cast_value<O>(parse_value((*x.strings)[i], where));
    });
    return;
  }
  if (to == DataType::kString) {
    OT_CHECK(y.strings, where, ": string storage is missing");
    dispatch(AllTypes{}, x.dtype, where, [&](auto in_tag) {
      using I = typename decltype(in_tag)::type;
      const I* in = x.as<I>();
      y.strings->resize(n);
      for (size_t i = 0; i < n; ++i) (*y.strings)[i] = format_value(in[i]);
    });
    return;
  }
  dispatch(AllTypes{}, x.dtype, where, [&](auto in_tag) {
    using I = typename decltype(in_tag)::type;
    dispatch(AllTypes{}, to, where, [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      broadcast_apply<O>(
          ctx, y, [](I v) { return cast_value<O>(v); }, operand<I>(x));
    });
  });
}

class CastKernel final : public Kernel {
 public:
  explicit CastKernel(const graph::Node& n) : to_(cast_target(n)) {}
  void run(KernelContext& ctx) override { cast_tensor(ctx, required_input(ctx, 0), to_); }

 private:
  DataType to_;
};

// input: any, target_type: any (only its dtype matters) -> output: input's dims, target's dtype.
class CastLikeKernel final : public Kernel {
 public:
  explicit CastLikeKernel(const graph::Node&) {}
  void run(KernelContext& ctx) override {
    cast_tensor(ctx, required_input(ctx, 0), required_input(ctx, 1).dtype);
  }
};

void infer_cast(InferenceContext& ctx) {
  set_output(ctx, 0, cast_target(ctx.node), tensor_input(ctx, 0).shape);
}

void infer_cast_like(InferenceContext& ctx) {
  set_output(ctx, 0, tensor_input(ctx, 1).dtype, tensor_input(ctx, 0).shape);
}

// The gradient casts back to the input's dtype (only float inputs ask for one). CastLike's
// second input gives only a dtype: it gets no gradient.
void cast_grad(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  const DataType to = b.input(0)->dtype();
  OT_CHECK(to != DataType::kUndefined, b.node().describe(), ": input dtype is unknown");
  b.set_input_grad(0, b.emit1("Cast", {b.output_grad(0)},
                              {graph::Attribute::make_int("to", static_cast<int64_t>(to))}));
}

}  // namespace

ONNXTRAIN_REGISTER_OP(ew_cast) {
  return with_gradient(make_schema("Cast", infer_cast, factory<CastKernel>()), cast_grad);
}
ONNXTRAIN_REGISTER_OP(ew_cast_like) {
  return with_gradient(make_schema("CastLike", infer_cast_like, factory<CastLikeKernel>(), 15),
                       cast_grad);
}

}  // namespace onnxtrain::ops::ew
