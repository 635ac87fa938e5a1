// autodiff (passes.h): reverse-mode differentiation as a graph rewrite. Every forward node on a
// path from a `wrt` value to the loss gets its op's gradient rule applied once, in reverse
// topological order; the rules emit ordinary nodes, so the backward graph goes through the same
// shape inference, planner and dump as the forward one.
#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

#include "graph/dependencies.h"
#include "graph/error.h"
#include "ops/op_api.h"
#include "ops/shape/static_slices.h"
#include "passes/pass_util.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::DataType;
using graph::Graph;
using graph::Node;
using graph::Tensor;
using graph::Value;

bool differentiable(const Value* v) {
  return v && (v->dtype() == DataType::kFloat || v->dtype() == DataType::kDouble ||
               v->dtype() == DataType::kBFloat16 || v->dtype() == DataType::kFloat16);
}

std::string op_name(const Node& n) {
  return n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + "." + n.op_type;
}

const ops::OpSchema* schema_of(const graph::Model& m, const Node& n) {
  const int64_t opset = m.opset_version(n.domain).value_or(1);
  return ops::OpRegistry::global().find(n.domain, n.op_type, opset);
}

// The state of one autodiff run: which values are on a path, the gradient contributions each
// value received, and the constant values shape inference may read.
class Differentiator {
 public:
  Differentiator(graph::Model& m, Value* loss, const std::vector<Value*>& wrt)
      : model_(m), g_(*m.graph), loss_(loss) {
    known_ = constant_initializers(g_);
    order_ = g_.topological_order();
    mark_active(wrt);
  }

  // Active nodes whose op has no gradient rule, as "Op 'name'" strings (sorted, unique).
  std::vector<std::string> missing_rules() const {
    std::set<std::string> missing;
    for (const Node* n : order_) {
      if (!active_nodes_.count(n)) continue;
      const ops::OpSchema* s = schema_of(model_, *n);
      if (!s || !s->gradient)
        missing.insert(cat(op_name(*n), " '", n->name, "'",
                           graph::has_subgraphs(*n)
                               ? " (control flow: no gradients through its subgraphs)"
                               : ""));
    }
    return {missing.begin(), missing.end()};
  }

