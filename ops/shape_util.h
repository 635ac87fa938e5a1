// Helpers for type/shape inference and attribute handling shared by every op family.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ops/op_api.h"

namespace onnxtrain::ops {

using graph::Dim;
using graph::Shape;
using graph::ValueType;

// The input's type; throws "<node>: input i is missing" when absent or not a tensor.
const ValueType& tensor_input(const InferenceContext& ctx, size_t i);
// Concrete dims if every dim is known.
std::optional<std::vector<int64_t>> known_dims(const ValueType& t);
std::optional<std::vector<int64_t>> known_dims(const std::optional<Shape>& s);
// Sets output i to a tensor type.
void set_output(InferenceContext& ctx, size_t i, DataType dtype, std::optional<Shape> shape);
// Output i = type of input j (unary elementwise ops).
void propagate_type(InferenceContext& ctx, size_t out = 0, size_t in = 0);
// numpy broadcasting of two shapes; throws naming the node on incompatible known dims.
std::optional<Shape> broadcast_shapes(const std::optional<Shape>& a, const std::optional<Shape>& b,
                                      const std::string& where);
std::vector<int64_t> broadcast_dims(std::span<const int64_t> a, std::span<const int64_t> b,
                                    const std::string& where);
// Axis in [-rank, rank) -> [0, rank); throws naming the node otherwise.
int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& where);
// Values of an int32/int64 tensor (shape, axes, pads inputs).
std::vector<int64_t> to_int64s(const graph::Tensor& t, const std::string& where);
// Shape from concrete dims.
Shape to_shape(std::span<const int64_t> dims);
// Element count; throws when dims are not all known.
int64_t numel(std::span<const int64_t> dims);

}  // namespace onnxtrain::ops
