// GraphBuilder implementation: layer helpers, PyTorch-default init from a portable PRNG, and
// the shape arithmetic that keeps every value's type filled in.
#include "models/builder.h"

#include <algorithm>
#include <cmath>

#include "graph/error.h"
#include "graph/verifier.h"

namespace onnxtrain::models {

using graph::DataType;
using graph::Dim;
using graph::Node;
using graph::Shape;
using graph::Tensor;
using graph::Value;
using graph::ValueType;

namespace {

constexpr const char* kBatchDim = "N";

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

Shape batched_shape(std::span<const int64_t> dims) {
  Shape s;
  s.push_back(Dim::symbol(kBatchDim));
  for (size_t i = 1; i < dims.size(); ++i) s.push_back(Dim::known(dims[i]));
  return s;
}

std::string join_dims(std::span<const int64_t> dims) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) out += cat(i ? "x" : "", dims[i]);
  return out;
}

}  // namespace

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double SplitMix64::next_symmetric() {
  // k in [0, 2^24): (2k + 1 - 2^24) / 2^24 is an odd multiple of 2^-24 in (-1, 1). Integer and
  // power-of-two arithmetic only, so it is exact everywhere.
  const int64_t k = static_cast<int64_t>(next() >> 40);
  return static_cast<double>(2 * k + 1 - (int64_t{1} << 24)) / static_cast<double>(1 << 24);
}

uint64_t parameter_stream_seed(uint64_t seed, std::string_view tensor_name) {
  // The seed is scrambled before the name hash joins it, so two (seed, name) pairs cannot meet
  // by a plain xor coincidence such as seed = hash(a) ^ hash(b).
  SplitMix64 mix(SplitMix64(seed).next() ^ fnv1a64(tensor_name));
  return mix.next();
}

void fill_uniform(std::span<float> out, double bound, uint64_t stream_seed) {
  SplitMix64 rng(stream_seed);
  // One correctly rounded multiply then one rounding to float: no operation a compiler could
  // contract or reorder, hence identical bytes on every platform. Rounding is monotonic, so
  // |r * bound| < bound implies |float| <= float(bound).
  for (float& w : out) w = static_cast<float>(rng.next_symmetric() * bound);
}

GraphBuilder::GraphBuilder(std::string model_name, uint64_t seed)
    : model_name_(std::move(model_name)), seed_(seed), model_(std::make_unique<graph::Model>()) {
  model_->ir_version = 8;
  model_->set_opset("", 17);
  model_->graph->name = model_name_;
}

std::vector<int64_t> GraphBuilder::dims_of(const Value* v) {
  std::vector<int64_t> dims;
  if (!v->shape()) return dims;
  for (const Dim& d : *v->shape()) dims.push_back(d.is_known() ? d.value : -1);
  return dims;
}

Value* GraphBuilder::input(const std::string& name, std::span<const int64_t> dims) {
  std::vector<int64_t> full{-1};
  for (int64_t d : dims) {
    OT_CHECK(d > 0, model_name_, ": input dimensions must be positive, got ", join_dims(dims));
    full.push_back(d);
  }
  // The element count of one example must fit int64 for Flatten and the weights sized by it.
  graph::checked_element_count(dims, cat(model_name_, ": input ", join_dims(dims)));
  return graph().add_input(name, ValueType::tensor(DataType::kFloat, batched_shape(full)));
}

void GraphBuilder::reserve_parameter_bytes(const std::string& name, std::span<const int64_t> dims) {
  const int64_t n = graph::checked_element_count(dims, cat(model_name_, ": '", name, "'"));
  const int64_t limit = kMaxParameterBytes;
  OT_CHECK(n <= (limit - parameter_bytes_) / 4, model_name_, ": parameter '", name, "' (",
           join_dims(dims), ") takes the model over ", limit >> 20,
           " MiB of weights, more than an .onnx file can hold");
  parameter_bytes_ += n * 4;
}

Value* GraphBuilder::add_parameter(const std::string& name, Tensor t) {
  return graph().add_initializer(name, std::move(t));
}

Value* GraphBuilder::kaiming_parameter(const std::string& name, std::vector<int64_t> dims,
                                       int64_t fan_in) {
  reserve_parameter_bytes(name, dims);
  Tensor t(DataType::kFloat, std::move(dims));
  // PyTorch's reset_parameters: kaiming_uniform_(a=sqrt(5)) gives bound
  // sqrt(6 / ((1 + 5) * fan_in)) = 1/sqrt(fan_in); the bias uses the same bound.
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  fill_uniform(std::span<float>(t.mutable_data_as<float>(), static_cast<size_t>(t.numel())), bound,
               parameter_stream_seed(seed_, name));
  return add_parameter(name, std::move(t));
}

Value* GraphBuilder::constant_parameter(const std::string& name, std::vector<int64_t> dims,
                                        float value) {
  reserve_parameter_bytes(name, dims);
  Tensor t(DataType::kFloat, std::move(dims));
  float* p = t.mutable_data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
  return add_parameter(name, std::move(t));
}

