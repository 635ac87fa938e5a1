// autocast (passes.h): mixed precision as a graph rewrite, torch.autocast's op classes.
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "graph/error.h"
#include "ops/op_api.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Graph;
using graph::Node;
using graph::Value;

// What autocast does with a node, torch.autocast's classes:
//  - kLow: convolutions and matrix products, whose cost is arithmetic ("lower_precision_fp"):
//    every float input (a Conv's X only; a FusedConv's X and Z) is read in the low precision,
//    and the output is written in it.
//  - kFollow: memory-bound ops with low-precision kernels that compute in float32 and store in
//    the input's dtype (BN, Relu, Gelu, Add, Mul, Sum, pooling), and the ops that only move
//    data (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity): their activation inputs
//    (activation_inputs) keep the low precision when all of them have it; BatchNormalization's
//    scale, bias and statistics stay float32. A mix of low and float32 activations runs in
//    float32 (torch's "promote"), except that Add and Mul read a small float32 operand -- a
//    parameter or constant (a Linear's bias after its MatMul, as torch's addmm adds it in the
//    low precision) or a scalar (attention's scale) -- through a low-precision copy, as a Python
//    scalar or a bias does in torch.
//  - kFloat32: everything else -- softmax, normalization other than BN, reductions, global
//    pooling, losses, any other elementwise op, custom domains, the optimizer -- reads float32.
enum class Policy { kLow, kFollow, kFloat32 };

// The follow ops that only move data (their kernels copy elements of any dtype).
bool moves_data(const Node& n) {
  const std::string& t = n.op_type;
  return t == "Reshape" || t == "Transpose" || t == "Squeeze" || t == "Unsqueeze" ||
         t == "Flatten" || t == "Identity";
}

// optimize_inference's Conv [+ BN] [+ Add] [+ Relu] (onnxrun --precision runs that pass first
// where the fused kernels have the precision natively).
bool is_fused_conv(const Node& n) {
  return n.domain == ops::kOnnxtrainDomain && n.op_type == "FusedConv";
}

Policy policy(const Node& n) {
  if (is_fused_conv(n)) return Policy::kLow;
  if (!n.domain.empty() && n.domain != "ai.onnx") return Policy::kFloat32;
  const std::string& t = n.op_type;
  if (t == "Conv" || t == "Gemm" || t == "MatMul") return Policy::kLow;
  if (t == "BatchNormalization" || t == "Relu" || t == "Gelu" || t == "Add" || t == "Mul" ||
      t == "Sum" || t == "MaxPool" || t == "AveragePool" || moves_data(n))
    return Policy::kFollow;
  return Policy::kFloat32;
}

// The inputs of a kFollow node that carry activations: all of Add's, Mul's and Sum's, input 0
// of the others (BatchNormalization's parameters and statistics stay float32; the shape ops'
// other inputs are int64 shapes and axes).
std::vector<size_t> activation_inputs(const Node& n) {
  std::vector<size_t> idx;
  const size_t count =
      n.op_type == "Add" || n.op_type == "Mul" || n.op_type == "Sum" ? n.inputs().size() : 1;
  for (size_t i = 0; i < count && i < n.inputs().size(); ++i)
    if (n.input(i)) idx.push_back(i);
  return idx;
}

graph::Attribute cast_to(DataType t) {
  return graph::Attribute::make_int("to", static_cast<int64_t>(t));
}

}  // namespace

