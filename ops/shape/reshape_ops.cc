// Ops that only change the shape, never the element order: Reshape, Flatten, Squeeze,
// Unsqueeze. One shape rule per op, over graph::Shape, serves inference (symbolic dims) and the
// kernel (concrete dims); the kernel itself is a plain copy.
#include <algorithm>
#include <set>
#include <string>

#include "ops/reduce/grad_util.h"
#include "ops/shape/args.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

int64_t known_product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t k = begin; k < end; ++k) {
    if (!s[k].is_known()) return -1;
    if (__builtin_mul_overflow(p, s[k].value, &p)) return -1;
  }
  return p;
}

Dim dim_or_unknown(int64_t v) {
  return v >= 0 ? Dim::known(v) : Dim{};
}

// Where exactly one dim of `out` is unknown (a -1, or a size computed at run time) and the
// element counts of `in` and `out` are products of known sizes and symbols that `out`'s others
// account for (batch N of [N, 16, 96] -> [N, 16, ?, 24]), the unknown dim is their quotient:
// Reshape keeps the element count. Otherwise `out` stays as it is.
void solve_one_unknown(const Shape& in, Shape& out) {
  size_t unknown = out.size();
  int64_t out_known = 1, in_known = 1;
  std::multiset<std::string> symbols;  // in's symbols not yet matched by one of out's
  for (const Dim& d : in) {
    if (d.is_known()) {
      if (__builtin_mul_overflow(in_known, d.value, &in_known)) return;
    } else if (d.param.empty()) {
      return;  // an unknown input dim: nothing to divide
    } else {
      symbols.insert(d.param);
    }
  }
  for (size_t k = 0; k < out.size(); ++k) {
    const Dim& d = out[k];
    if (d.is_known()) {
      if (__builtin_mul_overflow(out_known, d.value, &out_known)) return;
    } else if (!d.param.empty()) {
      auto it = symbols.find(d.param);
      if (it == symbols.end()) return;
      symbols.erase(it);
    } else if (unknown < out.size()) {
      return;  // two unknowns
    } else {
      unknown = k;
    }
  }
  if (unknown == out.size() || !symbols.empty() || out_known <= 0 || in_known % out_known != 0)
    return;
  out[unknown] = Dim::known(in_known / out_known);
}

// ---- Reshape: shape entries 0 (copy the input dim, or a real 0 with allowzero) and -1 (infer).
std::optional<Shape> reshape_rule(const std::optional<Shape>& in, const ArgSource& args) {
  const std::string& where = args.where();
  auto target = args.opset() < 5 ? std::optional(args.node().attr_ints("shape")) : args.ints(1);
  if (!target) {
    // A target built from Shape ops: its known entries are sizes (0: the input's dim), its
    // symbols are dims of the input, so the output has them as they are; its unknown entries
    // (a -1, or a size computed at run time) stay open unless the element count gives one.
    if (auto d = args.opset() >= 5 ? args.dims(1) : std::nullopt) {
      const bool allowzero = args.opset() >= 14 && args.node().attr_int("allowzero", 0) != 0;
      for (size_t k = 0; k < d->size(); ++k)
        if ((*d)[k] == Dim::known(0) && !allowzero) (*d)[k] = in && k < in->size() ? (*in)[k] : Dim{};
      if (in) solve_one_unknown(*in, *d);
      return *d;
    }
    auto rank = args.static_length(1);
    return rank ? std::optional(Shape(static_cast<size_t>(*rank))) : std::nullopt;
  }
  const bool allowzero = args.opset() >= 14 && args.node().attr_int("allowzero", 0) != 0;
  Shape out(target->size());
  int infer_at = -1;
  int64_t rest = 1;  // product of the other output dims; -1 when one is unknown
  for (size_t k = 0; k < target->size(); ++k) {
    int64_t v = (*target)[k];
    if (v == -1) {
      OT_CHECK(infer_at < 0, where, ": shape has more than one -1");
      infer_at = static_cast<int>(k);
      continue;
    }
    OT_CHECK(v >= 0, where, ": shape entry ", k, " is ", v);
    if (v == 0 && !allowzero) {
      OT_CHECK(!in || k < in->size(), where, ": shape entry ", k, " is 0 but the input has rank ",
               in ? in->size() : 0);
      out[k] = in ? (*in)[k] : Dim{};
    } else {
      out[k] = Dim::known(v);
    }
    if (rest >= 0 && out[k].is_known()) {
      if (__builtin_mul_overflow(rest, out[k].value, &rest)) fail(where, ": shape overflows");
    } else {
      rest = -1;
    }
  }
  const int64_t total = in ? known_product(*in, 0, in->size()) : -1;
  if (infer_at >= 0) {
    out[infer_at] = Dim{};
    if (total >= 0 && rest >= 0) {
      OT_CHECK(rest > 0 && total % rest == 0, where, ": cannot reshape ", total,
               " elements with a -1 next to dims of product ", rest);
      out[infer_at] = Dim::known(total / rest);
    }
  } else if (total >= 0 && rest >= 0) {
    OT_CHECK(total == rest, where, ": cannot reshape ", total, " elements into ", rest);
  }
  return out;
}

