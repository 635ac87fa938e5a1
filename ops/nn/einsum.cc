// Einsum (opset 12): ONNX's grammar (letters a-z A-Z, at most one "..." per term standing for
// broadcast dims, an explicit "->" output or numpy's implicit one, spaces ignored), repeated
// letters within a term (diagonals) included; float32 and float64. Operands are contracted left
// to right, two at a time: each pair becomes one batched matrix product of [batch, left,
// contracted] by [batch, contracted, right], after the letters that only one side has and nobody
// needs later are summed away. The gradient of an operand is an Einsum of dY with the other
// operands, with Unsqueeze + Expand for letters that operand alone had and SumToShapeOf for its
// broadcast "..." dims; an operand with a repeated letter has none (the rule names it).
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ops/nn/nn_util.h"
#include "ops/reduce/grad_util.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

using ops::shape::ElemKind;

// ---- the equation

// The terms as written (spaces removed), the output made explicit.
struct Subscripts {
  std::vector<std::string> inputs;
  std::string output;
};

bool is_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string letters_of(const std::string& term) {
  std::string out;
  for (char c : term)
    if (is_letter(c)) out += c;
  return out;
}

bool has_dots(const std::string& term) {
  return term.find("...") != std::string::npos;
}

Subscripts parse_subscripts(const std::string& equation, size_t n_inputs,
                            const std::string& where) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  OT_CHECK(!eq.empty(), where, ": attribute equation is required");
  auto bad = [&](const std::string& why) { fail(where, ": equation '", equation, "': ", why); };
  Subscripts s;
  std::string lhs = eq;
  const size_t arrow = eq.find("->");
  const bool explicit_output = arrow != std::string::npos;
  if (explicit_output) {
    lhs = eq.substr(0, arrow);
    s.output = eq.substr(arrow + 2);
  }
  size_t begin = 0;
  for (;;) {
    const size_t comma = lhs.find(',', begin);
    s.inputs.push_back(lhs.substr(begin, comma - begin));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  if (s.inputs.size() != n_inputs)
    bad(cat(s.inputs.size(), " operand term(s) for ", n_inputs, " input(s)"));
  auto check_term = [&](const std::string& t) {
    const size_t dots = t.find("...");
    if (dots != std::string::npos && t.find("...", dots + 3) != std::string::npos)
      bad(cat("'...' appears twice in term '", t, "'"));
    for (size_t i = 0; i < t.size(); ++i) {
      const bool in_dots = dots != std::string::npos && i >= dots && i < dots + 3;
      if (!is_letter(t[i]) && !in_dots) bad(cat("unexpected '", t[i], "' in term '", t, "'"));
    }
  };
  bool any_dots = false;
  std::map<char, int> count;
  for (const std::string& t : s.inputs) {
    check_term(t);
    any_dots |= has_dots(t);
    for (char c : letters_of(t)) ++count[c];
  }
  if (explicit_output) {
    check_term(s.output);
    if (has_dots(s.output) && !any_dots) bad("'...' in the output but in no operand");
    std::set<char> seen;
    for (char c : letters_of(s.output)) {
      if (!count.count(c)) bad(cat("output subscript '", c, "' is in no operand"));
      if (!seen.insert(c).second) bad(cat("output subscript '", c, "' repeats"));
    }
  } else {  // numpy's implicit output: "..." then the letters used once, in ASCII order
    s.output = any_dots ? "..." : "";
    for (const auto& [c, n] : count)
      if (n == 1) s.output += c;
  }
  return s;
}

// Labels of dims: letters 0-51, the "..." dims kLetters + j, right-aligned over the widest "..."
// so that broadcast dims of different operands share labels.
constexpr int kLetters = 52;
int letter_label(char c) {
  return c <= 'Z' ? c - 'A' : 26 + (c - 'a');
}
std::string label_name(int label) {
  if (label >= kLetters) return "a '...' dim";
  return cat("subscript '", static_cast<char>(label < 26 ? 'A' + label : 'a' + (label - 26)), "'");
}

