// CUDA Cast: the CPU's conversion rules (ops/elementwise/cast.cc) over one contiguous map,
// bf16 / f16 included (autocast's Casts), and convert_floats for the other CUDA kernels.
#include <limits>
#include <type_traits>

#include "ops/cuda/eltwise_util.cuh"

namespace onnxtrain::ops::cuda {
namespace {

// Cast's float -> bfloat16 (BFloat16::truncated, ops/elementwise/dtypes.h): the upper 16 bits,
// as the ONNX reference and its backend tests do; NaN stays a (quiet) NaN.
__device__ __forceinline__ __nv_bfloat16 bf16_truncated(float f) {
  const unsigned bits = __float_as_uint(f);
  auto upper = static_cast<unsigned short>(bits >> 16);
  if (f != f) upper = static_cast<unsigned short>(upper | 0x40);
  return __ushort_as_bfloat16(upper);
}

// The CPU's cast_value<To>(From): NaN -> 0 and saturation for float -> integer, != 0 for ->
// bool; bf16 and f16 go through float32 (f16 rounds to nearest even, bf16 truncates).
template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (kIsLow<From>) {
    return convert<To>(widen(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return bf16_truncated(static_cast<float>(convert<float>(v)));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(convert<float>(v)));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    const double d = static_cast<double>(v);
    if (d != d) return To(0);
    if (d <= static_cast<double>(std::numeric_limits<To>::lowest()))
      return std::numeric_limits<To>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<To>::max()))
      return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else {
    return static_cast<To>(v);
  }
}

template <typename To>
struct ConvertOp {
  template <typename From>
  __device__ To operator()(From v) const {
    return convert<To>(v);
  }
};

using CastT =
    Types<float, double, int8_t, int16_t, int32_t, int64_t, uint8_t, bool, __half, __nv_bfloat16>;

// Rounds to nearest even into bf16 / f16 (the arithmetic kernels' rule), plain conversion
// otherwise: convert_floats' rule, unlike Cast's truncating bf16.
template <typename To>
struct RoundOp {
  template <typename From>
  __device__ To operator()(From v) const {
    return narrow<To>(widen(v));
  }
};

// x: any dims -> y: same dims, dtype `to`
class CastKernel final : public Kernel {
 public:
  explicit CastKernel(const graph::Node& n) {
    const graph::Attribute* a = n.find_attr("to");
    if (!a || a->type != graph::AttrType::kInt) throw DeviceFallback{"attribute 'to' missing"};
    to_ = static_cast<DataType>(a->i());
    if (!has_dtype(CastT{}, to_)) throw DeviceFallback{"target dtype not handled on CUDA"};
  }
  void prepare(KernelContext& ctx) override {
    const TensorView& x = need_input(ctx, 0);
    if (!has_dtype(CastT{}, x.dtype)) throw DeviceFallback{"source dtype not handled on CUDA"};
    from_ = x.dtype;
    n_ = x.numel();
  }
  void run(KernelContext& ctx) override {
    const TensorView& x = *ctx.input(0);
    TensorView& y = ctx.output(0);
    if (from_ == to_) {
      copy_async(y.data, x.data, x.nbytes(), stream_of(ctx));
      return;
    }
    dispatch_types(CastT{}, from_, [&]<typename From>() {
      dispatch_types(CastT{}, to_, [&]<typename To>() {
        launch_map(contiguous_map(n_, 1), ConvertOp<To>{}, stream_of(ctx), y.as<To>(),
                   x.as<From>());
      });
    });
  }

 private:
  DataType to_ = DataType::kUndefined, from_ = DataType::kUndefined;
  int64_t n_ = 0;
};

}  // namespace

void convert_floats(const void* in, DataType from, void* out, DataType to, int64_t n,
                    cudaStream_t s) {
  using Floats = Types<float, double, __half, __nv_bfloat16>;
  OT_CHECK(has_dtype(Floats{}, from) && has_dtype(Floats{}, to), "convert_floats: ",
           graph::dtype_short_name(from), " -> ", graph::dtype_short_name(to), " is not a float "
           "conversion");
  if (from == to) {
    copy_async(out, in, static_cast<size_t>(n) * elem_bytes(to), s);
    return;
  }
  dispatch_types(Floats{}, from, [&]<typename From>() {
    dispatch_types(Floats{}, to, [&]<typename To>() {
      launch_map(contiguous_map(n, 1), RoundOp<To>{}, s, static_cast<To*>(out),
                 static_cast<const From*>(in));
    });
  });
}

ONNXTRAIN_REGISTER_KERNEL(cast_cuda, "", "Cast", kCuda) {
  return std::make_unique<CastKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