  void run() {
    seed_loss();
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      Node* n = *it;
      if (active_nodes_.count(n)) apply_rule(*n);
    }
  }

  // dLoss/dw named `<w>_grad`; a zero tensor when w does not reach the loss.
  Value* finish(Value* w) {
    const std::string name = w->name() + "_grad";
    Value* grad = active_.count(w) ? accumulated(w) : nullptr;
    if (!grad) {
      Value* shape = add("Shape", {w}, w->name() + "_shape", "")[0];
      Node* zeros = g_.add_node("ConstantOfShape", {shape}, {name}, g_.fresh_name(name));
      zeros->set_attr(graph::Attribute::make_tensor("value", scalar(w->dtype(), 0.0, {1})));
      infer_node(model_, *zeros, known_);
      ++backward_nodes_;
      return zeros->output(0);
    }
    if (emitted_.count(grad) && owners_[grad] == 1 && !grad->is_graph_output()) {
      g_.rename_value(grad, name);
      return grad;
    }
    return add("Identity", {grad}, name, "", /*exact_name=*/true)[0];
  }

  int backward_nodes() const { return backward_nodes_; }

  // ---- what the GradientBuilder of one node calls
  Value* accumulated(Value* v) {
    auto done = sums_.find(v);
    if (done != sums_.end()) return done->second;
    auto it = contributions_.find(v);
    if (it == contributions_.end() || it->second.empty()) return nullptr;
    std::vector<Value*>& parts = it->second;
    if (parts.size() > 1) join_slice_gradients(v, parts);
    if (parts.size() > 1) join_weight_products(v, parts);
    Value* total = parts.size() == 1 ? parts[0] : add("Sum", parts, v->name() + "_grad_sum", "")[0];
    sums_[v] = total;
    ++owners_[total];
    return total;
  }
  bool is_active(const Value* v) const { return v && active_.count(v); }
  void contribute(Value* v, Value* grad) {
    OT_CHECK(!sums_.count(v), "autodiff: internal error: gradient of '", v->name(),
             "' received after it was summed");
    contributions_[v].push_back(grad);
  }
  // Emits a backward node; output names derive from `base`.
  std::vector<Value*> add(const std::string& op_type, const std::vector<Value*>& inputs,
                          const std::string& base, const std::string& domain,
                          bool exact_name = false, int num_outputs = 1,
                          std::vector<graph::Attribute> attributes = {}) {
    std::vector<std::string> outs;
    for (int k = 0; k < num_outputs; ++k)
      outs.push_back(exact_name && k == 0 ? base
                                          : g_.fresh_name(num_outputs == 1 ? base : cat(base, "_", k)));
    Node* n = g_.add_node(op_type, inputs, outs, g_.fresh_name(base + "/" + op_type), domain);
    for (graph::Attribute& a : attributes) n->set_attr(std::move(a));
    infer_node(model_, *n, known_);
    ++backward_nodes_;
    for (Value* out : n->outputs()) emitted_.insert(out);
    return n->outputs();
  }
  Value* constant(Tensor t, const std::string& hint) {
    Value* c = g_.add_initializer(g_.fresh_name(hint), std::move(t));
    known_.emplace(c, c->initializer());
    c->type = graph::ValueType::tensor(c->initializer().dtype(),
                                       graph::make_shape(c->initializer().dims()));
    return c;
  }
  graph::Model& model() { return model_; }

 private:
  static Tensor scalar(DataType dt, double v, std::vector<int64_t> dims) {
    if (dt == DataType::kDouble) return Tensor::from_vector(dt, std::move(dims), std::vector<double>{v});
    return Tensor::from_vector(DataType::kFloat, std::move(dims),
                               std::vector<float>{static_cast<float>(v)});
  }

  // A value is active when it is float, depends on a wrt value and reaches the loss; a node is
  // active when one of its outputs is. A node depends on what its subgraphs capture too: an If
  // whose branch reads a parameter is on that parameter's path (and has no gradient rule), not
  // a constant the gradient silently skips.
  void mark_active(const std::vector<Value*>& wrt) {
    std::unordered_set<const Value*> forward(wrt.begin(), wrt.end());
    for (const Node* n : order_) {
      bool reached = false;
      for (const Value* in : graph::node_dependencies(*n, g_))
        reached |= differentiable(in) && forward.count(in);
      if (!reached) continue;
      for (const Value* out : n->outputs())
        if (differentiable(out)) forward.insert(out);
    }
    std::unordered_set<const Value*> backward{loss_};
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
      const Node* n = *it;
      bool reaches = false;
      for (const Value* out : n->outputs()) reaches |= out && backward.count(out);
      if (!reaches) continue;
      for (const Value* in : graph::node_dependencies(*n, g_)) backward.insert(in);
    }
    for (const Value* v : forward)
      if (backward.count(v) && differentiable(v)) active_.insert(v);
    for (const Node* n : order_)
      for (const Value* out : n->outputs())
        if (out && active_.count(out)) active_nodes_.insert(n);
  }

  void seed_loss() {
    Value* seed;
    if (loss_->shape() && loss_->shape()->empty()) {
      seed = constant(scalar(loss_->dtype(), 1.0, {}), loss_->name() + "_grad");
    } else {  // ones shaped like the loss, known only at run time
      Value* shape = add("Shape", {loss_}, loss_->name() + "_shape", "")[0];
      Node* ones = g_.add_node("ConstantOfShape", {shape}, {g_.fresh_name(loss_->name() + "_grad")},
                               g_.fresh_name(loss_->name() + "_grad"));
      ones->set_attr(graph::Attribute::make_tensor("value", scalar(loss_->dtype(), 1.0, {1})));
      infer_node(model_, *ones, known_);
      ++backward_nodes_;
      seed = ones->output(0);
    }
    contributions_[loss_].push_back(seed);
  }

  void apply_rule(Node& n);

  // Contributions that are each A_t^T B_t (a Gemm with transA, as MatMul's rule writes a
  // weight's gradient from the flattened rows of the input and of dY), or the Transpose of one
  // (B_t^T A_t: dynamo transposes the weight ahead of each MatMul), sum to Concat(A_t)^T
  // Concat(B_t): one product over all the rows instead of one per use and a Sum. A weight read by
  // many MatMuls (dynamo's unrolled nn.RNN: its recurrent weight once per time step) gets one
  // product. The rows are summed in another order than the per-use products (float rounding).
  void join_weight_products(Value* v, std::vector<Value*>& parts) {
    // An emitted Gemm computing A^T B from two inputs.
    auto at_b = [&](const Value* out) -> Node* {
      Node* n = out ? out->producer() : nullptr;
      if (!n || !emitted_.count(out) || !is_op(*n, "", "Gemm") || n->inputs().size() != 2 ||
          n->attr_int("transA", 0) != 1 || n->attr_int("transB", 0) != 0 ||
          n->attr_float("alpha", 1.0f) != 1.0f)
        return nullptr;
      return n;
    };
    struct Product {
      Value* part;
      std::vector<Node*> nodes;  // the Gemm (and the Transpose after it)
      Value *a, *b;
    };
    std::vector<Product> products;
    for (Value* p : parts) {
      if (!same_static_shape(p, v) || !emitted_.count(p) || !p->uses().empty()) continue;
      if (Node* gemm = at_b(p)) {
        products.push_back({p, {gemm}, gemm->input(0), gemm->input(1)});
        continue;
      }
      Node* t = p->producer();
      if (!t || !is_op(*t, "", "Transpose") ||
          t->attr_ints("perm", {1, 0}) != std::vector<int64_t>{1, 0})
        continue;
      Node* gemm = t->input(0)->uses().size() == 1 ? at_b(t->input(0)) : nullptr;
      if (gemm) products.push_back({p, {t, gemm}, gemm->input(1), gemm->input(0)});
    }
    if (products.size() < 2) return;
    std::vector<Value*> as, bs;
    std::vector<Node*> dead;
    for (const Product& pr : products) {
      as.push_back(pr.a);
      bs.push_back(pr.b);
      dead.insert(dead.end(), pr.nodes.begin(), pr.nodes.end());
      std::erase(parts, pr.part);
      for (const Node* n : pr.nodes) emitted_.erase(n->output(0));
    }
    g_.remove_nodes(dead);
    backward_nodes_ -= static_cast<int>(dead.size());
    const auto axis0 = [] { return std::vector{graph::Attribute::make_int("axis", 0)}; };
    Value* a = add("Concat", as, v->name() + "_grad_rows", "", false, 1, axis0())[0];
    Value* b = add("Concat", bs, v->name() + "_grad_rows", "", false, 1, axis0())[0];
    parts.push_back(add("Gemm", {a, b}, v->name() + "_grad_joined", "", false, 1,
                        {graph::Attribute::make_int("transA", 1)})[0]);
  }

  // Contributions that are SliceGrads of v whose windows tile one axis (step 1, every other
  // axis whole) are the pieces of one tensor: a Concat of their dYs replaces those full-size,
  // zero-padded SliceGrads and their share of the Sum. dynamo's unrolled nn.RNN slices its
  // input projection once per time step (64 SliceGrads of the whole projection and a 64-input
  // Sum before); rotate_half's two halves are the same pattern. Pieces that leave a gap or
  // overlap stay SliceGrads.
  void join_slice_gradients(Value* v, std::vector<Value*>& parts) {
    if (!v->shape()) return;
    std::vector<int64_t> dims;
    for (const graph::Dim& d : *v->shape()) dims.push_back(d.is_known() ? d.value : -1);
    // Initializers, and constant nodes' outputs (Constant's value_ints too) through their
    // shape rule.
    const ops::ConstantOf constant_of = [this](const Value* c) -> const Tensor* {
      auto it = known_.find(c);
      if (it == known_.end() && c->producer() && c->producer()->inputs().empty()) {
        infer_node(model_, *c->producer(), known_);
        it = known_.find(c);
      }
      return it != known_.end() ? &it->second : nullptr;
    };
    const int64_t opset = model_.opset_version("").value_or(1);
    struct Piece {
      Value* part;
      int64_t start, count;
    };
    std::map<size_t, std::vector<Piece>> by_axis;
    for (Value* p : parts) {
      Node* n = p->producer();
      if (!n || !emitted_.count(p) || !p->uses().empty() ||
          !is_op(*n, ops::kOnnxtrainDomain, "SliceGrad"))
        continue;
      const auto w = ops::constant_slice_windows(*n, opset, dims, constant_of);
      if (!w) continue;
      std::optional<size_t> axis;
      bool one_axis = true;
      for (size_t k = 0; k < w->size(); ++k) {
        const ops::SliceWindow& x = (*w)[k];
        if (x.start == 0 && x.step == 1 && x.count == dims[k]) continue;  // whole
        one_axis &= !axis && x.step == 1;
        axis = k;
      }
      if (one_axis && axis) by_axis[*axis].push_back({p, (*w)[*axis].start, (*w)[*axis].count});
    }
    for (auto& [axis, pieces] : by_axis) {
      if (pieces.size() < 2) continue;
      std::sort(pieces.begin(), pieces.end(),
                [](const Piece& a, const Piece& b) { return a.start < b.start; });
      int64_t next = 0;
      for (const Piece& piece : pieces) next = piece.start == next ? next + piece.count : -1;
      if (next != dims[axis]) continue;
      std::vector<Value*> dys;
      std::vector<Node*> slice_grads;
      for (const Piece& piece : pieces) {
        slice_grads.push_back(piece.part->producer());
        dys.push_back(piece.part->producer()->input(0));
        std::erase(parts, piece.part);
        emitted_.erase(piece.part);
      }
      g_.remove_nodes(slice_grads);
      backward_nodes_ -= static_cast<int>(slice_grads.size());
      parts.push_back(add("Concat", dys, v->name() + "_grad_joined", "", false, 1,
                          {graph::Attribute::make_int("axis", static_cast<int64_t>(axis))})[0]);
    }
  }

  graph::Model& model_;
  Graph& g_;
  Value* loss_;
  ConstantValues known_;
  std::vector<Node*> order_;
  std::unordered_set<const Value*> active_;
  std::unordered_set<const Node*> active_nodes_;
  std::map<Value*, std::vector<Value*>> contributions_;
  std::map<Value*, Value*> sums_;     // value -> its summed gradient (fixed once read)
  std::map<Value*, int> owners_;      // gradient value -> how many values it is the gradient of
  std::unordered_set<const Value*> emitted_;
  int backward_nodes_ = 0;
};

