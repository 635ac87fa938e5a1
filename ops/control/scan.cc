// Scan (opsets 8, 9+): run a body once per slice of the scan inputs, carrying state values and
// stacking the per-iteration scan outputs. Opset 9+ scans along any axis in either direction;
// opset 8 has a leading batch axis (each batch row runs its own scan over axis 1) and optional
// per-row sequence lengths. Bodies run through KernelContext::subgraph; no gradient.
#include <algorithm>
#include <cstring>

#include "ops/control/body_util.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::control {
namespace {

size_t elem_bytes(DataType dt, const std::string& where) {
  const int bits = graph::dtype_bits(dt);
  OT_CHECK(bits >= 8 && dt != DataType::kString, where, ": dtype ", graph::dtype_short_name(dt),
           " is not supported by Scan");
  return static_cast<size_t>(bits / 8);
}

// The (outer, len, inner) factorisation of dims around `axis`.
struct Around {
  int64_t outer = 1, len = 1, inner = 1;
};
Around around(const std::vector<int64_t>& dims, size_t axis) {
  Around a;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (d < axis) a.outer *= dims[d];
    if (d == axis) a.len = dims[d];
    if (d > axis) a.inner *= dims[d];
  }
  return a;
}

// x: (.., len, ..) -> x[.., t, ..] with the axis dropped
graph::Tensor slice(const graph::Tensor& x, size_t axis, int64_t t, const std::string& where) {
  std::vector<int64_t> dims = x.dims();
  const Around a = around(dims, axis);
  dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
  graph::Tensor out(x.dtype(), dims);
  const size_t row = static_cast<size_t>(a.inner) * elem_bytes(x.dtype(), where);
  std::byte* dst = out.mutable_data();
  for (int64_t o = 0; o < a.outer; ++o)
    if (row) std::memcpy(dst + o * row, x.data() + (o * a.len + t) * row, row);
  return out;
}

// items[p] (each d..) -> (d[:axis], len, d[axis:]) with item p at position p
graph::Tensor stack(const std::vector<graph::Tensor>& items, size_t axis, DataType dt,
                    const std::vector<int64_t>& item_dims, const std::string& where) {
  std::vector<int64_t> dims = item_dims;
  dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(axis), static_cast<int64_t>(items.size()));
  graph::Tensor out(dt, dims);
  const Around a = around(dims, axis);
  const size_t row = static_cast<size_t>(a.inner) * elem_bytes(dt, where);
  std::byte* dst = out.mutable_data();
  for (size_t p = 0; p < items.size(); ++p) {
    OT_CHECK(items[p].dims() == item_dims && items[p].dtype() == dt, where,
             ": a scan output changes shape or dtype at iteration ", p);
    for (int64_t o = 0; o < a.outer; ++o)
      if (row)
        std::memcpy(dst + (o * a.len + static_cast<int64_t>(p)) * row, items[p].data() + o * row,
                    row);
  }
  return out;
}

// Runs the body over `scans` (already laid out with the scan axis given per input) and
// returns the final states followed by the stacked scan outputs.
struct ScanConfig {
  std::vector<size_t> in_axes;
  std::vector<bool> in_reverse;
  std::vector<int64_t> out_axes;  // may be negative (count from the end of the output rank)
  std::vector<bool> out_reverse;
  int64_t length = -1;  // iterations; -1: the scan inputs' length
};

