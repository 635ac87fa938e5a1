// Shared by the control-flow ops: graph attributes, body output types, and moving tensors
// between the runtime's views and the host tensors a Subgraph takes and returns.
#include "ops/control/body_util.h"

#include <cstring>
#include <map>

#include "ops/infer.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::control {

const graph::Graph& graph_attr(const graph::Node& node, const char* name,
                               const std::string& where) {
  const graph::Attribute* a = node.find_attr(name);
  OT_CHECK(a && a->type == graph::AttrType::kGraph, where, ": graph attribute '", name,
           "' is required");
  return a->g();
}

// The declared type of a body output, for the node output it becomes.
ValueType body_output_type(const graph::Graph& body, size_t i) {
  return i < body.outputs().size() ? body.outputs()[i]->type : ValueType{};
}

// Types of the body's outputs: the declared ones, with the dtype filled in by running every
// body node's inference where the body does not declare it (bodies inlined from functions,
// such as Range's, declare nothing). Best effort: a node that cannot be inferred stops it.
std::vector<ValueType> body_output_types(const graph::Graph& body, int64_t opset,
                                         const std::vector<const ValueType*>& input_types) {
  std::vector<ValueType> out;
  bool complete = true;
  for (const graph::Value* v : body.outputs()) {
    out.push_back(v->type);
    complete = complete && v->type.is_tensor() && v->type.dtype != DataType::kUndefined;
  }
  if (complete) return out;
  std::map<const graph::Value*, ValueType> known;
  for (size_t i = 0; i < body.inputs().size() && i < input_types.size(); ++i)
    if (input_types[i]) known[body.inputs()[i]] = *input_types[i];
  try {
    for (const graph::Node* n : body.topological_order()) {
      const OpSchema* schema = OpRegistry::global().find(n->domain, n->op_type, opset);
      if (!schema || !schema->infer) break;
      InferenceContext ictx{*n, opset, {}, {}, {}, {}};
      for (const graph::Value* v : n->inputs()) {
        auto it = v ? known.find(v) : known.end();
        ictx.input_types.push_back(!v ? nullptr : it != known.end() ? &it->second : &v->type);
        ictx.input_values.push_back(v && v->has_initializer() ? &v->initializer() : nullptr);
      }
      ictx.output_types.resize(n->outputs().size());
      ictx.output_values.resize(n->outputs().size());
      run_inference(*schema, ictx);
      for (size_t i = 0; i < n->outputs().size(); ++i)
        if (n->outputs()[i] && i < ictx.output_types.size())
          known[n->outputs()[i]] = ictx.output_types[i];
    }
  } catch (const Error&) {
    // Keep what is known; the kernel reports a real problem when it runs.
  }
  for (size_t i = 0; i < out.size(); ++i) {
    auto it = known.find(body.outputs()[i]);
    if (out[i].dtype == DataType::kUndefined && it != known.end() && it->second.is_tensor())
      out[i] = it->second;
  }
  return out;
}

graph::Tensor tensor_of(const TensorView& v) {
  graph::Tensor t(v.dtype, v.dims);
  if (v.dtype == DataType::kString) {
    if (v.strings) t.mutable_strings() = *v.strings;
  } else if (t.nbytes()) {
    std::memcpy(t.mutable_data(), v.data, t.nbytes());
  }
  return t;
}

void write_output(KernelContext& ctx, int i, const graph::Tensor& t, const std::string& where) {
  if (!ctx.has_output(i)) return;
  TensorView& y = ctx.output(i, t.dims());
  OT_CHECK(y.dtype == t.dtype(), where, ": output ", i, " is ", graph::dtype_short_name(t.dtype()),
           " but the node output is declared ", graph::dtype_short_name(y.dtype));
  if (t.dtype() == DataType::kString) {
    if (y.strings) *y.strings = t.strings();
  } else if (t.nbytes()) {
    std::memcpy(y.data, t.data(), t.nbytes());
  }
}

OpSchema make_control(const char* op, InferFn infer, KernelFactory kernel) {
  OpSchema s;
  s.op_type = op;
  s.infer = std::move(infer);
  s.cpu_kernel = std::move(kernel);
  s.foldable = false;  // bodies may depend on more than the explicit inputs
  return s;
}

}  // namespace onnxtrain::ops::control
