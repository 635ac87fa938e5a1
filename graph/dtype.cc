// Element type table: one row per ONNX data type.
#include "graph/dtype.h"

#include <array>

namespace onnxtrain::graph {
namespace {

struct DTypeInfo {
  DataType type;
  std::string_view short_name;
  std::string_view onnx_name;
  int bits;
  bool is_float;
};

constexpr std::array<DTypeInfo, 23> kInfo = {{
    {DataType::kUndefined, "undef", "UNDEFINED", 0, false},
    {DataType::kFloat, "f32", "FLOAT", 32, true},
    {DataType::kUInt8, "u8", "UINT8", 8, false},
    {DataType::kInt8, "i8", "INT8", 8, false},
    {DataType::kUInt16, "u16", "UINT16", 16, false},
    {DataType::kInt16, "i16", "INT16", 16, false},
    {DataType::kInt32, "i32", "INT32", 32, false},
    {DataType::kInt64, "i64", "INT64", 64, false},
    {DataType::kString, "str", "STRING", 0, false},
    {DataType::kBool, "bool", "BOOL", 8, false},
    {DataType::kFloat16, "f16", "FLOAT16", 16, true},
    {DataType::kDouble, "f64", "DOUBLE", 64, true},
    {DataType::kUInt32, "u32", "UINT32", 32, false},
    {DataType::kUInt64, "u64", "UINT64", 64, false},
    {DataType::kComplex64, "c64", "COMPLEX64", 64, false},
    {DataType::kComplex128, "c128", "COMPLEX128", 128, false},
    {DataType::kBFloat16, "bf16", "BFLOAT16", 16, true},
    {DataType::kFloat8E4M3FN, "f8e4m3fn", "FLOAT8E4M3FN", 8, true},
    {DataType::kFloat8E4M3FNUZ, "f8e4m3fnuz", "FLOAT8E4M3FNUZ", 8, true},
    {DataType::kFloat8E5M2, "f8e5m2", "FLOAT8E5M2", 8, true},
    {DataType::kFloat8E5M2FNUZ, "f8e5m2fnuz", "FLOAT8E5M2FNUZ", 8, true},
    {DataType::kUInt4, "u4", "UINT4", 4, false},
    {DataType::kInt4, "i4", "INT4", 4, false},
}};

const DTypeInfo& info(DataType t) {
  auto i = static_cast<size_t>(t);
  return i < kInfo.size() ? kInfo[i] : kInfo[0];
}

}  // namespace

bool is_known_dtype(int32_t v) { return v > 0 && v < static_cast<int32_t>(kInfo.size()); }
std::string_view dtype_short_name(DataType t) { return info(t).short_name; }
std::string_view dtype_onnx_name(DataType t) { return info(t).onnx_name; }
int dtype_bits(DataType t) { return info(t).bits; }
bool is_float_dtype(DataType t) { return info(t).is_float; }

std::optional<DataType> dtype_from_short_name(std::string_view name) {
  for (const auto& row : kInfo)
    if (row.short_name == name) return row.type;
  return std::nullopt;
}

std::optional<int64_t> dtype_storage_bytes(DataType t, int64_t count) {
  if (count < 0) return std::nullopt;
  int bits = dtype_bits(t);
  if (bits == 4) return count / 2 + count % 2;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(count, static_cast<int64_t>(bits / 8), &bytes)) return std::nullopt;
  return bytes;
}

}  // namespace onnxtrain::graph