std::vector<graph::Tensor> scan_once(Subgraph& body, std::vector<graph::Tensor> states,
                                     const std::vector<graph::Tensor>& scans, size_t num_outputs,
                                     const ScanConfig& cfg, const std::string& where) {
  const size_t n = states.size(), m = scans.size();
  OT_CHECK(num_outputs >= n, where, ": the body returns fewer values than the ", n, " states");
  int64_t len = cfg.length;
  for (size_t j = 0; j < m; ++j) {
    const int64_t l = scans[j].dims()[cfg.in_axes[j]];
    if (cfg.length < 0) {
      OT_CHECK(len < 0 || len == l, where, ": scan inputs have different lengths ", len, " and ",
               l);
      len = l;
    }
  }
  len = std::max<int64_t>(len, 0);
  const size_t k = num_outputs - n;
  std::vector<std::vector<graph::Tensor>> items(k);
  std::vector<graph::Tensor> in(n + m);
  for (int64_t t = 0; t < len; ++t) {
    for (size_t i = 0; i < n; ++i) in[i] = states[i];
    for (size_t j = 0; j < m; ++j)
      in[n + j] = slice(scans[j], cfg.in_axes[j], cfg.in_reverse[j] ? len - 1 - t : t, where);
    std::vector<graph::Tensor> out = body.run(in);
    OT_CHECK(out.size() == num_outputs, where, ": the body produced ", out.size(),
             " outputs, expected ", num_outputs);
    for (size_t i = 0; i < n; ++i) states[i] = std::move(out[i]);
    for (size_t q = 0; q < k; ++q) items[q].push_back(std::move(out[n + q]));
  }
  std::vector<graph::Tensor> result = std::move(states);
  for (size_t q = 0; q < k; ++q) {
    OT_CHECK(!items[q].empty(), where, ": scan output ", q, " of a zero-length scan has no shape");
    if (cfg.out_reverse[q]) std::reverse(items[q].begin(), items[q].end());
    const auto rank = static_cast<int64_t>(items[q][0].dims().size()) + 1;
    const auto axis = static_cast<size_t>(normalize_axis(cfg.out_axes[q], rank, where));
    result.push_back(stack(items[q], axis, items[q][0].dtype(), items[q][0].dims(), where));
  }
  return result;
}

std::vector<int64_t> ints_attr(const graph::Node& node, const char* name, size_t count,
                               int64_t fallback, const std::string& where) {
  std::vector<int64_t> v = node.attr_ints(name, std::vector<int64_t>(count, fallback));
  OT_CHECK(v.size() == count, where, ": attribute ", name, " has ", v.size(), " values, expected ",
           count);
  return v;
}

// ---- inference: states keep their dtype, scan outputs take the body's; shapes are dynamic.

void infer_scan(InferenceContext& ctx) {
  const graph::Graph& body = graph_attr(ctx.node, "body", ctx.where());
  const int64_t m = ctx.node.attr_int("num_scan_inputs", 0);
  const size_t first = ctx.opset < 9 ? 1 : 0;  // opset 8: sequence_lens comes first
  const size_t total = ctx.node.inputs().size();
  OT_CHECK(m >= 1 && static_cast<size_t>(m) + first <= total, ctx.where(), ": num_scan_inputs ", m,
           " does not fit ", total, " inputs");
  const size_t n = total - first - static_cast<size_t>(m);
  OT_CHECK(body.inputs().size() == n + static_cast<size_t>(m), ctx.where(), ": the body takes ",
           body.inputs().size(), " inputs, expected ", n + static_cast<size_t>(m));
  std::vector<ValueType> in_types;
  for (size_t i = first; i < total; ++i)
    in_types.push_back(
        ValueType::tensor(ctx.input_type(i) ? ctx.input_type(i)->dtype : DataType::kUndefined));
  std::vector<const ValueType*> ptrs;
  for (const auto& t : in_types) ptrs.push_back(&t);
  std::vector<ValueType> out = body_output_types(body, ctx.opset, ptrs);
  for (size_t i = 0; i < ctx.node.outputs().size() && i < out.size(); ++i) {
    ValueType t = out[i];
    if (i < n && ctx.input_type(first + i)) t.dtype = ctx.input_type(first + i)->dtype;
    t.shape.reset();
    ctx.output_types[i] = t;
  }
}

class ScanKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const graph::Node& node = ctx.node();
    const bool v8 = ctx.opset() < 9;
    const auto m = static_cast<size_t>(node.attr_int("num_scan_inputs", 0));
    const size_t first = v8 ? 1 : 0;
    const size_t total = static_cast<size_t>(ctx.num_inputs());
    OT_CHECK(m >= 1 && m + first <= total, where, ": num_scan_inputs ", m, " does not fit ", total,
             " inputs");
    const size_t n = total - first - m;
    const auto k = static_cast<size_t>(ctx.num_outputs()) - n;
    std::vector<graph::Tensor> states, scans;
    for (size_t i = 0; i < n + m; ++i) {
      const TensorView* v = ctx.input(static_cast<int>(first + i));
      OT_CHECK(v, where, ": input ", first + i, " is missing");
      (i < n ? states : scans).push_back(tensor_of(*v));
    }
    ScanConfig cfg;
    const std::vector<int64_t> in_dir =
        ints_attr(node, v8 ? "directions" : "scan_input_directions", m, 0, where);
    for (size_t j = 0; j < m; ++j) cfg.in_reverse.push_back(in_dir[j] != 0);
    const std::vector<int64_t> out_dir = ints_attr(node, "scan_output_directions", k, 0, where);
    for (size_t q = 0; q < k; ++q) cfg.out_reverse.push_back(!v8 && out_dir[q] != 0);
    Subgraph& body = ctx.subgraph("body");
    if (!v8) {
      const std::vector<int64_t> in_axes = ints_attr(node, "scan_input_axes", m, 0, where);
      for (size_t j = 0; j < m; ++j)
        cfg.in_axes.push_back(
            static_cast<size_t>(normalize_axis(in_axes[j], scans[j].rank(), where)));
      cfg.out_axes = ints_attr(node, "scan_output_axes", k, 0, where);
      auto result = scan_once(body, std::move(states), scans, n + k, cfg, where);
      for (size_t i = 0; i < result.size(); ++i)
        write_output(ctx, static_cast<int>(i), result[i], where);
      return;
    }
    run_batched(ctx, body, states, scans, cfg, n, k, where);
  }

 private:
  // Opset 8: axis 0 of every input is the batch; row b scans axis 1 of its slices for
  // sequence_lens[b] steps (all when omitted); outputs are restacked along the batch axis.
  static void run_batched(KernelContext& ctx, Subgraph& body,
                          const std::vector<graph::Tensor>& states,
                          const std::vector<graph::Tensor>& scans, ScanConfig cfg, size_t n,
                          size_t k, const std::string& where) {
    const int64_t batch = scans[0].dims()[0];
    std::vector<int64_t> lens;
    if (const TensorView* sl = ctx.input(0)) lens = shape::view_ints(*sl, where);
    OT_CHECK(lens.empty() || static_cast<int64_t>(lens.size()) == batch, where,
             ": sequence_lens has ", lens.size(), " values for a batch of ", batch);
    cfg.in_axes.assign(scans.size(), 0);
    cfg.out_axes.assign(k, 0);
    std::vector<std::vector<graph::Tensor>> rows(n + k);
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<graph::Tensor> st, sc;
      for (const auto& s : states) st.push_back(slice(s, 0, b, where));
      for (const auto& s : scans) sc.push_back(slice(s, 0, b, where));
      cfg.length = lens.empty() ? -1 : lens[b];
      auto result = scan_once(body, std::move(st), sc, n + k, cfg, where);
      for (size_t i = 0; i < result.size(); ++i) rows[i].push_back(std::move(result[i]));
    }
    for (size_t i = 0; i < n + k; ++i) {
      OT_CHECK(!rows[i].empty(), where, ": an empty batch has no output shape");
      graph::Tensor out = stack(rows[i], 0, rows[i][0].dtype(), rows[i][0].dims(), where);
      write_output(ctx, static_cast<int>(i), out, where);
    }
  }
};

}  // namespace

ONNXTRAIN_REGISTER_OP(scan_8) {
  OpSchema s = make_control("Scan", infer_scan,
                            [](const graph::Node&) { return std::make_unique<ScanKernel>(); });
  s.since_version = 8;
  return s;
}

}  // namespace onnxtrain::ops::control
