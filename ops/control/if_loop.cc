// Control flow: If (run one of two branches) and Loop (run a body while a counter and a
// condition allow, carrying values and stacking per-iteration scan outputs). Bodies run through
// KernelContext::subgraph, so the runtime plans them like models. Tensors only (no sequence or
// optional values); never folded at plan time; no gradient.
#include <cstring>
#include <limits>

#include "ops/control/body_util.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::control {
namespace {

// Two branch types merged: same dtype, dims kept where both agree.
ValueType merge(const ValueType& a, const ValueType& b) {
  if (!a.is_tensor()) return b;
  if (!b.is_tensor()) return a;
  ValueType out = a;
  if (out.dtype == DataType::kUndefined) out.dtype = b.dtype;
  if (!a.shape || !b.shape || a.shape->size() != b.shape->size()) {
    out.shape.reset();
    return out;
  }
  Shape merged;
  for (size_t d = 0; d < a.shape->size(); ++d) {
    const Dim &x = (*a.shape)[d], &y = (*b.shape)[d];
    merged.push_back(x.is_known() && y.is_known() && x.value == y.value ? x : Dim{});
  }
  out.shape = std::move(merged);
  return out;
}

// A 1-element tensor's value as bool / int64 (cond, M).
bool truth(const TensorView& v, const std::string& where, const char* what) {
  OT_CHECK(v.numel() == 1 && v.dtype == DataType::kBool, where, ": '", what,
           "' must be one bool, got ", v.numel(), " ", graph::dtype_short_name(v.dtype));
  return *v.as<uint8_t>() != 0;
}
bool truth(const graph::Tensor& t, const std::string& where, const char* what) {
  OT_CHECK(t.numel() == 1 && t.dtype() == DataType::kBool, where, ": body output '", what,
           "' must be one bool, got ", t.numel(), " ", graph::dtype_short_name(t.dtype()));
  return *t.data_as<uint8_t>() != 0;
}

// ---- If: cond () bool -> outputs of then_branch or else_branch

void infer_if(InferenceContext& ctx) {
  const graph::Graph& then_g = graph_attr(ctx.node, "then_branch", ctx.where());
  const graph::Graph& else_g = graph_attr(ctx.node, "else_branch", ctx.where());
  OT_CHECK(then_g.outputs().size() == else_g.outputs().size(), ctx.where(), ": then_branch has ",
           then_g.outputs().size(), " outputs, else_branch ", else_g.outputs().size());
  OT_CHECK(ctx.node.outputs().size() <= then_g.outputs().size(), ctx.where(), ": the node has ",
           ctx.node.outputs().size(), " outputs, the branches ", then_g.outputs().size());
  auto then_t = body_output_types(then_g, ctx.opset, {});
  auto else_t = body_output_types(else_g, ctx.opset, {});
  for (size_t i = 0; i < ctx.node.outputs().size(); ++i)
    ctx.output_types[i] = merge(then_t[i], else_t[i]);
}

class IfKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    OT_CHECK(ctx.input(0), where, ": input 'cond' is required");
    const char* branch = truth(*ctx.input(0), where, "cond") ? "then_branch" : "else_branch";
    std::vector<graph::Tensor> outs = ctx.subgraph(branch).run({});
    OT_CHECK(outs.size() >= static_cast<size_t>(ctx.num_outputs()), where, ": ", branch,
             " produced ", outs.size(), " outputs, the node has ", ctx.num_outputs());
    for (int i = 0; i < ctx.num_outputs(); ++i) write_output(ctx, i, outs[i], where);
  }
};

// ---- Loop: M () int64 opt, cond () bool opt, v_initial (N) -> v_final (N), scans (K)
// body: (iteration_num, cond, v (N)) -> (cond, v (N), scan values (K))

void infer_loop(InferenceContext& ctx) {
  const graph::Graph& body = graph_attr(ctx.node, "body", ctx.where());
  const size_t n = ctx.node.inputs().size() < 2 ? 0 : ctx.node.inputs().size() - 2;
  OT_CHECK(body.inputs().size() == n + 2, ctx.where(), ": the body takes ", body.inputs().size(),
           " inputs, expected ", n + 2, " (iteration_num, cond and ", n, " loop-carried values)");
  OT_CHECK(body.outputs().size() >= n + 1 && ctx.node.outputs().size() <= body.outputs().size() - 1,
           ctx.where(), ": the body has ", body.outputs().size(), " outputs for ", n,
           " loop-carried values and ", ctx.node.outputs().size(), " node outputs");
  const ValueType iter_t = ValueType::tensor(DataType::kInt64, Shape{});
  const ValueType cond_t = ValueType::tensor(DataType::kBool, Shape{});
  std::vector<const ValueType*> in_types{&iter_t, &cond_t};
  for (size_t i = 0; i < n; ++i) in_types.push_back(ctx.input_type(i + 2));
  const std::vector<ValueType> body_t = body_output_types(body, ctx.opset, in_types);
  // Shapes may change from one iteration to the next: only dtypes (and ranks of scans) are known.
  for (size_t i = 0; i < ctx.node.outputs().size(); ++i) {
    ValueType t = body_t[i + 1];
    if (i < n && ctx.input_type(i + 2)) t.dtype = ctx.input_type(i + 2)->dtype;
    if (t.is_tensor() && t.shape && i >= n) {
      Shape s(1);
      s.insert(s.end(), t.shape->begin(), t.shape->end());
      t.shape = s;
    }
    if (i < n) t.shape.reset();
    if (t.is_tensor() && t.shape)
      for (auto& d : *t.shape) d = Dim{};
    ctx.output_types[i] = t;
  }
}

class LoopKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const int n = ctx.num_inputs() - 2;
    OT_CHECK(n >= 0, where, ": Loop takes at least 2 inputs (M, cond), got ", ctx.num_inputs());
    int64_t max_trip = std::numeric_limits<int64_t>::max();
    if (const TensorView* m = ctx.input(0)) {
      auto v = shape::view_ints(*m, where);
      OT_CHECK(v.size() == 1, where, ": 'M' must hold one value, got ", v.size());
      max_trip = v[0];
    }
    bool cond = ctx.input(1) ? truth(*ctx.input(1), where, "cond") : true;
    std::vector<graph::Tensor> state(static_cast<size_t>(n) + 2);
    for (int i = 0; i < n; ++i) {
      const TensorView* v = ctx.input(i + 2);
      OT_CHECK(v, where, ": loop-carried input ", i + 2, " is missing");
      state[static_cast<size_t>(i) + 2] = tensor_of(*v);
    }
    Subgraph& body = ctx.subgraph("body");
    const int k = ctx.num_outputs() - n;
    std::vector<std::vector<graph::Tensor>> scans(static_cast<size_t>(std::max(k, 0)));
    for (int64_t it = 0; it < max_trip && cond; ++it) {
      state[0] = graph::Tensor::from_vector(DataType::kInt64, {}, std::vector<int64_t>{it});
      state[1] = graph::Tensor::from_vector(DataType::kBool, {}, std::vector<uint8_t>{1});
      std::vector<graph::Tensor> outs = body.run(state);
      OT_CHECK(outs.size() == static_cast<size_t>(1 + n + std::max(k, 0)), where,
               ": the body produced ", outs.size(), " outputs, expected ", 1 + n + std::max(k, 0));
      // As the ONNX reference and onnxruntime do, the body's condition always decides.
      cond = truth(outs[0], where, "cond");
      for (int i = 0; i < n; ++i) state[static_cast<size_t>(i) + 2] = std::move(outs[1 + i]);
      for (int j = 0; j < k; ++j) scans[j].push_back(std::move(outs[1 + n + j]));
    }
    for (int i = 0; i < n; ++i) write_output(ctx, i, state[static_cast<size_t>(i) + 2], where);
    for (int j = 0; j < k; ++j) write_scan(ctx, n + j, scans[j], where);
  }

 private:
  // scans (iterations, each (d..)) -> (iterations, d..)
  static void write_scan(KernelContext& ctx, int out, const std::vector<graph::Tensor>& parts,
                         const std::string& where) {
    if (!ctx.has_output(out)) return;
    std::vector<int64_t> dims{static_cast<int64_t>(parts.size())};
    if (parts.empty()) {
      // No iteration ran: (0, d..) with the body's declared dims when it declares them all.
      const graph::Graph& body = graph_attr(ctx.node(), "body", where);
      const int n = ctx.num_inputs() - 2;
      if (auto item = known_dims(body_output_type(body, static_cast<size_t>(out - n) + 1 + n)))
        dims.insert(dims.end(), item->begin(), item->end());
      ctx.output(out, dims);
      return;
    }
    const std::vector<int64_t>& item = parts[0].dims();
    dims.insert(dims.end(), item.begin(), item.end());
    for (size_t i = 1; i < parts.size(); ++i)
      OT_CHECK(parts[i].dims() == item && parts[i].dtype() == parts[0].dtype(), where,
               ": scan output ", out, " changes shape or dtype at iteration ", i);
    graph::Tensor stacked(parts[0].dtype(), dims);
    if (stacked.dtype() == DataType::kString) {
      auto& s = stacked.mutable_strings();
      s.clear();
      for (const auto& p : parts) s.insert(s.end(), p.strings().begin(), p.strings().end());
    } else {
      std::byte* dst = stacked.mutable_data();
      for (const auto& p : parts) {
        if (p.nbytes()) std::memcpy(dst, p.data(), p.nbytes());
        dst += p.nbytes();
      }
    }
    write_output(ctx, out, stacked, where);
  }
};

}  // namespace

ONNXTRAIN_REGISTER_OP(if_1) {
  return make_control("If", infer_if,
                      [](const graph::Node&) { return std::make_unique<IfKernel>(); });
}
ONNXTRAIN_REGISTER_OP(loop_1) {
  return make_control("Loop", infer_loop,
                      [](const graph::Node&) { return std::make_unique<LoopKernel>(); });
}

}  // namespace onnxtrain::ops::control
