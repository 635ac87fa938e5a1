// Inference-only rewrite (passes.h): Conv [+ BatchNormalization] [+ Add] [+ Relu] chains become
// one ai.onnxtrain.FusedConv with the BN folded into its weights, and values passed only
// between FusedConvs keep oneDNN's blocked channel layout. Never run on training graphs.
#include <cmath>
#include <unordered_set>

#include "ops/nn/blocked_layout.h"
#include "ops/op_api.h"
#include "passes/pass_util.h"
#include "passes/passes.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Node;
using graph::Value;

bool is_onnx(const Node* n, const char* op) { return n && is_op(*n, "", op); }

class InferenceOptimizer {
 public:
  explicit InferenceOptimizer(graph::Model& model)
      : model_(model),
        g_(*model.graph),
        constants_(constant_initializers(g_)),
        captured_(captured_by_subgraphs(g_)) {}

  InferenceStats run() {
    // Only the residual Add fusion needs static shapes (to rule out broadcasting); a model
    // that static inference cannot type still gets the rest.
    try {
      infer_shapes(model_);
      shapes_known_ = true;
    } catch (const Error&) {
      shapes_known_ = false;
    }
    for (Node* n : g_.topological_order())
      if (!removed_.count(n) && is_onnx(n, "Conv") && fusable_conv(*n)) fuse_chain(n);
    if (stats_.fused_convs > 0) {
      g_.sort_topologically();
      model_.set_opset(ops::kOnnxtrainDomain, 1);
      choose_layouts();
    }
    return stats_;
  }

 private:
  // The single node reading `v` (and only once), when `v` is no graph output and no subgraph
  // captures it (so it can disappear inside a fused node); else nullptr.
  Node* sole_user(const Value* v) const {
    if (!v || v->is_graph_output() || v->uses().size() != 1 || captured_.count(v)) return nullptr;
    return v->uses()[0].node;
  }

  const graph::Tensor* constant(const Value* v) const {
    auto it = constants_.find(v);
    return v && it != constants_.end() ? &it->second : nullptr;
  }

  bool float_constant(const Value* v, int64_t rank) const {
    const graph::Tensor* t = constant(v);
    return t && t->dtype() == DataType::kFloat && t->rank() == rank;
  }

  // f32 2-D Conv with constant weights and (if any) constant bias.
  bool fusable_conv(const Node& n) const {
    if (n.inputs().size() < 2 || !n.input(0) || !float_constant(n.input(1), 4)) return false;
    if (n.input(2) && !float_constant(n.input(2), 1)) return false;
    return n.input(0)->dtype() == DataType::kFloat || n.input(0)->dtype() == DataType::kUndefined;
  }

  // BatchNormalization in inference mode whose four parameters are f32 constants.
  bool foldable_bn(const Node* bn, const Value* y, int64_t channels) const {
    if (!is_onnx(bn, "BatchNormalization") || bn->input(0) != y) return false;
    if (bn->attr_int("training_mode", 0) != 0 || bn->attr_int("spatial", 1) != 1) return false;
    for (size_t i = 1; i < bn->outputs().size(); ++i)
      if (bn->output(i) && (!bn->output(i)->uses().empty() || bn->output(i)->is_graph_output()))
        return false;
    for (size_t i = 1; i <= 4; ++i) {
      const graph::Tensor* t = constant(bn->input(i));
      if (!t || t->dtype() != DataType::kFloat || t->numel() != channels) return false;
    }
    return true;
  }

  Value* add_constant(const std::string& base, graph::Tensor t) {
    Value* v = g_.add_initializer(g_.fresh_name(base), std::move(t));
    constants_.emplace(v, v->initializer());
    return v;
  }

  // W'[m] = W[m] * s[m], b'[m] = (b[m] - mean[m]) * s[m] + beta[m], s = gamma / sqrt(var + eps),
  // computed in double.
  void fold_bn(const Node& bn, Value*& w, Value*& b) {
    const graph::Tensor& wt = *constant(w);
    const int64_t m = wt.dims()[0], per = wt.numel() / m;
    const float* gamma = constant(bn.input(1))->data_as<float>();
    const float* beta = constant(bn.input(2))->data_as<float>();
    const float* mean = constant(bn.input(3))->data_as<float>();
    const float* var = constant(bn.input(4))->data_as<float>();
    const double eps = bn.attr_float("epsilon", 1e-5f);
    const float* bias = b ? constant(b)->data_as<float>() : nullptr;
    graph::Tensor nw(DataType::kFloat, wt.dims()), nb(DataType::kFloat, {m});
    float* wo = nw.mutable_data_as<float>();
    float* bo = nb.mutable_data_as<float>();
    const float* wi = wt.data_as<float>();
    for (int64_t c = 0; c < m; ++c) {
      const double s = gamma[c] / std::sqrt(static_cast<double>(var[c]) + eps);
      for (int64_t i = 0; i < per; ++i) wo[c * per + i] = static_cast<float>(wi[c * per + i] * s);
      bo[c] = static_cast<float>(((bias ? bias[c] : 0.0) - mean[c]) * s + beta[c]);
    }
    w = add_constant(w->name() + "_bn_folded", std::move(nw));
    b = add_constant(bn.output(0)->name() + "_folded_bias", std::move(nb));
  }