struct Labels {
  std::vector<std::vector<int>> inputs;
  std::vector<int> output;
};

Labels label_dims(const Subscripts& s, std::span<const int64_t> ranks, const std::string& where) {
  int64_t widest = 0;
  std::vector<int64_t> dots(s.inputs.size(), 0);
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const auto letters = static_cast<int64_t>(letters_of(s.inputs[i]).size());
    const bool d = has_dots(s.inputs[i]);
    OT_CHECK(d ? ranks[i] >= letters : ranks[i] == letters, where, ": input ", i, " has rank ",
             ranks[i], " but its subscripts '", s.inputs[i], "' name ", letters, " dim(s)");
    dots[i] = ranks[i] - letters;
    widest = std::max(widest, dots[i]);
  }
  auto labels = [&](const std::string& term, int64_t n_dots) {
    std::vector<int> out;
    for (size_t i = 0; i < term.size(); ++i) {
      if (is_letter(term[i])) {
        out.push_back(letter_label(term[i]));
      } else {  // the first '.' of "...": its dims
        for (int64_t j = widest - n_dots; j < widest; ++j)
          out.push_back(kLetters + static_cast<int>(j));
        i += 2;
      }
    }
    return out;
  };
  Labels l;
  for (size_t i = 0; i < s.inputs.size(); ++i) l.inputs.push_back(labels(s.inputs[i], dots[i]));
  l.output = labels(s.output, widest);
  return l;
}

// The size of every label: letters agree exactly, "..." dims broadcast (1 against n).
std::map<int, int64_t> label_sizes(const Labels& l, const std::vector<std::vector<int64_t>>& dims,
                                   const std::string& where) {
  std::map<int, int64_t> size;
  for (size_t i = 0; i < l.inputs.size(); ++i)
    for (size_t p = 0; p < l.inputs[i].size(); ++p) {
      const int label = l.inputs[i][p];
      const int64_t d = dims[i][p];
      auto [it, fresh] = size.emplace(label, d);
      if (fresh || it->second == d) continue;
      const bool broadcast = label >= kLetters && (it->second == 1 || d == 1);
      OT_CHECK(broadcast, where, ": input ", i, " dim ", p, " is ", d, " where ", label_name(label),
               " is ", it->second);
      it->second = std::max(it->second, d);
    }
  return size;
}

void infer_einsum(InferenceContext& ctx) {
  const size_t n = ctx.node.inputs().size();
  OT_CHECK(n >= 1, ctx.where(), ": Einsum needs at least one input");
  const Subscripts s = parse_subscripts(ctx.node.attr_string("equation", ""), n, ctx.where());
  const DataType dtype = tensor_input(ctx, 0).dtype;
  std::vector<int64_t> ranks;
  bool shapes = true;
  for (size_t i = 0; i < n; ++i) {
    check_float_input(ctx, i);
    const ValueType& t = tensor_input(ctx, i);
    OT_CHECK(t.dtype == dtype, ctx.where(), ": input ", i, " is ", graph::dtype_short_name(t.dtype),
             ", input 0 ", graph::dtype_short_name(dtype));
    shapes &= t.shape.has_value();
    if (shapes) ranks.push_back(static_cast<int64_t>(t.shape->size()));
  }
  if (!shapes) return set_output(ctx, 0, dtype, std::nullopt);
  const Labels l = label_dims(s, ranks, ctx.where());
  // A label's dim: a known one (other than a broadcast 1) wins over an unknown one.
  std::map<int, Dim> size;
  for (size_t i = 0; i < n; ++i)
    for (size_t p = 0; p < l.inputs[i].size(); ++p) {
      const Dim d = (*tensor_input(ctx, i).shape)[p];
      auto [it, fresh] = size.emplace(l.inputs[i][p], d);
      if (fresh) continue;
      Dim& have = it->second;
      if (have.is_known() && d.is_known()) {
        OT_CHECK(have.value == d.value ||
                     (l.inputs[i][p] >= kLetters && (have.value == 1 || d.value == 1)),
                 ctx.where(), ": input ", i, " dim ", p, " is ", d.value, " where ",
                 label_name(l.inputs[i][p]), " is ", have.value);
        if (have.value == 1) have = d;
      } else if (!have.is_known() && d.is_known() && d.value != 1) {
        have = d;
      } else if (have.is_known() && have.value == 1 && !d.is_known()) {
        have = d;  // a "..." dim of 1 broadcast against one only the run tells
      }
    }
  Shape out;
  for (int label : l.output) out.push_back(size.at(label));
  set_output(ctx, 0, dtype, out);
}

