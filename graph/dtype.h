// Element types. The numeric values are ONNX TensorProto.DataType so they convert 1:1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace onnxtrain::graph {

enum class DataType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUInt4 = 21,
  kInt4 = 22,
};

// True for every value above, except kUndefined.
bool is_known_dtype(int32_t onnx_value);
// Short name used by the printer: f32, i64, bool, ...
std::string_view dtype_short_name(DataType t);
// ONNX spelling: FLOAT, INT64, ...
std::string_view dtype_onnx_name(DataType t);
std::optional<DataType> dtype_from_short_name(std::string_view name);
// Bits per element (4 for the packed int4 types, 0 for string/undefined).
int dtype_bits(DataType t);
bool is_float_dtype(DataType t);  // f16/bf16/f32/f64/f8*
// Bytes for `count` packed elements; nullopt on overflow. Not meaningful for strings.
std::optional<int64_t> dtype_storage_bytes(DataType t, int64_t count);

}  // namespace onnxtrain::graph
