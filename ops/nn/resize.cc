// Resize (opsets 10, 11, 13, 18, 19) and the deprecated Upsample (7, 9): nearest / n-D linear /
// cubic interpolation with every coordinate transformation, antialiasing and axes. Each output
// coordinate of each axis becomes a short list of (input index, weight) taps computed once per
// run, following the formulas of the ONNX reference implementation.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/elementwise/dtypes.h"
#include "ops/nn/nn_util.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

using ew::Tag;

// Attributes, resolved once per node (opset-dependent defaults applied).
struct ResizeAttrs {
  std::string mode = "nearest";  // nearest | linear | cubic
  std::string coord = "half_pixel";
  std::string nearest = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0;
  bool antialias = false;
  std::vector<int64_t> axes;  // empty: every axis
  std::string keep_aspect = "stretch";
  int scales_input = 2, sizes_input = 3, roi_input = 1;  // -1: not an input at this opset
};

// ResizeGrad carries its forward node's attributes, and `upsample` = 1 when that was Upsample.
constexpr const char* kUpsampleAttr = "upsample";

bool is_upsample(const graph::Node& node) {
  return node.op_type == "Upsample" ||
         (node.op_type == "ResizeGrad" && node.attr_int(kUpsampleAttr, 0) != 0);
}

template <typename C>
void check_one_of(const std::string& value, const C& allowed, const char* attr,
                  const std::string& where) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += cat(list.empty() ? "" : ", ", a);
  }
  fail(where, ": attribute ", attr, " must be one of ", list, ", got '", value, "'");
}