  // Absorbs the longest Conv -> [BN] -> [Add(other)] -> [Relu] chain into one FusedConv.
  void fuse_chain(Node* conv) {
    Value* w = conv->input(1);
    Value* b = conv->input(2);
    Value* z = nullptr;
    std::string activation;
    std::vector<Node*> chain{conv};
    Value* out = conv->output(0);
    const int64_t channels = constant(w)->dims()[0];
    if (Node* bn = sole_user(out); bn && foldable_bn(bn, out, channels)) {
      fold_bn(*bn, w, b);
      chain.push_back(bn);
      out = bn->output(0);
      ++stats_.folded_batchnorms;
    }
    if (Node* add = sole_user(out);
        shapes_known_ && is_onnx(add, "Add") && add->inputs().size() == 2) {
      Value* other = add->input(add->input(0) == out ? 1 : 0);
      if (other && other != out && same_static_shape(other, out) &&
          other->dtype() == out->dtype() && same_static_shape(add->output(0), out) &&
          add->output(0)->dtype() == out->dtype()) {
        z = other;
        chain.push_back(add);
        out = add->output(0);
        ++stats_.fused_adds;
      }
    }
    if (Node* relu = sole_user(out); is_onnx(relu, "Relu")) {
      activation = "Relu";
      chain.push_back(relu);
      out = relu->output(0);
      ++stats_.fused_relus;
    }
    const std::string out_name = out->name();
    const graph::ValueType out_type = out->type;
    Node* fused =
        g_.add_node("FusedConv", {conv->input(0), w, b, z}, {g_.fresh_name(out_name + "_fused")},
                    conv->name, ops::kOnnxtrainDomain);
    for (const graph::Attribute& a : conv->attributes) fused->set_attr(a);
    if (!activation.empty())
      fused->set_attr(graph::Attribute::make_string("activation", activation));
    Value* fused_out = fused->output(0);
    fused_out->type = out_type;
    if (captured_.count(out)) captured_.insert(fused_out);  // replace_all_uses moves captures
    g_.replace_all_uses(out, fused_out);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      removed_.insert(*it);
      g_.remove_node(*it);
    }
    g_.rename_value(fused_out, out_name);
    ++stats_.fused_convs;
  }

  // A FusedConv output stays blocked when only FusedConvs read it (as x or z), it is no graph
  // output and no subgraph captures it, and its channel count divides into blocks.
  void choose_layouts() {
    for (const auto& up : g_.nodes()) {
      Node* n = up.get();
      if (!is_fused(n)) continue;
      Value* y = n->output(0);
      const int64_t channels = constant(n->input(1))->dims()[0];
      bool blocked = ops::can_block_channels(channels) && !y->is_graph_output() && !y->uses().empty() &&
                     !captured_.count(y);
      for (const graph::Use& u : y->uses())
        blocked = blocked && is_fused(u.node) && (u.input_index == 0 || u.input_index == 3);
      if (!blocked) continue;
      n->set_attr(graph::Attribute::make_int(ops::kYBlockedAttr, 1));
      for (const graph::Use& u : y->uses())
        u.node->set_attr(
            graph::Attribute::make_int(u.input_index == 0 ? ops::kXBlockedAttr : ops::kZBlockedAttr, 1));
      ++stats_.blocked_values;
    }
  }

  static bool is_fused(const Node* n) {
    return n && n->domain == ops::kOnnxtrainDomain && n->op_type == "FusedConv";
  }

  graph::Model& model_;
  graph::Graph& g_;
  ConstantValues constants_;
  std::unordered_set<const Value*> captured_;
  std::unordered_set<const Node*> removed_;  // dangling in the topological order being walked
  InferenceStats stats_;
  bool shapes_known_ = false;
};

}  // namespace

InferenceStats optimize_inference(graph::Model& model) {
  InferenceStats stats = InferenceOptimizer(model).run();
  if (stats.fused_convs > 0) dce(model);  // folded-away BN parameters and original weights
  return stats;
}

}  // namespace onnxtrain::passes
