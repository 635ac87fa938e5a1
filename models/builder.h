// GraphBuilder: writes reference models against the IR one PyTorch-style layer at a time,
// with PyTorch's default initial weights and every intermediate value's shape filled in.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain::models {

// splitmix64 (Steele, Lea, Flood 2014): its output is fully specified by integer arithmetic,
// so weights drawn from it are byte-identical on every platform, compiler and run.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  // Uniform on the open interval (-1, 1): an odd multiple of 2^-24, so the distribution is
  // exactly symmetric and every value converts to float without rounding.
  double next_symmetric();

 private:
  uint64_t state_;
};

// Stream seed of one parameter tensor: each tensor gets its own stream keyed by its name, so
// adding a layer never shifts the weights of the others.
uint64_t parameter_stream_seed(uint64_t seed, std::string_view tensor_name);

// out[i] ~ U(-bound, bound) from the given stream; |out[i]| <= float(bound).
void fill_uniform(std::span<float> out, double bound, uint64_t stream_seed);

// A 2-D convolution as nn.Conv2d(in, out_channels, kernel, stride, pad, bias) describes it.
struct ConvSpec {
  int64_t out_channels = 0;
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t pad = 0;
  bool bias = true;
};

// Nodes are named after the PyTorch module path ("layer1.0.conv1"); a node's output value gets
// the node's name, and parameters are "<module>.weight", "<module>.bias", ... as in a PyTorch
// state_dict. Batch is the symbolic dim "N". Shape errors throw Error prefixed by the model
// name, naming the layer.
class GraphBuilder {
 public:
  // Parameters above this many bytes in total are refused: an .onnx file (one protobuf)
  // cannot hold more than 2 GiB, and refusing early avoids allocating what cannot be written.
  static constexpr int64_t kMaxParameterBytes = (int64_t{2} << 30) - (int64_t{64} << 20);

  GraphBuilder(std::string model_name, uint64_t seed);

  graph::Graph& graph() { return *model_->graph; }
  graph::Model& model() { return *model_; }
  const std::string& model_name() const { return model_name_; }

  // Graph input f32 [N, dims...].
  graph::Value* input(const std::string& name, std::span<const int64_t> dims);

  // nn.Conv2d with PyTorch's default init. x: (N,C,H,W), w: (K,C,k,k) -> y: (N,K,P,Q).
  graph::Value* conv(graph::Value* x, const std::string& module, const ConvSpec& spec);
  // nn.BatchNorm2d in inference form: scale 1, bias 0, running mean 0, running var 1,
  // epsilon 1e-5, momentum 0.9 (ONNX's convention: 1 - PyTorch's 0.1).
  graph::Value* batch_norm(graph::Value* x, const std::string& module);
  graph::Value* relu(graph::Value* x, const std::string& name);
  graph::Value* max_pool(graph::Value* x, const std::string& name, int64_t kernel, int64_t stride,
                         int64_t pad);
  // (N,C,H,W) -> (N,C,1,1)
  graph::Value* global_average_pool(graph::Value* x, const std::string& name);
  // (N,d1,...) -> (N, d1*...)
  graph::Value* flatten(graph::Value* x, const std::string& name);
  // nn.Linear as torch.onnx exports it: Gemm(x (N,in), W (out,in), b (out), transB=1).
  graph::Value* gemm(graph::Value* x, const std::string& module, int64_t out_features);
  // x (N,...,in) @ W (in,out) -> MatMul, then Add b (out). W is stored transposed relative to
  // nn.Linear, which is how a plain MatMul wants it.
  graph::Value* matmul_add(graph::Value* x, const std::string& module, int64_t out_features);
  // Graph input i64 [N, dims...] (token ids, attention masks).
  graph::Value* int_input(const std::string& name, std::span<const int64_t> dims);
  // nn.Embedding(vocab, dim) as exported: Gather(weight (vocab, dim), ids) -> (N, ..., dim),
  // weights N(0,1)-like (uniform with variance 1, as the builder draws uniform numbers).
  graph::Value* embedding(graph::Value* ids, const std::string& module, int64_t vocab, int64_t dim);
  // A node with one float (or `dtype`) output of `out_dims` (-1 = the batch); attributes are the
  // caller's (set_attr on the returned node).
  graph::Node* op(const std::string& op_type, const std::vector<graph::Value*>& inputs,
                  const std::string& name, std::span<const int64_t> out_dims,
                  graph::DataType dtype = graph::DataType::kFloat);
  // An int64 constant initializer (axes, shapes): not a parameter.
  graph::Value* int_constant(const std::string& name, std::vector<int64_t> values);
  // A float scalar Constant node (not an initializer, so not trained), e.g. a division's floor.
  graph::Value* float_constant(const std::string& name, float value);
  // Elementwise a + b of equal shapes (the residual connection).
  graph::Value* add(graph::Value* a, graph::Value* b, const std::string& name);

  // Renames `out` to `output_name`, makes it the only graph output, runs the verifier and hands
  // the model over; the builder is empty afterwards.
  std::unique_ptr<graph::Model> finish(graph::Value* out, const std::string& output_name);

  // Static dims of a value; the batch dim (symbolic) reads as -1.
  static std::vector<int64_t> dims_of(const graph::Value* v);

 private:
  graph::Value* kaiming_parameter(const std::string& name, std::vector<int64_t> dims,
                                  int64_t fan_in);
  graph::Value* constant_parameter(const std::string& name, std::vector<int64_t> dims, float value);
  graph::Value* add_parameter(const std::string& name, graph::Tensor t);
  graph::Node* add_node(const std::string& op_type, const std::vector<graph::Value*>& inputs,
                        const std::string& name, std::span<const int64_t> out_dims);
  void reserve_parameter_bytes(const std::string& name, std::span<const int64_t> dims);
  std::vector<int64_t> expect_rank(const graph::Value* x, size_t rank,
                                   const std::string& layer) const;
  int64_t window_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                             const std::string& layer, const char* axis) const;

  std::string model_name_;
  uint64_t seed_;
  int64_t parameter_bytes_ = 0;
  std::unique_ptr<graph::Model> model_;
};

// Parameters in the sense of torchvision's sum(p.numel() for p in model.parameters()):
// elements of float initializers, leaving out BatchNormalization's running mean and variance
// (inputs 3 and 4), which are buffers rather than parameters.
int64_t count_parameters(const graph::Model& m);

}  // namespace onnxtrain::models