ResizeAttrs attrs_of(const graph::Node& node, int64_t opset, const std::string& where) {
  ResizeAttrs a;
  a.mode = node.attr_string("mode", "nearest");
  if (is_upsample(node) || opset < 11) {
    // Upsample and Resize-10: x_original = x_resized / scale, nearest rounds down.
    if (a.mode == "bilinear") a.mode = "linear";
    check_one_of(a.mode, std::array{"nearest", "linear"}, "mode", where);
    a.coord = "asymmetric";
    a.nearest = "floor";
    a.roi_input = a.sizes_input = -1;
    a.scales_input = (is_upsample(node) && opset < 9) ? -1 : 1;
    return a;
  }
  check_one_of(a.mode, std::array{"nearest", "linear", "cubic"}, "mode", where);
  a.coord = node.attr_string("coordinate_transformation_mode", "half_pixel");
  check_one_of(
      a.coord,
      std::array{"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                 "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"},
      "coordinate_transformation_mode", where);
  a.nearest = node.attr_string("nearest_mode", "round_prefer_floor");
  check_one_of(a.nearest, std::array{"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"},
               "nearest_mode", where);
  a.cubic_a = node.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  a.extrapolation = node.attr_float("extrapolation_value", 0.0f);
  if (opset >= 18) {
    a.antialias = node.attr_int("antialias", 0) != 0;
    a.axes = node.attr_ints("axes");
    a.keep_aspect = node.attr_string("keep_aspect_ratio_policy", "stretch");
    check_one_of(a.keep_aspect, std::array{"stretch", "not_larger", "not_smaller"},
                 "keep_aspect_ratio_policy", where);
  }
  return a;
}

// Float values of a float / double / float16 / bfloat16 buffer (scales, roi).
std::vector<double> floats_of(DataType dt, const void* data, int64_t n, const std::string& where,
                              const char* what) {
  std::vector<double> out(static_cast<size_t>(n));
  ew::dispatch(ew::FloatTypes{} + ew::HalfTypes{} + ew::TypeList<ew::BFloat16>{}, dt,
               cat(where, " input '", what, "'"), [&]<typename T>(Tag<T>) {
                 const T* p = static_cast<const T*>(data);
                 for (int64_t i = 0; i < n; ++i)
                   out[i] = static_cast<double>(static_cast<ew::compute_t<T>>(p[i]));
               });
  return out;
}

// The scales / sizes / roi arguments, from constants (inference) or tensors (kernel).
struct ResizeArgs {
  std::optional<std::vector<double>> scales, roi;
  std::optional<std::vector<int64_t>> sizes;
  bool unknown = false;  // a given argument's values are not available (inference only)
};

// Output dims plus the per-axis scale and roi the coordinate transformation uses.
struct Geometry {
  std::vector<int64_t> out;
  std::vector<double> scale, roi_start, roi_end;
};

// Expands per-`axes` values to every axis (others get `fill`).
template <typename V>
std::vector<V> expand(const std::vector<V>& v, const std::vector<int64_t>& axes, size_t rank,
                      V fill, size_t offset = 0) {
  std::vector<V> out(rank, fill);
  for (size_t i = 0; i < axes.size(); ++i) out[static_cast<size_t>(axes[i])] = v[offset + i];
  return out;
}

Geometry geometry(const ResizeAttrs& a, std::span<const int64_t> in, const ResizeArgs& args,
                  const std::string& where) {
  const size_t rank = in.size();
  std::vector<int64_t> axes = a.axes;
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), int64_t{0});
  }
  std::vector<bool> seen(rank, false);
  for (int64_t& ax : axes) {
    ax = normalize_axis(ax, static_cast<int64_t>(rank), where);
    OT_CHECK(!seen[static_cast<size_t>(ax)], where, ": axis ", ax, " appears twice in 'axes'");
    seen[static_cast<size_t>(ax)] = true;
  }
  OT_CHECK(args.scales.has_value() != args.sizes.has_value(), where,
           ": exactly one of 'scales' and 'sizes' must be given (non-empty), got ",
           args.scales ? "both" : "neither");
  Geometry g;
  g.out.assign(in.begin(), in.end());
  g.scale.assign(rank, 1.0);
  if (args.scales) {
    OT_CHECK(args.scales->size() == axes.size(), where, ": 'scales' has ", args.scales->size(),
             " values, expected ", axes.size(), " (one per resized axis)");
    g.scale = expand(*args.scales, axes, rank, 1.0);
    for (size_t d = 0; d < rank; ++d) {
      OT_CHECK(g.scale[d] > 0, where, ": scale ", g.scale[d], " of axis ", d, " must be > 0");
      g.out[d] = static_cast<int64_t>(std::floor(static_cast<double>(in[d]) * g.scale[d]));
    }
  } else {
    OT_CHECK(args.sizes->size() == axes.size(), where, ": 'sizes' has ", args.sizes->size(),
             " values, expected ", axes.size(), " (one per resized axis)");
    std::vector<int64_t> sizes = expand(*args.sizes, axes, rank, int64_t{0});
    for (int64_t ax : axes) {
      const auto d = static_cast<size_t>(ax);
      OT_CHECK(sizes[d] >= 0, where, ": size ", sizes[d], " of axis ", d, " is negative");
      OT_CHECK(in[d] > 0 || sizes[d] == 0, where, ": axis ", d,
               " is empty and cannot be resized to ", sizes[d]);
    }
    if (a.keep_aspect == "stretch") {
      for (int64_t ax : axes) {
        const auto d = static_cast<size_t>(ax);
        g.out[d] = sizes[d];
        if (in[d] > 0) g.scale[d] = static_cast<double>(sizes[d]) / static_cast<double>(in[d]);
      }
    } else {
      // One scale for every resized axis: the largest that fits (or the smallest that covers).
      const bool larger = a.keep_aspect == "not_smaller";
      double s = larger ? 0 : std::numeric_limits<double>::infinity();
      for (int64_t ax : axes) {
        const auto d = static_cast<size_t>(ax);
        if (in[d] == 0) continue;
        double r = static_cast<double>(sizes[d]) / static_cast<double>(in[d]);
        s = larger ? std::max(s, r) : std::min(s, r);
      }
      if (!std::isfinite(s) || s <= 0) s = 1;
      for (int64_t ax : axes) {
        const auto d = static_cast<size_t>(ax);
        g.scale[d] = s;
        g.out[d] = static_cast<int64_t>(std::floor(s * static_cast<double>(in[d]) + 0.5));
      }
    }
  }
  g.roi_start.assign(rank, 0.0);
  g.roi_end.assign(rank, 1.0);
  if (a.coord == "tf_crop_and_resize") {
    OT_CHECK(args.roi, where, ": coordinate_transformation_mode tf_crop_and_resize needs 'roi'");
    OT_CHECK(args.roi->size() == 2 * axes.size(), where, ": 'roi' has ", args.roi->size(),
             " values, expected ", 2 * axes.size(), " (start and end per resized axis)");
    g.roi_start = expand(*args.roi, axes, rank, 0.0);
    g.roi_end = expand(*args.roi, axes, rank, 1.0, axes.size());
  }
  return g;
}

