// select_conv_algorithm (passes.h): records on each convolution node which oneDNN algorithm its
// kernel asks for (the conv_algorithm attribute, ops/nn/conv_algorithm.h). Kernels read the
// attribute; nobody infers the choice from names or options.
#include "graph/error.h"
#include "ops/nn/conv_algorithm.h"
#include "ops/op_api.h"
#include "ops/precision.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::Node;

// Input index of X and of W: Conv / FusedConv (X, W, ...), ConvGrad (dY, X, W).
std::optional<std::pair<size_t, size_t>> conv_operands(const Node& n) {
  if (n.domain.empty() && n.op_type == "Conv") return std::pair<size_t, size_t>{0, 1};
  if (n.domain == ops::kOnnxtrainDomain && n.op_type == "FusedConv")
    return std::pair<size_t, size_t>{0, 1};
  if (n.domain == ops::kOnnxtrainDomain && n.op_type == "ConvGrad")
    return std::pair<size_t, size_t>{1, 2};
  return std::nullopt;
}

// y: the convolution's output (Conv, FusedConv) or its gradient dY (ConvGrad); same shape.
bool eligible(const Node& n, size_t x_index, size_t w_index, const graph::Value* y) {
  const graph::Value* x = n.input(x_index);
  const graph::Value* w = n.input(w_index);
  if (!x || !w || !y || !w->shape() || !y->shape()) return false;
  std::vector<int64_t> kernel, out_spatial;
  for (size_t i = 2; i < w->shape()->size(); ++i) {
    const graph::Dim& d = (*w->shape())[i];
    if (!d.is_known()) return false;
    kernel.push_back(d.value);
  }
  for (size_t i = 2; i < y->shape()->size(); ++i) out_spatial.push_back((*y->shape())[i].value);
  kernel = n.attr_ints("kernel_shape", kernel);
  const std::vector<int64_t> ones(kernel.size(), 1);
  return ops::winograd_eligible(kernel, n.attr_ints("strides", ones),
                                n.attr_ints("dilations", ones), n.attr_int("group", 1),
                                ops::conv_compute_dtype(x->dtype(), w->dtype())
                                    .value_or(graph::DataType::kUndefined),
                                out_spatial);
}

}  // namespace

ConvAlgorithmStats select_conv_algorithm(graph::Model& model, ConvAlgorithm algorithm) {
  ConvAlgorithmStats stats;
  for (const auto& up : model.graph->nodes()) {
    Node& n = *up;
    const auto operands = conv_operands(n);
    if (!operands) continue;
    const bool backward = n.op_type == "ConvGrad";
    ++(backward ? stats.backward : stats.forward);
    const graph::Value* y = backward ? n.input(0) : n.output(0);
    if (algorithm != ConvAlgorithm::kWinograd ||
        !eligible(n, operands->first, operands->second, y))
      continue;
    n.set_attr(graph::Attribute::make_string(std::string(ops::kConvAlgorithmAttr),
                                             std::string(ops::kConvWinograd)));
    ++(backward ? stats.winograd_backward : stats.winograd_forward);
  }
  return stats;
}

std::optional<ConvAlgorithm> parse_conv_algorithm(const std::string& name) {
  if (name == "direct") return ConvAlgorithm::kDirect;
  if (name == "winograd") return ConvAlgorithm::kWinograd;
  return std::nullopt;
}

}  // namespace onnxtrain::passes