// ---- the kernel

// A tensor read through strides, one entry per distinct label: a repeated letter (a diagonal)
// adds its strides, a broadcast "..." dim of size 1 reads with stride 0.
struct View {
  const std::byte* data = nullptr;
  std::vector<int> labels;
  std::vector<int64_t> dims, strides;
  int find(int label) const {
    auto it = std::find(labels.begin(), labels.end(), label);
    return it == labels.end() ? -1 : static_cast<int>(it - labels.begin());
  }
};

View operand_view(const void* data, std::span<const int64_t> dims, const std::vector<int>& labels,
                  const std::map<int, int64_t>& size) {
  View v;
  v.data = static_cast<const std::byte*>(data);
  const std::vector<int64_t> strides = shape::contiguous_strides(dims);
  for (size_t p = 0; p < labels.size(); ++p) {
    const int k = v.find(labels[p]);
    if (k >= 0) {
      v.strides[static_cast<size_t>(k)] += strides[p];
      continue;
    }
    v.labels.push_back(labels[p]);
    v.dims.push_back(size.at(labels[p]));
    v.strides.push_back(dims[p] == 1 && size.at(labels[p]) != 1 ? 0 : strides[p]);
  }
  return v;
}

// A contiguous intermediate with its labels.
template <typename T>
struct Dense {
  std::vector<T> data;
  std::vector<int> labels;
  std::vector<int64_t> dims;
  View view() const {
    return View{reinterpret_cast<const std::byte*>(data.data()), labels, dims,
                shape::contiguous_strides(dims)};
  }
};

// v's elements with its labels in `order` (a permutation of them), contiguous, then the
// trailing `summed` labels of `order` added up: rows x (product of the rest).
template <typename T>
std::vector<T> gather(const KernelContext& ctx, ElemKind e, const View& v,
                      const std::vector<int>& order, size_t summed) {
  std::vector<int64_t> dims, strides;
  for (int label : order) {
    const auto k = static_cast<size_t>(v.find(label));
    dims.push_back(v.dims[k]);
    strides.push_back(v.strides[k]);
  }
  std::vector<T> all(static_cast<size_t>(product(dims)));
  if (!all.empty())
    shape::strided_copy(&ctx, e, dims, all.data(), shape::contiguous_strides(dims), v.data,
                        strides);
  if (summed == 0) return all;
  const int64_t inner = product(std::span(dims).last(summed));
  const int64_t rows = product(std::span(dims).first(dims.size() - summed));
  std::vector<T> out(static_cast<size_t>(rows));
  ctx.parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       double acc = 0;
                       for (int64_t j = 0; j < inner; ++j)
                         acc += static_cast<double>(all[r * inner + j]);
                       out[r] = static_cast<T>(acc);
                     }
                   });
  return out;
}

int64_t dims_product(const View& v, const std::vector<int>& labels) {
  int64_t n = 1;
  for (int label : labels) n *= v.dims[static_cast<size_t>(v.find(label))];
  return n;
}