// x_resized -> x_original along one axis. As in the ONNX reference, the resized length is the
// unrounded in * scale; only half_pixel_symmetric also looks at the integer output length.
double original_coord(const std::string& coord, double x, double scale, int64_t len_in,
                      int64_t len_out, double roi_start, double roi_end) {
  const double in = static_cast<double>(len_in), out = in * scale;
  if (coord == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (coord == "half_pixel_symmetric") {
    const double adjustment = static_cast<double>(len_out) / out;
    const double center = in / 2;
    return center * (1 - adjustment) + (x + 0.5) / scale - 0.5;
  }
  if (coord == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (coord == "align_corners") return out == 1 ? 0.0 : x * (in - 1) / (out - 1);
  if (coord == "asymmetric") return x / scale;
  if (coord == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  // tf_crop_and_resize
  if (out > 1) return roi_start * (in - 1) + x * (roi_end - roi_start) * (in - 1) / (out - 1);
  return 0.5 * (roi_start + roi_end) * (in - 1);
}

int64_t nearest_index(const std::string& mode, double x) {
  const double f = std::floor(x), r = x - f;
  if (mode == "floor") return static_cast<int64_t>(f);
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(x));
  if (mode == "round_prefer_ceil") return static_cast<int64_t>(r < 0.5 ? f : f + 1);
  return static_cast<int64_t>(r <= 0.5 ? f : f + 1);  // round_prefer_floor
}

// The cubic convolution kernel with parameter A at distance x.
double cubic_weight(double x, double a) {
  x = std::abs(x);
  if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0;
}

// Per output coordinate of one axis: taps [first[j], first[j+1]) into idx/weight, and whether
// the coordinate lies outside the crop (tf_crop_and_resize: the output is extrapolation_value).
struct AxisTaps {
  std::vector<int64_t> first{0};
  std::vector<int64_t> idx;
  std::vector<double> weight;
  std::vector<uint8_t> outside;
};

AxisTaps axis_taps(const ResizeAttrs& a, const Geometry& g, size_t d, int64_t len_in) {
  AxisTaps t;
  const int64_t len_out = g.out[d];
  const bool crop = a.coord == "tf_crop_and_resize";
  for (int64_t j = 0; j < len_out; ++j) {
    const double x = original_coord(a.coord, static_cast<double>(j), g.scale[d], len_in, len_out,
                                    g.roi_start[d], g.roi_end[d]);
    const bool outside = crop && (x < 0 || x > static_cast<double>(len_in - 1));
    t.outside.push_back(outside);
    if (outside) {
      t.first.push_back(static_cast<int64_t>(t.idx.size()));
      continue;
    }
    if (a.mode == "nearest") {
      t.idx.push_back(std::clamp<int64_t>(nearest_index(a.nearest, x), 0, len_in - 1));
      t.weight.push_back(1.0);
      t.first.push_back(static_cast<int64_t>(t.idx.size()));
      continue;
    }
    // Points k+start .. k+end-1 around x, k = ceil(x) - 1 so the ratio x - k lies in (0, 1];
    // antialiasing widens the filter by 1/scale when downsampling.
    const double s = a.antialias ? std::min(g.scale[d], 1.0) : 1.0;
    const double k = std::ceil(x) - 1, ratio = x - k;
    const bool cubic = a.mode == "cubic";
    const auto start = static_cast<int64_t>(std::floor((cubic ? -2.0 : -1.0) / s) + 1);
    const int64_t n = 2 - 2 * start;
    std::vector<double> w(static_cast<size_t>(n));
    std::vector<int64_t> p(static_cast<size_t>(n));
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double arg = s * (static_cast<double>(start + i) - ratio);
      w[i] = cubic ? cubic_weight(arg, a.cubic_a) : std::clamp(1 - std::abs(arg), 0.0, 1.0);
      p[i] = static_cast<int64_t>(k) + start + i;
      if (a.exclude_outside && (p[i] < 0 || p[i] >= len_in)) w[i] = 0;
      sum += w[i];
    }
    const bool normalize = a.antialias || a.exclude_outside;
    for (int64_t i = 0; i < n; ++i) {
      if (w[i] == 0) continue;
      t.idx.push_back(std::clamp<int64_t>(p[i], 0, len_in - 1));
      t.weight.push_back(normalize && sum != 0 ? w[i] / sum : w[i]);
    }
    t.first.push_back(static_cast<int64_t>(t.idx.size()));
  }
  return t;
}

// ---- inference

// Values of input i when constant; sets args.unknown when given but not constant. An empty
// tensor counts as not given (Resize-11 passes an empty 'scales' alongside 'sizes').
template <typename F>
void read_input(const InferenceContext& ctx, int i, F&& read, ResizeArgs& args) {
  if (i < 0 || !ctx.input_type(static_cast<size_t>(i))) return;
  if (const graph::Tensor* t = ctx.input_value(static_cast<size_t>(i))) {
    if (t->numel() > 0) read(*t);
    return;
  }
  auto dims = known_dims(*ctx.input_type(static_cast<size_t>(i)));
  if (!dims || numel(*dims) != 0) args.unknown = true;
}

ResizeArgs infer_args(const InferenceContext& ctx, const ResizeAttrs& a) {
  ResizeArgs args;
  const std::string where = ctx.where();
  if (a.scales_input < 0 && ctx.node.find_attr("scales")) {
    const auto& f = ctx.node.find_attr("scales")->floats();
    args.scales = std::vector<double>(f.begin(), f.end());
  }
  read_input(
      ctx, a.scales_input,
      [&](const graph::Tensor& t) {
        args.scales = floats_of(t.dtype(), t.data(), t.numel(), where, "scales");
      },
      args);
  read_input(
      ctx, a.sizes_input, [&](const graph::Tensor& t) { args.sizes = to_int64s(t, where); }, args);
  if (a.coord == "tf_crop_and_resize")
    read_input(
        ctx, a.roi_input,
        [&](const graph::Tensor& t) {
          args.roi = floats_of(t.dtype(), t.data(), t.numel(), where, "roi");
        },
        args);
  return args;
}

// x: (d0..dn) -> y: (resized d0..dn)
void infer_resize(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  const ResizeAttrs a = attrs_of(ctx.node, ctx.opset, ctx.where());
  std::optional<Shape> out;
  if (x.shape) {
    out = Shape(x.shape->size());
    ResizeArgs args = infer_args(ctx, a);
    auto dims = known_dims(x);
    if (dims && !args.unknown) out = to_shape(geometry(a, *dims, args, ctx.where()).out);
  }
  set_output(ctx, 0, x.dtype, out);
}

// ---- kernel

// `shift`: where the forward's inputs start among the node's (ResizeGrad's: after dY and X's
// shape, so 1).
ResizeArgs kernel_args(const KernelContext& ctx, const ResizeAttrs& a, const std::string& where,
                       int shift = 0) {
  ResizeArgs args;
  if (a.scales_input < 0) {
    const graph::Attribute* s = ctx.node().find_attr("scales");
    OT_CHECK(s, where, ": attribute 'scales' is required");
    args.scales = std::vector<double>(s->floats().begin(), s->floats().end());
  }
  auto given = [&](int i) -> const TensorView* {
    const TensorView* v = i >= 0 ? ctx.input(i + shift) : nullptr;
    return v && v->numel() > 0 ? v : nullptr;
  };
  if (const TensorView* v = given(a.scales_input))
    args.scales = floats_of(v->dtype, v->data, v->numel(), where, "scales");
  if (const TensorView* v = given(a.sizes_input)) args.sizes = shape::view_ints(*v, where);
  if (const TensorView* v = given(a.roi_input))
    args.roi = floats_of(v->dtype, v->data, v->numel(), where, "roi");
  return args;
}

template <typename T>
T from_double(double v, bool exact) {
  if constexpr (ew::is_floating<T>) {
    return static_cast<T>(static_cast<ew::compute_t<T>>(v));
  } else {
    return ew::convert<T>(exact ? v : std::nearbyint(v));
  }
}

// The tap combinations of one output row over axes [from, rank - 1): the row's index r within
// those axes decoded into `coord`, then every combination's offset into the input (strides
// `stride`) and product of weights in `combos` (`next` is scratch). False when the row lies
// outside the crop on one of those axes (tf_crop_and_resize).
struct RowTaps {
  std::vector<int64_t> coord;
  std::vector<std::pair<int64_t, double>> combos, next;

  bool find(const std::vector<AxisTaps>& taps, const std::vector<int64_t>& out,
            const std::vector<int64_t>& stride, size_t from, int64_t r) {
    const size_t rank = out.size();
    coord.resize(rank);
    for (size_t d = rank - 1; d-- > from;) {
      coord[d] = r % out[d];
      r /= out[d];
    }
    combos.assign(1, {0, 1.0});
    for (size_t d = from; d + 1 < rank; ++d) {
      const AxisTaps& t = taps[d];
      const auto c = static_cast<size_t>(coord[d]);
      if (t.outside[c]) return false;
      next.clear();
      for (const auto& [off, w] : combos)
        for (int64_t k = t.first[c]; k < t.first[c + 1]; ++k)
          next.emplace_back(off + t.idx[k] * stride[d], w * t.weight[k]);
      combos.swap(next);
    }
    return true;
  }
};

// y[o..., j] = sum over taps of every axis of prod(weights) * x[taps]; outside the crop on any
// axis: extrapolation_value.
template <typename T>
void resample(const KernelContext& ctx, const TensorView& x, T* y, const std::vector<int64_t>& out,
              const std::vector<AxisTaps>& taps, double extrapolation, bool exact) {
  const size_t rank = out.size();
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * x.dims[d];
  const int64_t last = out[rank - 1];
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < rank; ++d) rows *= out[d];
  const T* xp = x.as<T>();
  const AxisTaps& lt = taps[rank - 1];
  const T extra = from_double<T>(extrapolation, false);
  ctx.parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
    RowTaps row;
    const auto& combos = row.combos;
    for (int64_t r = begin; r < end; ++r) {
      const bool outside = !row.find(taps, out, stride, 0, r);
      T* yr = y + r * last;
      for (int64_t j = 0; j < last; ++j) {
        if (outside || lt.outside[j]) {
          yr[j] = extra;
          continue;
        }
        double acc = 0;
        for (const auto& [off, w] : combos)
          for (int64_t k = lt.first[j]; k < lt.first[j + 1]; ++k)
            acc += w * lt.weight[k] *
                   static_cast<double>(static_cast<ew::compute_t<T>>(xp[off + lt.idx[k]]));
        yr[j] = from_double<T>(acc, exact);
      }
    }
  });
}

class ResizeKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& x = *ctx.input(0);
    OT_CHECK(x.rank() >= 1, where, ": x must have rank >= 1");
    const ResizeAttrs a = attrs_of(ctx.node(), ctx.opset(), where);
    const Geometry g = geometry(a, x.dims, kernel_args(ctx, a, where), where);
    TensorView& y = ctx.output(0, g.out);
    if (y.numel() == 0) return;
    for (size_t d = 0; d < g.out.size(); ++d)
      OT_CHECK(x.dims[d] > 0, where, ": axis ", d, " of x is empty but the output is not");
    std::vector<AxisTaps> taps;
    for (size_t d = 0; d < g.out.size(); ++d) taps.push_back(axis_taps(a, g, d, x.dims[d]));
    const bool exact = a.mode == "nearest";
    ew::dispatch(ew::NumericHalfTypes{} + ew::TypeList<ew::BFloat16>{}, x.dtype, where,
                 [&]<typename T>(Tag<T>) {
                   resample<T>(ctx, x, y.as<T>(), g.out, taps, a.extrapolation, exact);
                 });
  }
};

// ---- gradient: Resize is linear in x, y = sum over taps of w * x[tap], so
// dx[tap] += w * dy for every output element (nothing outside a tf_crop_and_resize crop).

// The number of leading axes whose taps are the identity (one tap j -> j of weight 1): the
// scatter splits over them, as no output element there reaches another block.
size_t identity_prefix(const std::vector<AxisTaps>& taps, std::span<const int64_t> in,
                       const std::vector<int64_t>& out) {
  size_t p = 0;
  for (; p + 1 < out.size(); ++p) {
    const AxisTaps& t = taps[p];
    if (out[p] != in[p]) break;
    bool identity = true;
    for (int64_t j = 0; j < out[p] && identity; ++j)
      identity = !t.outside[j] && t.first[j + 1] - t.first[j] == 1 && t.idx[t.first[j]] == j &&
                 t.weight[t.first[j]] == 1.0;
    if (!identity) break;
  }
  return p;
}