// ---- Flatten: (d0..d[a-1], d[a]..) -> (prod before axis, prod from axis).
std::optional<Shape> flatten_rule(const std::optional<Shape>& in, const ArgSource& args) {
  if (!in) return Shape(2);
  const auto rank = static_cast<int64_t>(in->size());
  int64_t axis = args.node().attr_int("axis", 1);
  OT_CHECK(axis >= -rank && axis <= rank, args.where(), ": axis ", axis,
           " is out of range for rank ", rank);
  if (axis < 0) axis += rank;
  const auto a = static_cast<size_t>(axis);
  return Shape{dim_or_unknown(known_product(*in, 0, a)),
               dim_or_unknown(known_product(*in, a, in->size()))};
}

// The axes of Squeeze / Unsqueeze: attribute before opset 13, input 1 from 13.
struct Axes {
  bool given = false;                          // false: Squeeze without axes
  std::optional<std::vector<int64_t>> values;  // nullopt: given but not constant
};

Axes axes_arg(const ArgSource& args) {
  if (args.opset() < 13) {
    const graph::Attribute* a = args.node().find_attr("axes");
    if (!a) return Axes{};
    return Axes{true, a->ints()};
  }
  if (!args.present(1)) return Axes{};
  return Axes{true, args.ints(1)};
}

std::vector<bool> axis_mask(const std::vector<int64_t>& axes, int64_t rank,
                            const std::string& where) {
  std::vector<bool> mask(static_cast<size_t>(rank), false);
  for (int64_t a : axes) {
    int64_t k = normalize_axis(a, rank, where);
    OT_CHECK(!mask[k], where, ": axis ", a, " is repeated");
    mask[k] = true;
  }
  return mask;
}

// ---- Squeeze: drops the listed size-1 dims (all size-1 dims without axes).
std::optional<Shape> squeeze_rule(const std::optional<Shape>& in, const ArgSource& args) {
  Axes axes = axes_arg(args);
  if (!in || (axes.given && !axes.values)) return std::nullopt;
  const auto rank = static_cast<int64_t>(in->size());
  std::vector<bool> drop(static_cast<size_t>(rank), false);
  if (axes.given) {
    drop = axis_mask(*axes.values, rank, args.where());
  } else {
    for (size_t k = 0; k < in->size(); ++k) {
      if (!(*in)[k].is_known()) return std::nullopt;  // a symbolic dim might be 1
      drop[k] = (*in)[k].value == 1;
    }
  }
  Shape out;
  for (size_t k = 0; k < in->size(); ++k) {
    if (!drop[k]) {
      out.push_back((*in)[k]);
      continue;
    }
    OT_CHECK(!(*in)[k].is_known() || (*in)[k].value == 1, args.where(), ": cannot squeeze axis ", k,
             " of size ", (*in)[k].value);
  }
  return out;
}

// ---- Unsqueeze: inserts size-1 dims at the listed positions of the output.
std::optional<Shape> unsqueeze_rule(const std::optional<Shape>& in, const ArgSource& args) {
  Axes axes = axes_arg(args);
  OT_CHECK(axes.given, args.where(), ": axes are required");
  if (!axes.values) {
    auto n = args.static_length(1);
    if (!in || !n) return std::nullopt;
    return Shape(in->size() + static_cast<size_t>(*n));
  }
  if (!in) return std::nullopt;
  const auto rank = static_cast<int64_t>(in->size() + axes.values->size());
  std::vector<bool> insert = axis_mask(*axes.values, rank, args.where());
  Shape out;
  size_t next = 0;
  for (int64_t k = 0; k < rank; ++k) out.push_back(insert[k] ? Dim::known(1) : (*in)[next++]);
  return out;
}

// Runs a shape rule on the kernel's actual dims, then copies: x: (any) -> y: (rule(x)).
template <ShapeRule rule>
class ReshapeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    copy_all(ctx, *ctx.input(0), ctx.output(0, dims_by_rule(rule, ctx)));
  }
};

// The ops only relabel the shape: dX = Reshape(dY, Shape(X)).
void reshape_gradient(GradientBuilder& b) {
  if (b.needs_input_grad(0)) b.set_input_grad(0, grad::reshape_like(b, b.output_grad(0), b.input(0)));
}

template <ShapeRule rule>
OpSchema reshape_like(const char* op_type) {
  OpSchema s = make_op(op_type, infer_by_rule(rule), factory_of<ReshapeKernel<rule>>());
  s.gradient = reshape_gradient;
  s.view = true;  // copy_all does nothing when the output is placed over the input
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(shape_reshape) {
  return reshape_like<reshape_rule>("Reshape");
}
ONNXTRAIN_REGISTER_OP(shape_flatten) {
  return reshape_like<flatten_rule>("Flatten");
}
ONNXTRAIN_REGISTER_OP(shape_squeeze) {
  return reshape_like<squeeze_rule>("Squeeze");
}
ONNXTRAIN_REGISTER_OP(shape_unsqueeze) {
  return reshape_like<unsqueeze_rule>("Unsqueeze");
}

}  // namespace onnxtrain::ops::shape