AutocastInfo autocast(graph::Model& model, DataType compute,
                      const std::vector<std::string>& params) {
  OT_CHECK(compute == DataType::kBFloat16 || compute == DataType::kFloat16,
           "autocast: the compute dtype must be bf16 or f16, got ",
           graph::dtype_short_name(compute));
  OT_CHECK(model.training.compute_dtype == DataType::kFloat,
           "autocast: the graph is already autocast to ",
           graph::dtype_short_name(model.training.compute_dtype));
  Graph& g = *model.graph;
  const std::string suffix = cat(".", graph::dtype_short_name(compute));
  const std::unordered_set<std::string> is_param(params.begin(), params.end());
  AutocastInfo info;
  auto add_cast = [&](Value* v, DataType to, const std::string& name) {
    Node* c = g.add_node("Cast", {v}, {name}, g.fresh_name(name + "/cast"));
    c->attributes.push_back(cast_to(to));
    c->output(0)->type = v->type;
    c->output(0)->type.dtype = to;
    ++info.casts;
    return c->output(0);
  };
  std::unordered_map<Value*, Value*> low;   // float32 value -> its one low-precision copy
  std::unordered_map<Value*, Value*> f32;   // low-precision value -> its one float32 copy
  std::unordered_map<Value*, std::string> original;  // low-precision output -> its old name
  // The values autocast made low-precision (copies and lowered outputs): a graph's own bf16 /
  // f16 values (a model stored in bf16) are the user's types and are left as they are.
  std::unordered_set<const Value*> made_low;
  auto low_copy = [&](Value* v) {
    auto [it, fresh] = low.emplace(v, nullptr);
    if (!fresh) return it->second;
    Value* c = add_cast(v, compute, g.fresh_name(v->name() + suffix));
    if (is_param.count(v->name()))
      model.training.copies.push_back({.master = v->name(), .copy = c->name()});
    made_low.insert(c);
    return it->second = c;
  };
  // A float32 reader of a low-precision output gets a Cast back under the output's original
  // name (the loss may attach to it, the graph may output it).
  auto f32_copy = [&](Value* v) {
    auto [it, fresh] = f32.emplace(v, nullptr);
    if (!fresh) return it->second;
    auto name = original.find(v);
    Value* c = add_cast(v, DataType::kFloat,
                        g.fresh_name(name != original.end() ? name->second : v->name() + ".f32"));
    low.emplace(c, v);  // a low-precision reader takes v itself: Cast(Cast(v)) == v
    return it->second = c;
  };
  auto is_low = [&](const Value* v) { return v && made_low.count(v) > 0; };
  // The node now writes its output 0 in the low precision, renamed `<name>.bf16`.
  auto lower_output = [&](Node* n) {
    Value* y = n->output(0);
    original.emplace(y, y->name());
    g.rename_value(y, g.fresh_name(y->name() + suffix));
    y->type.dtype = compute;
    made_low.insert(y);
    ++(policy(*n) == Policy::kLow ? info.low_nodes : info.follow_nodes);
  };
  // A float32 operand worth reading in the low precision next to a low-precision activation:
  // a parameter, an initializer or a Constant's output, or any single-element value.
  auto small_float32 = [&](const Value* v) {
    if (!v || v->dtype() != DataType::kFloat) return false;
    if (is_param.count(v->name()) || v->has_initializer()) return true;
    if (v->producer() && v->producer()->op_type == "Constant") return true;
    const auto& shape = v->type.shape;
    if (!shape) return false;
    for (const auto& d : *shape)
      if (!d.is_known() || d.value != 1) return false;
    return true;
  };
  auto float32_output = [](const Node& n) {
    return !n.outputs().empty() && n.output(0) && n.output(0)->dtype() == DataType::kFloat;
  };
  for (Node* n : g.topological_order()) {
    const Policy p = policy(*n);
    bool lowered = false;
    if (p == Policy::kLow && n->outputs().size() == 1 && float32_output(*n)) {
      bool ok = true;
      for (const Value* v : n->inputs())
        ok &= !v || v->dtype() == DataType::kFloat || is_low(v);
      if (ok) {
        // A Conv reads its float32 weight and bias as they are: it computes in its activation's
        // low precision (ops/precision.h's conv_compute_dtype), rounding the weight in the
        // reorder into its primitive's layout, and writes dW and dB in float32 -- no weight
        // copy, no Cast of the weight or of its gradient.
        // A FusedConv likewise, its residual Z (input 3) in Y's low precision. A weight that
        // is already low (computed from the parameter by a data-movement op that moved its low
        // copy: dynamo's Unsqueeze(Squeeze(W)) of a depthwise Conv1d) takes its bias (input 2)
        // along, as the kernels want the bias in the weight's dtype.
        const bool conv = n->op_type == "Conv" || is_fused_conv(*n);
        for (size_t i = 0; i < n->inputs().size(); ++i) {
          const bool weight = conv && i != 0 && i != 3 && !(i == 2 && is_low(n->input(1)));
          if (Value* v = n->input(i); v && !weight && !is_low(v)) n->set_input(i, low_copy(v));
        }
        lower_output(n);
        lowered = true;
      }
    } else if (p == Policy::kFollow && float32_output(*n)) {
      const std::vector<size_t> act = activation_inputs(*n);
      const bool binary = n->op_type == "Add" || n->op_type == "Mul";
      size_t low_count = 0, small_count = 0;
      for (size_t i : act) {
        if (is_low(n->input(i)))
          ++low_count;
        else if (binary && small_float32(n->input(i)))
          ++small_count;
      }
      // A data-movement op on a parameter (dynamo's Transpose of a Linear's weight ahead of its
      // MatMul) moves the parameter's low-precision copy instead: the same one Cast, half the
      // bytes in the Transpose and in its gradient.
      if (moves_data(*n) && act.size() == 1 && is_param.count(n->input(0)->name()) &&
          n->input(0)->dtype() == DataType::kFloat)
        low_count = 1;
      if (!act.empty() && low_count > 0 && low_count + small_count == act.size()) {
        for (size_t i : act)
          if (!is_low(n->input(i))) n->set_input(i, low_copy(n->input(i)));
        lower_output(n);
        lowered = true;
      }
    }
    if (lowered) continue;
    // Shape and Size read only the dims: a low-precision input serves them as it is.
    if (n->op_type == "Shape" || n->op_type == "Size") continue;
    for (size_t i = 0; i < n->inputs().size(); ++i)
      if (Value* v = n->input(i); is_low(v)) n->set_input(i, f32_copy(v));
  }
  std::vector<Value*> outs = g.outputs();
  for (Value*& o : outs)
    if (is_low(o)) o = f32_copy(o);
  g.set_outputs(std::move(outs));
  if (info.low_nodes == 0) return info;
  g.sort_topologically();
  model.training.compute_dtype = compute;
  return info;
}

}  // namespace onnxtrain::passes