// dx = resample's transpose, summed in double per block of the identity prefix and rounded once.
template <typename T>
void resample_grad(const KernelContext& ctx, const T* dy, T* dx, std::span<const int64_t> in,
                   const std::vector<int64_t>& out, const std::vector<AxisTaps>& taps) {
  const size_t rank = out.size(), p = identity_prefix(taps, in, out);
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * in[d];
  int64_t blocks = 1, rows = 1;  // rows: output rows (all axes but the last) per block
  for (size_t d = 0; d < p; ++d) blocks *= in[d];
  for (size_t d = p; d + 1 < rank; ++d) rows *= out[d];
  const int64_t block_in = p == 0 ? numel(in) : stride[p - 1], last = out[rank - 1];
  const AxisTaps& lt = taps[rank - 1];
  ctx.parallel_for(blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(block_in));
    RowTaps row;
    const auto& combos = row.combos;
    for (int64_t b = begin; b < end; ++b) {
      std::fill(acc.begin(), acc.end(), 0.0);
      const T* dyb = dy + b * rows * last;
      for (int64_t r = 0; r < rows; ++r) {
        if (!row.find(taps, out, stride, p, r)) continue;
        const T* dyr = dyb + r * last;
        for (int64_t j = 0; j < last; ++j) {
          if (lt.outside[j]) continue;
          const auto g = static_cast<double>(static_cast<ew::compute_t<T>>(dyr[j]));
          if (g == 0) continue;
          for (const auto& [off, w] : combos)
            for (int64_t k = lt.first[j]; k < lt.first[j + 1]; ++k)
              acc[static_cast<size_t>(off + lt.idx[k])] += g * w * lt.weight[k];
        }
      }
      T* dxb = dx + b * block_in;
      for (int64_t i = 0; i < block_in; ++i) dxb[i] = from_double<T>(acc[i], false);
    }
  });
}

