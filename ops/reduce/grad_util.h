// Small emitters shared by the gradient rules of the reduce, loss and shape families: int64
// constants, Shape/Cast/zeros, and opset-aware axes arguments (attribute before 13, input after).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/op_api.h"

namespace onnxtrain::ops::grad {

using graph::Value;

inline Value* i64_const(GradientBuilder& b, std::vector<int64_t> v, const std::string& hint) {
  const auto n = static_cast<int64_t>(v.size());
  return b.constant(graph::Tensor::from_vector(DataType::kInt64, {n}, v), hint);
}

inline Value* i64_scalar(GradientBuilder& b, int64_t v, const std::string& hint) {
  return b.constant(graph::Tensor::from_vector(DataType::kInt64, {}, std::vector<int64_t>{v}),
                    hint);
}

inline Value* shape_of(GradientBuilder& b, Value* v) {
  return b.emit1("Shape", {v});
}

// The element type of a forward value; rules that build typed constants need it.
inline DataType dtype_of(const GradientBuilder& b, const Value* v) {
  OT_CHECK(v && v->dtype() != DataType::kUndefined, b.node().describe(),
           ": gradient needs the element type of '", v ? v->name() : "", "' (run infer_shapes)");
  return v->dtype();
}

inline Value* cast_to(GradientBuilder& b, Value* v, DataType to) {
  return b.emit1("Cast", {v}, {graph::Attribute::make_int("to", static_cast<int64_t>(to))});
}

// Zeros of `like`'s run-time shape and type.
inline Value* zeros_like(GradientBuilder& b, Value* like) {
  const DataType t = dtype_of(b, like);
  graph::Tensor zero = t == DataType::kDouble
                           ? graph::Tensor::from_vector(t, {1}, std::vector<double>{0.0})
                           : graph::Tensor::from_vector(DataType::kFloat, {1},
                                                        std::vector<float>{0.0f});
  Value* z = b.emit1("ConstantOfShape", {shape_of(b, like)},
                     {graph::Attribute::make_tensor("value", std::move(zero))});
  return t == DataType::kDouble || t == DataType::kFloat ? z : cast_to(b, z, t);
}

// Unsqueeze(v, axes): axes as an input from opset 13, as an attribute before.
inline Value* unsqueeze(GradientBuilder& b, Value* v, const std::vector<int64_t>& axes) {
  if (b.opset() >= 13) return b.emit1("Unsqueeze", {v, i64_const(b, axes, "axes")});
  return b.emit1("Unsqueeze", {v}, {graph::Attribute::make_ints("axes", axes)});
}

// Reshape(v, Shape(like)): the gradient of every op that only relabels the shape.
inline Value* reshape_like(GradientBuilder& b, Value* v, Value* like) {
  return b.emit1("Reshape", {v, shape_of(b, like)});
}

}  // namespace onnxtrain::ops::grad
