// prepare_training (passes.h): picks the output to train and its trainable parameters, and
// switches BatchNormalization and Dropout from inference to training mode.
#include <algorithm>
#include <regex>
#include <set>
#include <unordered_set>

#include "graph/dependencies.h"
#include "graph/error.h"
#include "passes/pass_util.h"
#include "passes/passes.h"

namespace onnxtrain::passes {

namespace {

using graph::Attribute;
using graph::DataType;
using graph::Graph;
using graph::Model;
using graph::Node;
using graph::Tensor;
using graph::Value;
using graph::ValueType;

// Float inputs that carry no gradient although they are float data: hyper-parameters and
// state an exporter stores as initializers. Integer inputs (shapes, axes, indices) need no
// entry: the walk never follows non-float values.
struct FixedInput {
  const char* op_type;
  int input;
  const char* why;
};
constexpr FixedInput kFixedInputs[] = {
    {"BatchNormalization", 3, "running mean: state the op updates itself"},
    {"BatchNormalization", 4, "running variance: state the op updates itself"},
    {"Clip", 1, "min bound: a hyper-parameter"},
    {"Clip", 2, "max bound: a hyper-parameter"},
    {"Dropout", 1, "ratio: a hyper-parameter"},
    {"Dropout", 2, "training_mode: a flag"},
    {"Pad", 2, "constant fill value"},
    {"Pow", 1, "exponent: exporters spell x^2 and sqrt with it"},
    {"Resize", 1, "roi: geometry, not data"},
    {"Resize", 2, "scales: geometry, not data"},
    {"Upsample", 1, "scales: geometry, not data"},
};

bool is_fixed_input(const Node& n, size_t input) {
  if (!n.domain.empty() && n.domain != "ai.onnx") return false;
  return std::any_of(std::begin(kFixedInputs), std::end(kFixedInputs), [&](const FixedInput& f) {
    return n.op_type == f.op_type && static_cast<size_t>(f.input) == input;
  });
}

bool is_onnx(const Node& n, const char* op_type) { return is_op(n, "", op_type); }

std::string where(const Model& m) {
  return m.source_path.empty() ? "prepare_training: " : m.source_path + ": prepare_training: ";
}

DataType dtype_of(const Value* v) {
  if (v->type.dtype != DataType::kUndefined) return v->type.dtype;
  return v->has_initializer() ? v->initializer().dtype() : DataType::kUndefined;
}

bool is_trainable_dtype(DataType t) {
  return t == DataType::kFloat || t == DataType::kDouble || t == DataType::kFloat16;
}

std::string dtype_text(const Value* v) {
  const DataType t = dtype_of(v);
  return t == DataType::kUndefined ? "untyped: run infer_shapes first"
                                   : std::string(graph::dtype_short_name(t));
}

std::string output_list(const Graph& g) {
  std::string s;
  for (const Value* v : g.outputs())
    s += cat(s.empty() ? "'" : ", '", v->name(), "' (", dtype_text(v), ")");
  return s.empty() ? "none" : s;
}

// The graph output to train: `name`, or the first output of a float dtype.
Value* trained_output(const Model& m, const std::string& name) {
  const Graph& g = *m.graph;
  Value* out = nullptr;
  if (!name.empty()) {
    for (Value* v : g.outputs())
      if (v->name() == name) out = v;
    OT_CHECK(out, where(m), "output '", name, "' is not a graph output (outputs: ", output_list(g),
             ")");
    OT_CHECK(graph::is_float_dtype(dtype_of(out)), where(m), "output '", name, "' has dtype ",
             dtype_text(out), ", only a float output can be trained");
  } else {
    for (Value* v : g.outputs())
      if (graph::is_float_dtype(dtype_of(v))) {
        out = v;
        break;
      }
    OT_CHECK(out, where(m), "the model has no float output to train (outputs: ", output_list(g),
             ")");
  }
  OT_CHECK(out->producer(), where(m), "output '", out->name(),
           "' is not computed by any node (it is a graph input or an initializer)");
  return out;
}

// Softmax over the class axis 1 of (N, C, ...). Before opset 13 Softmax flattens everything
// from `axis` on, which is the class axis alone only for a rank-2 input.
bool is_class_softmax(const Node& n, int64_t opset) {
  if (!is_onnx(n, "Softmax") || !n.input(0)) return false;
  const auto& shape = n.input(0)->shape();
  const int64_t rank = shape ? static_cast<int64_t>(shape->size()) : -1;
  int64_t axis = n.attr_int("axis", opset < 13 ? 1 : -1);
  if (axis < 0 && rank > 0) axis += rank;
  return axis == 1 && (opset >= 13 || rank == 2);
}

// The value the loss attaches to: the Softmax input when the output is a class softmax
// (possibly behind Identity), so the loss sees logits and stays numerically stable.
Value* logits_of(Value* out, int64_t opset) {
  Value* v = out;
  while (v->producer() && is_onnx(*v->producer(), "Identity") && v->producer()->input(0))
    v = v->producer()->input(0);
  if (v->producer() && is_class_softmax(*v->producer(), opset)) return v->producer()->input(0);
  return out;
}

// torch.export's record of what an initializer was in the module, which torch's dynamo exporter
// (torch.onnx.export(dynamo=True), torch 2.5+) writes into the value's metadata: PARAMETER,
// BUFFER (running statistics, a rotary embedding's inv_freq, position ids), CONSTANT_TENSOR.
constexpr const char* kTorchInputKindKey = "pkg.torch.export.graph_signature.InputSpec.kind";

// True when the exporter marked `v` as something other than a parameter of the module.
bool marked_not_parameter(const Value& v) {
  for (const auto& [key, value] : v.metadata)
    if (key == kTorchInputKindKey) return value != "PARAMETER";
  return false;
}

// Initializers the trained value depends on through float data (minus the fixed inputs).
std::unordered_set<const Value*> reachable_parameters(Value* from) {
  std::unordered_set<const Value*> seen, params;
  std::vector<Value*> work = {from};
  while (!work.empty()) {
    Value* v = work.back();
    work.pop_back();
    if (!seen.insert(v).second) continue;
    if (v->has_initializer()) {
      const Tensor& t = v->initializer();
      // Rank 0: constants such as sqrt(d) that exporters fold into initializers.
      if (is_trainable_dtype(t.dtype()) && t.rank() > 0) params.insert(v);
      continue;
    }
    const Node* p = v->producer();
    if (!p) continue;
    for (size_t i = 0; i < p->inputs().size(); ++i) {
      Value* in = p->input(i);
      if (!in || is_fixed_input(*p, i)) continue;
      const DataType t = dtype_of(in);
      // Untyped values are followed: a missing type must not silently drop parameters.
      if (t != DataType::kUndefined && !graph::is_float_dtype(t)) continue;
      work.push_back(in);
    }
    // What an If branch or a Loop body reads from this graph (a weight read inside a Loop is a
    // parameter of the model; autodiff then names the node it cannot differentiate).
    if (graph::has_subgraphs(*p))
      for (Value* in : graph::node_dependencies(*p, *p->owner())) {
        const DataType t = dtype_of(in);
        if (std::find(p->inputs().begin(), p->inputs().end(), in) == p->inputs().end() &&
            (t == DataType::kUndefined || graph::is_float_dtype(t)))
          work.push_back(in);
      }
  }
  return params;
}

std::regex compile(const Model& m, const char* option, const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail(where(m), option, " '", pattern, "' is not a valid regular expression: ", e.what());
  }
}

// Applies trainable_regex, then freeze_regex (regex_search: a match anywhere in the name). A
// pattern must match at least one candidate, or it is most likely a typo.
std::vector<std::string> filter_parameters(const Model& m, const std::vector<std::string>& all,
                                           const std::vector<std::string>& buffers,
                                           const TrainableOptions& opts) {
  std::vector<std::string> names = all;
  auto apply = [&](const char* option, const std::string& pattern, bool keep_matches) {
    if (pattern.empty()) return;
    const std::regex re = compile(m, option, pattern);
    auto matches = [&](const std::string& n) { return std::regex_search(n, re); };
    const auto buffer = std::find_if(buffers.begin(), buffers.end(), matches);
    OT_CHECK(std::any_of(all.begin(), all.end(), matches), where(m), option, " '", pattern,
             "' matches none of the ", all.size(), " trainable parameters (the first is '",
             all.front(), "')",
             buffer == buffers.end()
                 ? std::string()
                 : cat("; '", *buffer, "' is a buffer the exporter marked, which stays fixed"));
    std::erase_if(names,
                  [&](const std::string& n) { return std::regex_search(n, re) != keep_matches; });
  };
  apply("trainable_regex", opts.trainable_regex, true);
  apply("freeze_regex", opts.freeze_regex, false);
  return names;
}

// ---- training mode

ValueType type_of(const Tensor& t) {
  return ValueType::tensor(t.dtype(), graph::make_shape(t.dims()));
}

// A node cannot grow outputs in place: a copy with the extra output names takes its place
// (same name, attributes, device, position), existing outputs keep their names and uses.
Node* with_outputs(Graph& g, Node* old, const std::vector<std::string>& extra) {
  std::vector<std::string> names;
  for (const Value* out : old->outputs())
    names.push_back(out ? g.fresh_name(out->name() + ".tmp") : "");
  const size_t first_new = names.size();
  for (size_t i = 0; i < extra.size(); ++i) {
    if (i + 1 < first_new) {
      OT_CHECK(!old->output(i + 1) || extra[i].empty(), "internal: output ", i + 1, " of ",
               old->describe(), " already exists");
      if (!extra[i].empty()) names[i + 1] = extra[i];
    } else {
      names.push_back(extra[i]);
    }
  }
  Node* n = g.insert_node_before(old, old->op_type, old->inputs(), names, "", old->domain);
  n->attributes = old->attributes;
  n->device = old->device;
  n->doc_string = old->doc_string;
  std::vector<std::string> old_names;
  for (size_t i = 0; i < old->outputs().size(); ++i) {
    Value* from = old->output(i);
    old_names.push_back(from ? from->name() : "");
    if (!from) continue;
    n->output(i)->type = from->type;
    n->output(i)->doc_string = from->doc_string;
    g.replace_all_uses(from, n->output(i));
  }
  n->name = old->name;
  g.remove_node(old);
  for (size_t i = 0; i < old_names.size(); ++i)
    if (!old_names[i].empty()) g.rename_value(n->output(i), old_names[i]);
  return n;
}

// Exporters that fold constants (torch's classic exporter in eval mode, the dynamo exporter's
// optimizer) merge initializers with equal values: every BatchNormalization's zero running mean
// may become one tensor, possibly also a zero bias. Running statistics are per-layer state, so a
// statistic read by anything else than its own BN slot gets a copy for that BN (the first BN
// keeps the original when only BN statistic slots share it); a Constant node's value becomes an
// initializer. Returns one line per copy made.
std::vector<std::string> untie_running_statistics(Graph& g) {
  std::vector<std::string> notes;
  std::unordered_set<const Value*> claimed;
  auto is_stat_use = [](const graph::Use& u) {
    return is_onnx(*u.node, "BatchNormalization") && (u.input_index == 3 || u.input_index == 4);
  };
  std::vector<Node*> bns;
  for (const auto& n : g.nodes())
    if (is_onnx(*n, "BatchNormalization")) bns.push_back(n.get());
  for (Node* n : bns)
    for (size_t slot : {size_t{3}, size_t{4}}) {
      Value* v = slot < n->inputs().size() ? n->input(slot) : nullptr;
      if (!v) continue;
      const Node* p = v->producer();
      const graph::Attribute* value =
          p && is_onnx(*p, "Constant") ? p->find_attr("value") : nullptr;
      if (!v->has_initializer() && !(value && value->type == graph::AttrType::kTensor)) continue;
      const bool shared = v->uses().size() > 1 || v->is_graph_output();
      const bool only_stats =
          std::all_of(v->uses().begin(), v->uses().end(), is_stat_use) && !v->is_graph_output();
      if (v->has_initializer() && !shared) continue;
      if (v->has_initializer() && only_stats && claimed.insert(v).second) continue;
      graph::Tensor t = v->has_initializer() ? v->initializer() : value->t();
      Value* copy = g.add_initializer(g.fresh_name(v->name()), std::move(t), false);
      n->set_input(slot, copy);
      notes.push_back("running statistic '" + v->name() + "' of " + n->describe() +
                      (v->has_initializer() ? " is shared" : " is a Constant") +
                      ": it trains as its own copy '" + copy->name() + "'");
    }
  return notes;
}

struct BnStats {
  Node* node;
  Value* mean;
  Value* var;
};

// Every BatchNormalization with its running statistics, checked before anything changes.
std::vector<BnStats> batch_norms(const Model& m) {
  const Graph& g = *m.graph;
  std::vector<BnStats> out;
  std::set<std::string> updated;
  for (const auto& node : g.nodes()) {
    if (!is_onnx(*node, "BatchNormalization")) continue;
    BnStats s{node.get(), node->input(3), node->input(4)};
    for (Value* v : {s.mean, s.var}) {
      OT_CHECK(v && v->has_initializer(), where(m), node->describe(), ": running statistic '",
               v ? v->name() : "", "' is not an initializer, so training cannot update it");
      const std::string name = v->name() + ".updated";
      OT_CHECK(updated.insert(name).second, where(m), node->describe(), ": running statistic '",
               v->name(), "' is shared with another BatchNormalization");
      const Value* clash = g.find_value(name);
      const bool own = clash && clash->producer() == node.get();
      OT_CHECK(!clash || own, where(m), node->describe(), ": value '", name,
               "' already exists (was the model prepared twice?)");
    }
    out.push_back(s);
  }
  return out;
}

// opset >= 14: training_mode=1 with outputs (Y, running_mean, running_var). Before: training is
// the presence of outputs 1.. (mean, var, saved_mean, saved_var); the saved_* stay omitted.
// Outputs 1 and 2 hold the updated running statistics in both forms.
void switch_batch_norm(Graph& g, const BnStats& s, int64_t opset) {
  Node* n = s.node;
  const std::string mean_name = s.mean->name() + ".updated";
  const std::string var_name = s.var->name() + ".updated";
  if (opset >= 14) n->set_attr(Attribute::make_int("training_mode", 1));
  if (opset < 7) n->set_attr(Attribute::make_int("is_test", 0));
  std::vector<std::string> extra = {n->output(1) ? "" : mean_name, n->output(2) ? "" : var_name};
  if (!extra[0].empty() || !extra[1].empty()) n = with_outputs(g, n, extra);
  // Outputs an exporter already requested take the contract names.
  if (n->output(1)->name() != mean_name) g.rename_value(n->output(1), mean_name);
  if (n->output(2)->name() != var_name) g.rename_value(n->output(2), var_name);
  n->output(1)->type = type_of(s.mean->initializer());
  n->output(2)->type = type_of(s.var->initializer());
  for (Value* v : {n->output(1), n->output(2)})
    if (!v->is_graph_output()) g.add_output(v);
}

// opset >= 12: training_mode input = true, and the mask output DropoutGrad reads. Before 12
// Dropout has no training switch this runtime honours: opsets 7-11 define none (the mode is
// the runtime's), and ops/shape/dropout.cc runs every pre-12 Dropout as the identity, so such
// a node stays an identity in training; opsets < 7 get is_test=0 for the record.
void switch_dropout(Graph& g, Node* n, int64_t opset, Value*& true_flag) {
  if (opset < 7) n->set_attr(Attribute::make_int("is_test", 0));
  if (opset < 12) return;
  if (!true_flag) {
    true_flag = g.add_initializer(g.fresh_name("dropout.training_mode"),
                                  Tensor::from_vector<uint8_t>(DataType::kBool, {}, {1}));
    true_flag->type = ValueType::tensor(DataType::kBool, graph::Shape{});
  }
  n->set_input(2, true_flag);
  if (n->outputs().size() < 2 || !n->output(1)) {
    // Rebuilding the node replaces its output values: copy what is needed first.
    const std::optional<graph::Shape> y_shape = n->output(0)->type.shape;
    n = with_outputs(g, n, {g.fresh_name(n->output(0)->name() + ".mask")});
    n->output(1)->type = ValueType::tensor(DataType::kBool, y_shape);
  }
}

}  // namespace

