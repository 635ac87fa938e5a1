// A GradientBuilder for one forward node, without the autodiff pass: a rule's backward nodes go
// into the forward node's own graph and its input gradients are collected, so op tests can run
// a single gradient rule through the runtime. Shared by the grad-rule op tests.
#pragma once

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "graph/tensor.h"
#include "ops/op_api.h"

namespace onnxtrain::optest {

class OneNodeBuilder final : public ops::GradientBuilder {
 public:
  // dy: the gradient of output 0 (the only output a gradient reaches).
  OneNodeBuilder(graph::Graph& g, graph::Node& n, int64_t opset, graph::Value* dy)
      : g_(g), n_(n), opset_(opset), dy_(dy) {}
  const graph::Node& node() const override { return n_; }
  int64_t opset() const override { return opset_; }
  graph::Value* output_grad(int i) const override { return i == 0 ? dy_ : nullptr; }
  // Every float input (f64, f32, and bf16/f16 for mixed precision) unless listed in `no_grad`.
  bool needs_input_grad(int i) const override {
    graph::Value* v = input(i);
    if (!v || no_grad.count(i)) return false;
    const graph::DataType t = v->dtype();
    return t == graph::DataType::kDouble || t == graph::DataType::kFloat ||
           t == graph::DataType::kBFloat16 || t == graph::DataType::kFloat16;
  }
  void set_input_grad(int i, graph::Value* grad) override {
    if (needs_input_grad(i)) grads[i] = grad;
  }
  std::vector<graph::Value*> emit(const std::string& op_type,
                                  const std::vector<graph::Value*>& inputs, int num_outputs,
                                  std::vector<graph::Attribute> attributes,
                                  const std::string& domain) override {
    const int id = counter_++;
    std::vector<std::string> outs;
    for (int k = 0; k < num_outputs; ++k) outs.push_back(cat("bw", id, "_", k));
    graph::Node* node = g_.add_node(op_type, inputs, outs, cat("bw", id), domain);
    for (graph::Attribute& a : attributes) node->set_attr(std::move(a));
    emitted.push_back(node);
    return node->outputs();
  }
  graph::Value* constant(graph::Tensor value, const std::string& name_hint) override {
    return g_.add_initializer(cat("c", counter_++, "_", name_hint), std::move(value));
  }

  std::set<int> no_grad;               // inputs the test pretends need no gradient
  std::map<int, graph::Value*> grads;  // input index -> its gradient
  std::vector<graph::Node*> emitted;   // backward nodes, in emission order

 private:
  graph::Graph& g_;
  graph::Node& n_;
  int64_t opset_;
  graph::Value* dy_;
  int counter_ = 0;
};

// Uniform float64 tensor in [lo, hi), deterministic per seed.
inline graph::Tensor rnd(std::vector<int64_t> dims, uint64_t seed, double lo = -1, double hi = 1) {
  graph::Tensor t(graph::DataType::kDouble, std::move(dims));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.mutable_data_as<double>()[i] = u(gen);
  return t;
}

}  // namespace onnxtrain::optest