// a (x b) with only the labels in `needed` left: a alone sums the rest; a pair is one batched
// product C[batch, left, right] = A[batch, left, k] B[batch, k, right].
template <typename T>
Dense<T> contract(const KernelContext& ctx, ElemKind e, const View& a, const View* b,
                  const std::set<int>& needed) {
  auto in = [](const View* v, int label) { return v && v->find(label) >= 0; };
  std::vector<int> batch, left, right, k, a_sum, b_sum;
  for (int label : a.labels) {
    const bool keep = needed.count(label);
    if (in(b, label))
      (keep ? batch : k).push_back(label);
    else
      (keep ? left : a_sum).push_back(label);
  }
  if (b)
    for (int label : b->labels)
      if (!in(&a, label)) (needed.count(label) ? right : b_sum).push_back(label);
  auto join = [](std::initializer_list<const std::vector<int>*> parts) {
    std::vector<int> out;
    for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
    return out;
  };
  Dense<T> out;
  out.labels = join({&batch, &left, &right});
  for (int label : batch) out.dims.push_back(a.dims[static_cast<size_t>(a.find(label))]);
  for (int label : left) out.dims.push_back(a.dims[static_cast<size_t>(a.find(label))]);
  for (int label : right) out.dims.push_back(b->dims[static_cast<size_t>(b->find(label))]);
  if (!b) {
    out.data = gather<T>(ctx, e, a, join({&left, &a_sum}), a_sum.size());
    return out;
  }
  const std::vector<T> am = gather<T>(ctx, e, a, join({&batch, &left, &k, &a_sum}), a_sum.size());
  const std::vector<T> bm = gather<T>(ctx, e, *b, join({&batch, &k, &right, &b_sum}), b_sum.size());
  const int64_t nb = dims_product(a, batch), m = dims_product(a, left), n = dims_product(*b, right),
                q = dims_product(a, k);
  out.data.assign(static_cast<size_t>(nb * m * n), T{0});
  if (q > 0)
    for (int64_t i = 0; i < nb; ++i)
      gemm_nn<T>(m, n, q, am.data() + i * m * q, bm.data() + i * q * n, out.data.data() + i * m * n,
                 false, ctx);
  return out;
}

class EinsumKernel final : public Kernel {
 public:
  // The equation is parsed once; the labels depend on the inputs' ranks, read at each run.
  explicit EinsumKernel(const graph::Node& node)
      : where_(node.describe()),
        s_(parse_subscripts(node.attr_string("equation", ""), node.inputs().size(), where_)) {}

  void run(KernelContext& ctx) override {
    const std::string& where = where_;
    const size_t n = static_cast<size_t>(ctx.num_inputs());
    const Subscripts& s = s_;
    std::vector<int64_t> ranks;
    std::vector<std::vector<int64_t>> dims;
    for (size_t i = 0; i < n; ++i) {
      const TensorView* t = ctx.input(static_cast<int>(i));
      OT_CHECK(t, where, ": input ", i, " is missing");
      OT_CHECK(t->dtype == ctx.input(0)->dtype, where, ": inputs differ in dtype");
      ranks.push_back(static_cast<int64_t>(t->dims.size()));
      dims.push_back(t->dims);
    }
    const Labels l = label_dims(s, ranks, where);
    const std::map<int, int64_t> size = label_sizes(l, dims, where);
    std::vector<int64_t> out_dims;
    for (int label : l.output) out_dims.push_back(size.at(label));
    const ElemKind e = shape::elem_kind(ctx.input(0)->dtype);
    dispatch_float(ctx.input(0)->dtype, where, [&](auto tag) {
      using T = decltype(tag);
      auto view_of = [&](size_t i) {
        return operand_view(ctx.input(static_cast<int>(i))->template as<T>(), dims[i], l.inputs[i],
                            size);
      };
      const std::set<int> output(l.output.begin(), l.output.end());
      // Left to right; each product keeps the labels the output or a later operand reads.
      Dense<T> cur;
      View acc = view_of(0);
      for (size_t i = 1; i < n; ++i) {
        std::set<int> needed = output;
        for (size_t j = i + 1; j < n; ++j) needed.insert(l.inputs[j].begin(), l.inputs[j].end());
        const View next = view_of(i);
        cur = contract<T>(ctx, e, acc, &next, needed);
        acc = cur.view();
      }
      const bool summed = std::any_of(acc.labels.begin(), acc.labels.end(),
                                      [&](int label) { return !output.count(label); });
      if (summed) {
        cur = contract<T>(ctx, e, acc, nullptr, output);
        acc = cur.view();
      }
      TensorView& y = ctx.output(0, out_dims);
      if (y.numel() == 0) return;
      const std::vector<T> ordered = gather<T>(ctx, e, acc, l.output, 0);
      std::copy(ordered.begin(), ordered.end(), y.template as<T>());
    });
  }