UntieReport untie_initializers(graph::Model& model, bool untie) {
  Graph& g = *model.graph;
  UntieReport report;
  for (const std::string& line : untie_running_statistics(g)) report.copied.push_back(line);
  std::vector<Value*> inits;
  for (Value* v : g.initializers()) inits.push_back(v);
  for (Value* v : inits) {
    const Tensor& t = v->initializer();
    if (!is_trainable_dtype(t.dtype()) || t.rank() == 0 || v->uses().size() < 2 ||
        v->is_graph_output())
      continue;
    const graph::Use first = v->uses().front();
    const bool same_slot = std::all_of(v->uses().begin(), v->uses().end(), [&](const graph::Use& u) {
      return u.input_index == first.input_index && u.node->op_type == first.node->op_type &&
             u.node->domain == first.node->domain;
    });
    // Slices, Splits and Gathers of one tensor read pieces of one parameter (torch's dynamo
    // exporter slices an LSTM's W into its four gates): not a merge.
    const bool pieces = first.input_index == 0 && first.node->domain.empty() &&
                        (first.node->op_type == "Slice" || first.node->op_type == "Split" ||
                         first.node->op_type == "Gather");
    if (!same_slot || pieces) continue;
    const std::string what = cat("initializer '", v->name(), "' feeds ", v->uses().size(), " ",
                                 first.node->op_type, " nodes (input ", first.input_index, ")");
    if (!untie) {
      report.tied.push_back(cat(what, ": an exporter probably merged equal initial values; they "
                                      "train as one tensor (--untie-initializers gives each its own)"));
      continue;
    }
    const std::vector<graph::Use> uses = v->uses();
    for (size_t k = 1; k < uses.size(); ++k) {
      Value* copy = g.add_initializer(g.fresh_name(cat(v->name(), ".", k)), t, false);
      uses[k].node->set_input(static_cast<size_t>(uses[k].input_index), copy);
      report.copied.push_back(cat(what, ": ", uses[k].node->describe(), " trains its own copy '",
                                  copy->name(), "'"));
    }
  }
  return report;
}

