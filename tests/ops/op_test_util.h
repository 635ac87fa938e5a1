// Shared by the op tests: tensor builders, a one-node model runner through InferenceSession,
// and value extraction. Each family's test keeps its own thin wrapper for its call style.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "graph/tensor.h"
#include "runtime/session.h"

namespace onnxtrain::optest {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;

template <typename T>
Tensor make(DataType dt, std::vector<int64_t> dims, const std::vector<T>& v) {
  return Tensor::from_vector(dt, std::move(dims), v);
}
inline Tensor f32(std::vector<int64_t> dims, const std::vector<float>& v) {
  return make(DataType::kFloat, std::move(dims), v);
}
inline Tensor f64(std::vector<int64_t> dims, const std::vector<double>& v) {
  return make(DataType::kDouble, std::move(dims), v);
}
inline Tensor i64(std::vector<int64_t> dims, const std::vector<int64_t>& v) {
  return make(DataType::kInt64, std::move(dims), v);
}
inline Tensor i32(std::vector<int64_t> dims, const std::vector<int32_t>& v) {
  return make(DataType::kInt32, std::move(dims), v);
}
inline Tensor i8(std::vector<int64_t> dims, const std::vector<int8_t>& v) {
  return make(DataType::kInt8, std::move(dims), v);
}
inline Tensor boolean(std::vector<int64_t> dims, const std::vector<uint8_t>& v) {
  return make(DataType::kBool, std::move(dims), v);
}

// One input slot of a one-node model.
struct NodeInput {
  std::optional<Tensor> value;  // nullopt: omitted optional input
  bool constant = false;        // an initializer (constant at plan time) instead of a feed
};

struct NodeCall {
  std::string op;
  std::vector<NodeInput> inputs;
  std::vector<Attribute> attrs;
  int outputs = 1;
  int64_t opset = 17;
  std::string domain;  // imported at version 1 when set
  int threads = 2;
  // Output o may be written over input in_place[o]'s buffer (SessionOptions::output_aliases),
  // as the optimizer's state updates are; NodeResult::inputs then holds the updated inputs.
  std::vector<int> in_place;
};

struct NodeResult {
  std::vector<Tensor> outputs;
  runtime::PlanStats stats;
  std::map<std::string, Tensor> inputs;  // the fed inputs after the run (each its own buffer)
};

// Inputs are named x0, x1, ...; outputs y0, y1, ...; the node is "n0".
inline NodeResult run_node(const NodeCall& c) {
  auto model = std::make_unique<graph::Model>();
  model->set_opset("", c.opset);
  if (!c.domain.empty()) model->set_opset(c.domain, 1);
  graph::Graph& g = *model->graph;
  std::vector<graph::Value*> ins;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].value) {
      ins.push_back(nullptr);
      continue;
    }
    const std::string name = cat("x", i);
    const Tensor& t = *c.inputs[i].value;
    if (c.inputs[i].constant) {
      ins.push_back(g.add_initializer(name, t));
      continue;
    }
    ins.push_back(g.add_input(name, graph::ValueType::tensor(t.dtype(), graph::make_shape(t.dims()))));
    feeds[name] = t;
    feeds[name].mutable_data();  // its own buffer: an in-place run writes into it
  }
  std::vector<std::string> outs;
  for (int i = 0; i < c.outputs; ++i) outs.push_back(cat("y", i));
  graph::Node* n = g.add_node(c.op, ins, outs, "n0", c.domain);
  for (const Attribute& a : c.attrs) n->set_attr(a);
  for (graph::Value* v : n->outputs()) g.add_output(v);
  runtime::SessionOptions opts;
  opts.threads = c.threads;
  for (size_t o = 0; o < c.in_place.size(); ++o)
    opts.output_aliases[cat("y", o)] = cat("x", c.in_place[o]);
  runtime::InferenceSession session(std::move(model), opts);
  NodeResult r{session.run(feeds), session.last_plan_stats(), {}};
  r.inputs = std::move(feeds);
  EXPECT_EQ(r.outputs.size(), static_cast<size_t>(c.outputs));
  return r;
}

// Raw element copy (T must match the dtype's storage).
template <typename T>
std::vector<T> values(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data(), v.size() * sizeof(T));
  return v;
}

// Any numeric tensor as doubles, for tolerance comparisons against float64 references.
inline std::vector<double> values_of(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t.dtype()) {
      case DataType::kFloat: v[i] = t.data_as<float>()[i]; break;
      case DataType::kDouble: v[i] = t.data_as<double>()[i]; break;
      case DataType::kInt64: v[i] = static_cast<double>(t.data_as<int64_t>()[i]); break;
      case DataType::kInt32: v[i] = t.data_as<int32_t>()[i]; break;
      case DataType::kInt8: v[i] = t.data_as<int8_t>()[i]; break;
      case DataType::kUInt8:
      case DataType::kBool: v[i] = t.data_as<uint8_t>()[i]; break;
      default:
        ADD_FAILURE() << "values_of: unexpected dtype " << graph::dtype_short_name(t.dtype());
        return v;
    }
  }
  return v;
}

}  // namespace onnxtrain::optest