Node* GraphBuilder::add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                             const std::string& name, std::span<const int64_t> out_dims) {
  Node* n = graph().add_node(op_type, inputs, {name}, name);
  n->output(0)->type = ValueType::tensor(DataType::kFloat, batched_shape(out_dims));
  return n;
}

std::vector<int64_t> GraphBuilder::expect_rank(const Value* x, size_t rank,
                                               const std::string& layer) const {
  std::vector<int64_t> d = dims_of(x);
  OT_CHECK(d.size() == rank, model_name_, ": layer '", layer, "' needs a rank-", rank,
           " input, got rank ", d.size());
  return d;
}

int64_t GraphBuilder::window_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                                         const std::string& layer, const char* axis) const {
  // ONNX's output-size rule needs the padded input to hold one window; with pad < kernel (true
  // for every layer here) each window then also overlaps real data.
  OT_CHECK(in + 2 * pad >= kernel, model_name_, ": input too small: layer '", layer, "' gets ",
           axis, " ", in, " for a ", kernel, "-wide window (padding ", pad, ")");
  return (in + 2 * pad - kernel) / stride + 1;
}

Value* GraphBuilder::conv(Value* x, const std::string& module, const ConvSpec& spec) {
  std::vector<int64_t> d = expect_rank(x, 4, module);
  const int64_t in_ch = d[1];
  const int64_t h = window_output_size(d[2], spec.kernel, spec.stride, spec.pad, module, "height");
  const int64_t w = window_output_size(d[3], spec.kernel, spec.stride, spec.pad, module, "width");
  Value* weight =
      kaiming_parameter(module + ".weight", {spec.out_channels, in_ch, spec.kernel, spec.kernel},
                        in_ch * spec.kernel * spec.kernel);
  std::vector<Value*> inputs{x, weight};
  if (spec.bias)
    inputs.push_back(kaiming_parameter(module + ".bias", {spec.out_channels},
                                       in_ch * spec.kernel * spec.kernel));
  const std::vector<int64_t> out{-1, spec.out_channels, h, w};
  Node* n = add_node("Conv", inputs, module, out);
  n->set_attr(graph::Attribute::make_ints("dilations", {1, 1}));
  n->set_attr(graph::Attribute::make_int("group", 1));
  n->set_attr(graph::Attribute::make_ints("kernel_shape", {spec.kernel, spec.kernel}));
  n->set_attr(graph::Attribute::make_ints("pads", {spec.pad, spec.pad, spec.pad, spec.pad}));
  n->set_attr(graph::Attribute::make_ints("strides", {spec.stride, spec.stride}));
  return n->output(0);
}

Value* GraphBuilder::batch_norm(Value* x, const std::string& module) {
  std::vector<int64_t> d = expect_rank(x, 4, module);
  const int64_t c = d[1];
  Value* scale = constant_parameter(module + ".weight", {c}, 1.0f);
  Value* bias = constant_parameter(module + ".bias", {c}, 0.0f);
  Value* mean = constant_parameter(module + ".running_mean", {c}, 0.0f);
  Value* var = constant_parameter(module + ".running_var", {c}, 1.0f);
  Node* n = add_node("BatchNormalization", {x, scale, bias, mean, var}, module, d);
  n->set_attr(graph::Attribute::make_float("epsilon", 1e-5f));
  n->set_attr(graph::Attribute::make_float("momentum", 0.9f));
  return n->output(0);
}

Value* GraphBuilder::relu(Value* x, const std::string& name) {
  return add_node("Relu", {x}, name, dims_of(x))->output(0);
}

Value* GraphBuilder::max_pool(Value* x, const std::string& name, int64_t kernel, int64_t stride,
                              int64_t pad) {
  std::vector<int64_t> d = expect_rank(x, 4, name);
  d[2] = window_output_size(d[2], kernel, stride, pad, name, "height");
  d[3] = window_output_size(d[3], kernel, stride, pad, name, "width");
  Node* n = add_node("MaxPool", {x}, name, d);
  n->set_attr(graph::Attribute::make_int("ceil_mode", 0));
  n->set_attr(graph::Attribute::make_ints("kernel_shape", {kernel, kernel}));
  n->set_attr(graph::Attribute::make_ints("pads", {pad, pad, pad, pad}));
  n->set_attr(graph::Attribute::make_ints("strides", {stride, stride}));
  return n->output(0);
}

Value* GraphBuilder::global_average_pool(Value* x, const std::string& name) {
  std::vector<int64_t> d = expect_rank(x, 4, name);
  d[2] = d[3] = 1;
  return add_node("GlobalAveragePool", {x}, name, d)->output(0);
}

Value* GraphBuilder::flatten(Value* x, const std::string& name) {
  std::vector<int64_t> d = dims_of(x);
  OT_CHECK(d.size() >= 2, model_name_, ": layer '", name, "' needs a rank >= 2 input");
  const std::vector<int64_t> features(d.begin() + 1, d.end());
  const int64_t n_features = graph::checked_element_count(features, cat(model_name_, ": ", name));
  Node* n = add_node("Flatten", {x}, name, std::vector<int64_t>{-1, n_features});
  n->set_attr(graph::Attribute::make_int("axis", 1));
  return n->output(0);
}

