// CUDA Cast: the CPU's conversion rules (ops/elementwise/cast.cc) over one contiguous map.
#include <limits>
#include <type_traits>

#include "ops/cuda/eltwise_util.cuh"

namespace onnxtrain::ops::cuda {
namespace {

// The CPU's convert<To>(From): NaN -> 0 and saturation for float -> integer, != 0 for -> bool.
template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
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

using CastT = Types<float, double, int8_t, int16_t, int32_t, int64_t, uint8_t, bool>;

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

ONNXTRAIN_REGISTER_KERNEL(cast_cuda, "", "Cast", kCuda) {
  return std::make_unique<CastKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