// The GradientBuilder one rule sees: the forward node, the summed gradients of its outputs, and
// the Differentiator for everything it emits.
class NodeGradientBuilder final : public ops::GradientBuilder {
 public:
  NodeGradientBuilder(Differentiator& d, Node& n) : d_(d), n_(n) {
    base_ = (n.name.empty() ? n.op_type : n.name) + "/grad";
  }
  const Node& node() const override { return n_; }
  int64_t opset() const override { return d_.model().opset_version("").value_or(1); }
  Value* output_grad(int i) const override {
    Value* out = n_.output(static_cast<size_t>(i));
    return out && d_.is_active(out) ? d_.accumulated(out) : nullptr;
  }
  bool needs_input_grad(int i) const override {
    return d_.is_active(n_.input(static_cast<size_t>(i)));
  }
  void set_input_grad(int i, Value* grad) override {
    if (!needs_input_grad(i) || !grad) return;
    Value* in = n_.input(static_cast<size_t>(i));
    OT_CHECK(grad->dtype() == DataType::kUndefined || grad->dtype() == in->dtype(),
             n_.describe(), ": gradient rule produced a ", graph::dtype_short_name(grad->dtype()),
             " gradient for input ", i, " '", in->name(), "' of dtype ",
             graph::dtype_short_name(in->dtype()));
    d_.contribute(in, grad);
  }
  std::vector<Value*> emit(const std::string& op_type, const std::vector<Value*>& inputs,
                           int num_outputs, std::vector<graph::Attribute> attributes,
                           const std::string& domain) override {
    return d_.add(op_type, inputs, base_, domain, false, num_outputs, std::move(attributes));
  }
  Value* constant(Tensor value, const std::string& name_hint) override {
    return d_.constant(std::move(value), base_ + "/" + name_hint);
  }

