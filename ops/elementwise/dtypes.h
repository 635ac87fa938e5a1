// Element types of the elementwise family as C++ types (incl. float16 / bfloat16 storage types)
// and the one place that maps a runtime DataType onto a compile-time type list.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "graph/bfloat16.h"
#include "graph/dtype.h"
#include "graph/error.h"

namespace onnxtrain::ops::ew {

using graph::DataType;

// IEEE binary16, stored as bits; arithmetic goes through float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a builtin float type
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// bfloat16: the upper 16 bits of a float32. Arithmetic rounds to nearest even, as oneDNN,
// torch and ONNX Runtime do (a truncated sum drifts toward zero: bf16 activations and gradients
// under mixed precision go through Add and Sum); Cast truncates (`truncated`), as the ONNX
// reference and its backend tests do.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT
  operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

  static uint16_t from_float(float f) { return graph::bf16_from_float(f); }
  static BFloat16 truncated(float f) {
    auto upper = static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
    BFloat16 r;
    r.bits = std::isnan(f) ? static_cast<uint16_t>(upper | 0x40) : upper;  // NaN stays NaN
    return r;
  }
};

inline uint16_t Half::from_float(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00);  // NaN / inf
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds past the largest half: inf
  if (abs < 0x38800000) {                       // half subnormal or zero
    // Scale so the half subnormal unit (2^-24) becomes 1.0 and let float rounding (nearest
    // even) do the work.
    float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t mant_round = ((abs >> 13) & 1) + 0xfff;  // round to nearest even on bit 13
  abs += mant_round;
  return sign | static_cast<uint16_t>((abs - 0x38000000) >> 13);
}

inline float Half::to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero / subnormal: mant * 2^-24
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000 | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

template <typename T>
struct DTypeOf;
#define OT_EW_DTYPE(T, D)                          \
  template <>                                      \
  struct DTypeOf<T> {                              \
    static constexpr DataType value = DataType::D; \
  }
OT_EW_DTYPE(float, kFloat);
OT_EW_DTYPE(double, kDouble);
OT_EW_DTYPE(Half, kFloat16);
OT_EW_DTYPE(BFloat16, kBFloat16);
OT_EW_DTYPE(int8_t, kInt8);
OT_EW_DTYPE(int16_t, kInt16);
OT_EW_DTYPE(int32_t, kInt32);
OT_EW_DTYPE(int64_t, kInt64);
OT_EW_DTYPE(uint8_t, kUInt8);
OT_EW_DTYPE(uint16_t, kUInt16);
OT_EW_DTYPE(uint32_t, kUInt32);
OT_EW_DTYPE(uint64_t, kUInt64);
OT_EW_DTYPE(bool, kBool);
#undef OT_EW_DTYPE

template <typename T>
inline constexpr DataType dtype_of = DTypeOf<T>::value;

// True for float, double, Half, BFloat16.
template <typename T>
inline constexpr bool is_floating =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The type arithmetic on T happens in: float for the 16-bit float types, T otherwise.
template <typename T>
using compute_t =
    std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

template <typename T>
bool is_nan(T v) {
  if constexpr (is_floating<T>)
    return std::isnan(static_cast<compute_t<T>>(v));
  else
    return false;
}

// v < 0 without the always-false comparison warning for unsigned types.
template <typename T>
bool is_negative(T v) {
  if constexpr (std::is_unsigned_v<T>)
    return false;
  else
    return v < 0;
}

template <typename... T>
struct TypeList {};

template <typename... A, typename... B>
constexpr TypeList<A..., B...> operator+(TypeList<A...>, TypeList<B...>) {
  return {};
}

template <typename T>
struct Tag {
  using type = T;
};

using FloatTypes = TypeList<float, double>;
using HalfTypes = TypeList<Half>;
using SignedIntTypes = TypeList<int8_t, int16_t, int32_t, int64_t>;
using UnsignedIntTypes = TypeList<uint8_t, uint16_t, uint32_t, uint64_t>;
using IntTypes = decltype(SignedIntTypes{} + UnsignedIntTypes{});
using SignedTypes = decltype(FloatTypes{} + SignedIntTypes{});
using NumericTypes = decltype(FloatTypes{} + IntTypes{});
using NumericHalfTypes = decltype(NumericTypes{} + HalfTypes{});
using BoolTypes = TypeList<bool>;
using AllTypes = decltype(NumericHalfTypes{} + TypeList<BFloat16, bool>{});

// Calls g(Tag<T>{}) for the T in `list` whose dtype is `dt`; throws naming the node otherwise.
template <typename... T, typename G>
void dispatch(TypeList<T...>, DataType dt, const std::string& where, G&& g) {
  bool found = ((dt == dtype_of<T> ? (g(Tag<T>{}), true) : false) || ...);
  if (!found) fail(where, ": dtype ", graph::dtype_short_name(dt), " is not supported");
}

template <typename... T>
constexpr bool contains(TypeList<T...>, DataType dt) {
  return ((dt == dtype_of<T>) || ...);
}

// Value conversion used by Cast and scalar reads: NaN -> 0 and saturation for float -> integer
// (a plain static_cast is undefined there), != 0 for -> bool.
template <typename To, typename From>
To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != 0;
  } else if constexpr (is_floating<From> && std::is_integral_v<To>) {
    double d = static_cast<double>(static_cast<compute_t<From>>(v));
    if (std::isnan(d)) return To{0};
    if (d <= static_cast<double>(std::numeric_limits<To>::lowest()))
      return std::numeric_limits<To>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<To>::max()))
      return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else {
    return static_cast<To>(static_cast<compute_t<To>>(static_cast<compute_t<From>>(v)));
  }
}

}  // namespace onnxtrain::ops::ew