 private:
  std::string where_;
  Subscripts s_;
};

// ---- the gradient

void einsum_gradient(GradientBuilder& b) {
  const graph::Node& node = b.node();
  const std::string where = node.describe();
  const Subscripts s =
      parse_subscripts(node.attr_string("equation", ""), node.inputs().size(), where);
  graph::Value* dy = b.output_grad(0);
  for (int i = 0; i < b.num_inputs(); ++i) {
    if (!b.needs_input_grad(i)) continue;
    const std::string& term = s.inputs[static_cast<size_t>(i)];
    std::string others_terms, elsewhere = letters_of(s.output);
    std::vector<graph::Value*> inputs{dy};
    for (int j = 0; j < b.num_inputs(); ++j) {
      if (j == i) continue;
      others_terms += "," + s.inputs[static_cast<size_t>(j)];
      elsewhere += letters_of(s.inputs[static_cast<size_t>(j)]);
      inputs.push_back(b.input(j));
    }
    // dA = Einsum(dY, the others) onto A's letters that dY or another operand has; a letter of A
    // alone was summed in the forward, so its gradient is the same at every index (Expand).
    const std::string mine = letters_of(term);
    std::string kept;
    std::vector<int64_t> dropped;
    const size_t dots = term.find("...");
    int64_t before = 0, after = 0;  // letters seen before / after the "..."
    for (size_t p = 0; p < term.size(); ++p) {
      const char c = term[p];
      if (!is_letter(c)) {
        kept += c;
        continue;
      }
      OT_CHECK(std::count(mine.begin(), mine.end(), c) == 1, where, ": no gradient for input ", i,
               ": subscript '", c, "' repeats in '", term, "' (a diagonal)");
      const bool after_dots = dots != std::string::npos && p > dots;
      if (elsewhere.find(c) != std::string::npos) {
        kept += c;
      } else {
        OT_CHECK(dots == std::string::npos, where, ": no gradient for input ", i, ": subscript '",
                 c, "' is summed in '", term, "' alone, next to '...'");
        dropped.push_back(before);
      }
      ++(after_dots ? after : before);
    }
    graph::Value* g =
        b.emit1("Einsum", inputs,
                {graph::Attribute::make_string("equation", s.output + others_terms + "->" + kept)});
    if (!dropped.empty()) {
      g = grad::unsqueeze(b, g, dropped);
      g = b.emit1("Expand", {g, grad::shape_of(b, b.input(i))});
    }
    if (dots != std::string::npos)  // "..." dims of size 1 that broadcast
      g = b.emit1("SumToShapeOf", {g, b.input(i)}, {}, kOnnxtrainDomain);
    b.set_input_grad(i, g);
  }
}

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_einsum) {
  OpSchema s;
  s.op_type = "Einsum";
  s.since_version = 12;
  s.infer = infer_einsum;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<EinsumKernel>(n); };
  s.gradient = einsum_gradient;
  return s;
}

}  // namespace onnxtrain::ops::nn