Value* GraphBuilder::gemm(Value* x, const std::string& module, int64_t out_features) {
  const int64_t in = expect_rank(x, 2, module)[1];
  Value* weight = kaiming_parameter(module + ".weight", {out_features, in}, in);
  Value* bias = kaiming_parameter(module + ".bias", {out_features}, in);
  Node* n = add_node("Gemm", {x, weight, bias}, module, std::vector<int64_t>{-1, out_features});
  n->set_attr(graph::Attribute::make_float("alpha", 1.0f));
  n->set_attr(graph::Attribute::make_float("beta", 1.0f));
  n->set_attr(graph::Attribute::make_int("transB", 1));
  return n->output(0);
}

Value* GraphBuilder::matmul_add(Value* x, const std::string& module, int64_t out_features) {
  std::vector<int64_t> out = dims_of(x);
  OT_CHECK(out.size() >= 2, model_name_, ": layer '", module, "' needs a rank-2 or higher input");
  const int64_t in = out.back();
  out.back() = out_features;
  Value* weight = kaiming_parameter(module + ".weight", {in, out_features}, in);
  Value* bias = kaiming_parameter(module + ".bias", {out_features}, in);
  Value* y = add_node("MatMul", {x, weight}, module + ".matmul", out)->output(0);
  return add_node("Add", {y, bias}, module + ".add", out)->output(0);
}

Value* GraphBuilder::int_input(const std::string& name, std::span<const int64_t> dims) {
  std::vector<int64_t> full{-1};
  for (int64_t d : dims) {
    OT_CHECK(d > 0, model_name_, ": input dimensions must be positive, got ", join_dims(dims));
    full.push_back(d);
  }
  return graph().add_input(name, ValueType::tensor(DataType::kInt64, batched_shape(full)));
}

Value* GraphBuilder::embedding(Value* ids, const std::string& module, int64_t vocab, int64_t dim) {
  const std::string name = module + ".weight";
  reserve_parameter_bytes(name, std::vector<int64_t>{vocab, dim});
  Tensor t(DataType::kFloat, {vocab, dim});
  fill_uniform(std::span<float>(t.mutable_data_as<float>(), static_cast<size_t>(t.numel())),
               std::sqrt(3.0), parameter_stream_seed(seed_, name));
  Value* weight = add_parameter(name, std::move(t));
  std::vector<int64_t> out = dims_of(ids);
  out.push_back(dim);
  return add_node("Gather", {weight, ids}, module, out)->output(0);
}

Node* GraphBuilder::op(const std::string& op_type, const std::vector<Value*>& inputs,
                       const std::string& name, std::span<const int64_t> out_dims,
                       DataType dtype) {
  Node* n = add_node(op_type, inputs, name, out_dims);
  n->output(0)->type.dtype = dtype;
  return n;
}

Value* GraphBuilder::int_constant(const std::string& name, std::vector<int64_t> values) {
  const auto n = static_cast<int64_t>(values.size());
  return add_parameter(name, Tensor::from_vector(DataType::kInt64, {n}, values));
}

Value* GraphBuilder::float_constant(const std::string& name, float value) {
  // A Constant node, not an initializer: float initializers are what training updates.
  Node* n = graph().add_node("Constant", {}, {name}, name);
  n->output(0)->type = ValueType::tensor(DataType::kFloat, Shape{});
  n->set_attr(graph::Attribute::make_tensor(
      "value", Tensor::from_vector(DataType::kFloat, {}, std::vector<float>{value})));
  return n->output(0);
}

Value* GraphBuilder::add(Value* a, Value* b, const std::string& name) {
  OT_CHECK(dims_of(a) == dims_of(b), model_name_, ": layer '", name, "' adds values of shapes ",
           join_dims(dims_of(a)), " and ", join_dims(dims_of(b)));
  return add_node("Add", {a, b}, name, dims_of(a))->output(0);
}

std::unique_ptr<graph::Model> GraphBuilder::finish(Value* out, const std::string& output_name) {
  graph().rename_value(out, output_name);
  graph().set_outputs({out});
  graph::verify_model(*model_);
  return std::move(model_);
}

int64_t count_parameters(const graph::Model& m) {
  const graph::Graph& g = *m.graph;
  std::vector<const Value*> buffers;
  for (const auto& n : g.nodes()) {
    if (n->op_type != "BatchNormalization" || !n->domain.empty()) continue;
    for (size_t i : {size_t{3}, size_t{4}})
      if (n->input(i)) buffers.push_back(n->input(i));
  }
  int64_t total = 0;
  for (const Value* v : g.initializers()) {
    if (!graph::is_float_dtype(v->initializer().dtype())) continue;
    if (std::find(buffers.begin(), buffers.end(), v) != buffers.end()) continue;
    total += v->initializer().numel();
  }
  return total;
}

}  // namespace onnxtrain::models