PreparedModel prepare_training(graph::Model& model, const TrainableOptions& opts,
                               const std::string& output) {
  Graph& g = *model.graph;
  OT_CHECK(model.training.empty(), where(model),
           "the model already has a training signature (was it prepared twice?)");
  const int64_t opset = model.opset_version("").value_or(1);
  Value* out = trained_output(model, output);
  PreparedModel prepared;
  prepared.untied = untie_running_statistics(g);
  prepared.logits = logits_of(out, opset)->name();

  const std::unordered_set<const Value*> reachable = reachable_parameters(out);
  std::vector<std::string> candidates;
  for (const Value* v : g.initializers()) {
    if (!reachable.count(v)) continue;
    if (marked_not_parameter(*v))
      prepared.buffers.push_back(v->name());
    else
      candidates.push_back(v->name());
  }
  OT_CHECK(!candidates.empty(), where(model), "no float initializer feeds output '", out->name(),
           "', so there is nothing to train",
           prepared.buffers.empty()
               ? std::string()
               : cat(" (the exporter marked the ", prepared.buffers.size(),
                     " that do as buffers, e.g. '", prepared.buffers.front(), "')"));
  prepared.params = filter_parameters(model, candidates, prepared.buffers, opts);
  OT_CHECK(!prepared.params.empty(), where(model),
           "freeze_regex / trainable_regex leave no trainable parameter (freeze_regex '",
           opts.freeze_regex, "', trainable_regex '", opts.trainable_regex, "')");

  const std::vector<BnStats> bns =
      opts.freeze_batch_norm ? std::vector<BnStats>{} : batch_norms(model);
  for (const BnStats& s : bns) {
    prepared.bn_running_stats.push_back(s.mean->name());
    prepared.bn_running_stats.push_back(s.var->name());
  }
  // Node pointers change while nodes are rebuilt, so collect first.
  std::vector<Node*> dropouts;
  for (const auto& n : g.nodes())
    if (is_onnx(*n, "Dropout")) dropouts.push_back(n.get());
  for (const BnStats& s : bns) switch_batch_norm(g, s, opset);
  Value* true_flag = nullptr;
  for (Node* n : dropouts) switch_dropout(g, n, opset, true_flag);

  graph::TrainingSignature& sig = model.training;
  for (const Value* in : g.inputs())
    if (!in->has_initializer()) sig.inputs.push_back({in->name(), graph::InputRole::kBatch});
  for (const BnStats& s : bns)
    for (const Value* v : {s.mean, s.var})
      sig.state.push_back({.state = v->name(),
                           .updated = v->name() + ".updated",
                           .kind = graph::StateKind::kRunningStatistic,
                           .original = v->name(),
                           .replica = -1});
  return prepared;
}

}  // namespace onnxtrain::passes
