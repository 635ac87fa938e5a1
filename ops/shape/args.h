// One view of a node's arguments for shape rules that serve both type inference (constant
// inputs only, dims may be symbolic) and kernels (actual inputs, concrete dims), so each op's
// output-shape logic is written once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ops/op_api.h"

namespace onnxtrain::ops::shape {

class ArgSource {
 public:
  virtual ~ArgSource() = default;
  virtual const graph::Node& node() const = 0;
  virtual int64_t opset() const = 0;
  std::string where() const { return node().describe(); }
  // Whether optional input i is given.
  virtual bool present(size_t i) const = 0;
  // Values of the int32/int64 input i: always in a kernel, only for constants in inference.
  virtual std::optional<std::vector<int64_t>> ints(size_t i) const = 0;
  // Elements of the int input i as dims where ints(i) cannot tell: in inference, the
  // propagated dim value (InferenceContext::input_dim_values: known entries and symbols).
  virtual std::optional<graph::Shape> dims(size_t) const { return std::nullopt; }
  // Number of elements of the 1-D input i when its type tells (inference) or always (kernel).
  virtual std::optional<int64_t> static_length(size_t i) const = 0;
  // Shape of input i; nullopt when absent or the rank is unknown.
  virtual std::optional<graph::Shape> shape_of(size_t i) const = 0;
};

class InferArgs : public ArgSource {
 public:
  explicit InferArgs(const InferenceContext& ctx) : ctx_(ctx) {}
  const graph::Node& node() const override { return ctx_.node; }
  int64_t opset() const override { return ctx_.onnx_opset(); }
  bool present(size_t i) const override { return ctx_.input_type(i) != nullptr; }
  std::optional<std::vector<int64_t>> ints(size_t i) const override;
  std::optional<int64_t> static_length(size_t i) const override;
  std::optional<graph::Shape> shape_of(size_t i) const override;
  std::optional<graph::Shape> dims(size_t i) const override;

 private:
  const InferenceContext& ctx_;
};

class KernelArgs : public ArgSource {
 public:
  explicit KernelArgs(const KernelContext& ctx) : ctx_(ctx) {}
  const graph::Node& node() const override { return ctx_.node(); }
  int64_t opset() const override { return ctx_.opset(); }
  bool present(size_t i) const override { return ctx_.input(static_cast<int>(i)) != nullptr; }
  std::optional<std::vector<int64_t>> ints(size_t i) const override;
  std::optional<int64_t> static_length(size_t i) const override;
  std::optional<graph::Shape> shape_of(size_t i) const override;

 private:
  const KernelContext& ctx_;
};

// Output 0 of ops that map input 0's shape to a new one from the node's arguments (Reshape,
// Squeeze, Expand, Tile, Pad, ...): one rule serves inference and kernels.
using ShapeRule = std::optional<graph::Shape> (*)(const std::optional<graph::Shape>& in,
                                                  const ArgSource& args);
// Inference: output 0 = input 0's dtype with rule(input 0's shape); folds small constant results.
InferFn infer_by_rule(ShapeRule rule);
// Inference: output 0 has input 0's type (Trilu, ScatterND, ...); folds small constant results.
void infer_like_input(InferenceContext& ctx);
// In a kernel: the rule on the actual input 0 as concrete dims, checked against the tensor cap.
std::vector<int64_t> dims_by_rule(ShapeRule rule, const KernelContext& ctx);

// Registration plumbing shared by the family's files.
template <class K>
KernelFactory factory_of() {
  return [](const graph::Node&) { return std::make_unique<K>(); };
}
inline OpSchema make_op(const char* op_type, InferFn infer, KernelFactory cpu) {
  OpSchema s;
  s.op_type = op_type;
  s.infer = std::move(infer);
  s.cpu_kernel = std::move(cpu);
  return s;
}

}  // namespace onnxtrain::ops::shape
