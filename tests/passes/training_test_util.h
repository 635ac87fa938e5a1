// Shared by the training-pass tests: seeded random tensors, running a model through
// InferenceSession with outputs by name, and asserting on error messages.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "graph/tensor.h"
#include "runtime/session.h"

namespace onnxtrain::passtest {

using graph::DataType;
using graph::Tensor;

inline std::vector<float> normal_floats(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<int64_t> random_labels(size_t n, int64_t classes, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, classes - 1);
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = dist(gen);
  return v;
}

inline int64_t numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

inline Tensor f32(std::vector<int64_t> dims, const std::vector<float>& v) {
  return Tensor::from_vector(DataType::kFloat, std::move(dims), v);
}
inline Tensor i64(std::vector<int64_t> dims, const std::vector<int64_t>& v) {
  return Tensor::from_vector(DataType::kInt64, std::move(dims), v);
}
inline Tensor scalar_f32(float v) {
  return Tensor::from_vector(DataType::kFloat, {}, std::vector<float>{v});
}

// Any float tensor as doubles.
inline std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype() == DataType::kDouble)
      v[i] = t.data_as<double>()[i];
    else if (t.dtype() == DataType::kFloat)
      v[i] = t.data_as<float>()[i];
    else
      ADD_FAILURE() << "as_doubles: dtype " << graph::dtype_short_name(t.dtype());
  }
  return v;
}

// Hand-built graphs: a model importing ai.onnx `opset`, inputs, Constant nodes, one-output nodes.
inline std::unique_ptr<graph::Model> new_model(int64_t opset = 17) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", opset);
  return m;
}
inline graph::Value* input(graph::Graph& g, const std::string& name, std::vector<int64_t> dims,
                           DataType dt = DataType::kFloat) {
  return g.add_input(name, graph::ValueType::tensor(dt, graph::make_shape(dims)));
}
inline graph::Value* constant(graph::Graph& g, const std::string& name, Tensor t) {
  graph::Node* c = g.add_node("Constant", {}, {name}, name);
  c->set_attr(graph::Attribute::make_tensor("value", std::move(t)));
  return c->output(0);
}
inline graph::Value* node1(graph::Graph& g, const std::string& op,
                           const std::vector<graph::Value*>& in, const std::string& out,
                           std::vector<graph::Attribute> attrs = {}) {
  graph::Node* n = g.add_node(op, in, {out}, out);
  for (auto& a : attrs) n->set_attr(std::move(a));
  return n->output(0);
}
inline graph::Attribute attr(const std::string& name, int64_t v) {
  return graph::Attribute::make_int(name, v);
}

// Runs a copy of `m` once; outputs by name.
inline std::map<std::string, Tensor> run(const graph::Model& m,
                                         const std::map<std::string, Tensor>& feeds) {
  runtime::SessionOptions opts;
  opts.threads = 2;
  runtime::InferenceSession session(m.clone(), opts);
  std::vector<Tensor> outs = session.run(feeds);
  std::map<std::string, Tensor> by_name;
  const auto& names = m.graph->outputs();
  EXPECT_EQ(outs.size(), names.size());
  for (size_t i = 0; i < outs.size() && i < names.size(); ++i) by_name[names[i]->name()] = outs[i];
  return by_name;
}

// `grad`, an analytic gradient of `forward`'s scalar float64 output `loss` with respect to its
// float64 input `x` at `value`, against central differences (step 1e-6) element by element.
inline void expect_matches_finite_differences(const graph::Model& forward, const std::string& loss,
                                              const std::string& x, const Tensor& value,
                                              const Tensor& grad, double tol = 1e-6) {
  ASSERT_EQ(grad.dims(), value.dims());
  const double eps = 1e-6;
  auto loss_at = [&](size_t i, double delta) {
    Tensor v = Tensor::from_vector(DataType::kDouble, value.dims(), as_doubles(value));
    v.mutable_data_as<double>()[i] += delta;
    return run(forward, {{x, v}})[loss].data_as<double>()[0];
  };
  for (size_t i = 0; i < static_cast<size_t>(value.numel()); ++i) {
    const double fd = (loss_at(i, eps) - loss_at(i, -eps)) / (2 * eps);
    EXPECT_NEAR(grad.data_as<double>()[i], fd, tol) << x << " element " << i;
  }
}

// The call throws onnxtrain::Error whose message contains `part`.
inline void expect_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << part;
    return;
  }
  ADD_FAILURE() << "no error; expected one containing: " << part;
}

inline std::vector<std::string> output_names(const graph::Graph& g) {
  std::vector<std::string> out;
  for (const graph::Value* v : g.outputs()) out.push_back(v->name());
  return out;
}

inline std::vector<std::string> input_names(const graph::Graph& g) {
  std::vector<std::string> out;
  for (const graph::Value* v : g.inputs()) out.push_back(v->name());
  return out;
}

}  // namespace onnxtrain::passtest