// ai.onnxtrain.ResizeGrad(dY, x_shape, <the forward's inputs after X>) with the forward's
// attributes -> dX (x_shape's dims, dY's dtype).
class ResizeGradKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const TensorView& dy = *ctx.input(0);
    const std::vector<int64_t> in = shape::view_ints(*ctx.input(1), where);
    OT_CHECK(!in.empty(), where, ": x has rank 0");
    const ResizeAttrs a = attrs_of(ctx.node(), ctx.opset(), where);
    const Geometry g = geometry(a, in, kernel_args(ctx, a, where, 1), where);
    OT_CHECK(dy.dims == g.out, where, ": dY has shape ", join_dims(dy.dims), ", the resize gives ",
             join_dims(g.out));
    TensorView& dx = ctx.output(0, in);
    if (dx.numel() == 0) return;
    std::vector<AxisTaps> taps;
    for (size_t d = 0; d < g.out.size(); ++d) taps.push_back(axis_taps(a, g, d, in[d]));
    ew::dispatch(ew::FloatTypes{} + ew::HalfTypes{} + ew::TypeList<ew::BFloat16>{}, dy.dtype, where,
                 [&]<typename T>(Tag<T>) {
                   resample_grad<T>(ctx, dy.as<T>(), dx.as<T>(), in, g.out, taps);
                 });
  }
};