 private:
  Differentiator& d_;
  Node& n_;
  std::string base_;
};

void Differentiator::apply_rule(Node& n) {
  bool any = false;
  for (Value* out : n.outputs()) any |= out && active_.count(out) && accumulated(out);
  if (!any) return;  // no gradient reached this node (a consumer's rule dropped it)
  const ops::OpSchema* s = schema_of(model_, n);
  NodeGradientBuilder b(*this, n);
  s->gradient(b);
}

}  // namespace

GradientInfo autodiff(graph::Model& model, const std::string& loss,
                      const std::vector<std::string>& wrt) {
  Graph& g = *model.graph;
  Value* loss_value = g.find_value(loss);
  OT_CHECK(loss_value, "autodiff: the loss '", loss, "' is not a value of the main graph");
  OT_CHECK(differentiable(loss_value), "autodiff: the loss '", loss, "' has dtype ",
           graph::dtype_short_name(loss_value->dtype()), "; it must be float or double");
  std::vector<Value*> params;
  for (const std::string& name : wrt) {
    Value* v = g.find_value(name);
    OT_CHECK(v, "autodiff: '", name, "' (to differentiate with respect to) is not a value of the "
                "main graph");
    OT_CHECK(differentiable(v), "autodiff: '", name, "' has dtype ",
             graph::dtype_short_name(v->dtype()), "; only float/double values have gradients");
    OT_CHECK(!g.lookup(name + "_grad"), "autodiff: the gradient name '", name,
             "_grad' is already used by a value of the model");
    params.push_back(v);
  }
  Differentiator d(model, loss_value, params);
  const std::vector<std::string> missing = d.missing_rules();
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    fail(model.source_path.empty() ? "" : model.source_path + ": ", "autodiff: ", missing.size(),
         " node(s) on a path to the loss have no gradient rule: ", list);
  }
  d.run();
  GradientInfo info;
  for (Value* p : params) {
    info.grads[p->name()] = d.finish(p)->name();
    model.training.gradients.push_back(
        {.param = p->name(), .grad = info.grads[p->name()], .reduced = "", .replica = -1, .bucket = -1});
  }
  info.backward_nodes = d.backward_nodes();
  return info;
}

}  // namespace onnxtrain::passes