void infer_resize_grad(InferenceContext& ctx) {
  const ValueType& dy = tensor_input(ctx, 0);
  std::optional<Shape> shape;
  if (const graph::Tensor* t = ctx.input_value(1))
    shape = to_shape(to_int64s(*t, ctx.where()));
  else if (const graph::Shape* d = ctx.input_dim_value(1))
    shape = *d;
  else if (auto rank = known_dims(tensor_input(ctx, 1)); rank && rank->size() == 1)
    shape = Shape(static_cast<size_t>((*rank)[0]));
  set_output(ctx, 0, dy.dtype, shape);
}

void resize_gradient(GradientBuilder& b) {
  if (!b.needs_input_grad(0)) return;
  const graph::Node& n = b.node();
  graph::Value* x = b.input(0);
  // X's dims: a constant where they are all known (X need not stay alive), else Shape(X).
  graph::Value* x_shape = nullptr;
  if (x->shape() && std::all_of(x->shape()->begin(), x->shape()->end(),
                                [](const graph::Dim& d) { return d.is_known(); })) {
    std::vector<int64_t> dims;
    for (const graph::Dim& d : *x->shape()) dims.push_back(d.value);
    const auto rank = static_cast<int64_t>(dims.size());
    x_shape =
        b.constant(graph::Tensor::from_vector<int64_t>(DataType::kInt64, {rank}, dims), "x_shape");
  } else {
    x_shape = b.emit1("Shape", {x});
  }
  std::vector<graph::Value*> inputs{b.output_grad(0), x_shape};
  for (int i = 1; i < b.num_inputs(); ++i) inputs.push_back(b.input(i));
  std::vector<graph::Attribute> attrs = n.attributes;
  if (is_upsample(n)) attrs.push_back(graph::Attribute::make_int(kUpsampleAttr, 1));
  b.set_input_grad(0, b.emit1("ResizeGrad", inputs, std::move(attrs), kOnnxtrainDomain));
}

OpSchema make_resize(const char* op, int since, int until) {
  OpSchema s;
  s.op_type = op;
  s.since_version = since;
  s.until_version = until;
  s.infer = infer_resize;
  s.cpu_kernel = [](const graph::Node&) { return std::make_unique<ResizeKernel>(); };
  s.gradient = resize_gradient;
  return s;
}

}  // namespace

// Resize-10: (X, scales); 11+: (X, roi, scales, sizes); 18+: antialias, axes, aspect policy.
ONNXTRAIN_REGISTER_OP(resize_10) {
  return make_resize("Resize", 10, 10);
}
ONNXTRAIN_REGISTER_OP(resize_11) {
  return make_resize("Resize", 11, 1 << 30);
}
// Upsample-7: scales attribute; 9: scales input. Deprecated from opset 10.
ONNXTRAIN_REGISTER_OP(upsample_7) {
  return make_resize("Upsample", 7, 9);
}
ONNXTRAIN_REGISTER_OP(resize_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "ResizeGrad";
  s.infer = infer_resize_grad;
  s.cpu_kernel = [](const graph::Node&) { return std::make_unique<ResizeGradKernel>(); };
  return s;
}

}  // namespace onnxtrain::ops::nn
