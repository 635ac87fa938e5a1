// Resize / Upsample beyond the backend suite (whose data predates opset 18): antialiasing,
// axes, keep_aspect_ratio_policy, half_pixel_symmetric, every nearest_mode against every
// coordinate mode, crop extrapolation, integer rounding, Upsample/Resize-10, errors. The
// reference below transcribes the ONNX Python reference (n nearest neighbours of an
// edge-padded row, recursion over axes) in float64; the kernel computes tap lists instead.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "tests/ops/op_test_util.h"

namespace onnxtrain::optest {
namespace {

struct RefAttrs {
  std::string mode = "nearest", coord = "half_pixel", nearest = "round_prefer_floor";
  double a = -0.75, extrapolation = 0;
  bool exclude_outside = false, antialias = false;
};

double ref_original(const RefAttrs& at, double x, double scale, double len_in, double len_out_f,
                    int64_t len_out, double roi_start, double roi_end) {
  if (at.coord == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (at.coord == "half_pixel_symmetric") {
    double adj = static_cast<double>(len_out) / len_out_f, center = len_in / 2;
    return center * (1 - adj) + (x + 0.5) / scale - 0.5;
  }
  if (at.coord == "pytorch_half_pixel") return len_out_f > 1 ? (x + 0.5) / scale - 0.5 : 0;
  if (at.coord == "align_corners") return len_out_f == 1 ? 0 : x * (len_in - 1) / (len_out_f - 1);
  if (at.coord == "asymmetric") return x / scale;
  if (at.coord == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  return len_out_f > 1
             ? roi_start * (len_in - 1) + x * (roi_end - roi_start) * (len_in - 1) / (len_out_f - 1)
             : 0.5 * (roi_start + roi_end) * (len_in - 1);
}

double cubic(double x, double a) {
  x = std::abs(x);
  if (x <= 1) return (a + 2) * x * x * x - (a + 3) * x * x + 1;
  if (x < 2) return a * x * x * x - 5 * a * x * x + 8 * a * x - 4 * a;
  return 0;
}

std::vector<double> ref_coeffs(const RefAttrs& at, double ratio, double scale) {
  if (at.mode == "nearest") {
    if (ratio == std::floor(ratio)) return {0, 1};
    if (at.nearest == "round_prefer_floor")
      return {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};
    if (at.nearest == "round_prefer_ceil")
      return {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
    if (at.nearest == "floor") return {1, 0};
    return {0, 1};
  }
  std::vector<double> c;
  if (!at.antialias) {
    if (at.mode == "linear") return {1 - ratio, ratio};
    return {cubic(ratio + 1, at.a), cubic(ratio, at.a), cubic(1 - ratio, at.a),
            cubic(2 - ratio, at.a)};
  }
  scale = std::min(scale, 1.0);
  if (at.mode == "linear") {
    int64_t start = static_cast<int64_t>(std::floor(-1 / scale) + 1), n = 2 - 2 * start;
    for (int64_t i = start; i < start + n; ++i)
      c.push_back(std::clamp(1 - std::abs((static_cast<double>(i) - ratio) * scale), 0.0, 1.0));
  } else {
    int64_t start = static_cast<int64_t>(std::floor(-2 / scale) + 1), end = 2 - start;
    for (int64_t i = start; i < end; ++i)
      c.push_back(cubic(scale * (static_cast<double>(i) - ratio), at.a));
  }
  double sum = std::accumulate(c.begin(), c.end(), 0.0);
  for (double& v : c) v /= sum;
  return c;
}

// One output element of a 1-D row.
double ref_1d(const RefAttrs& at, const std::vector<double>& row, double scale, int64_t len_out,
              int64_t x, double roi_start, double roi_end) {
  const auto len = static_cast<int64_t>(row.size());
  const double x_ori = ref_original(at, static_cast<double>(x), scale, static_cast<double>(len),
                                    scale * static_cast<double>(len), len_out, roi_start, roi_end);
  if (at.coord == "tf_crop_and_resize" && (x_ori < 0 || x_ori > static_cast<double>(len - 1)))
    return at.extrapolation;
  const double ratio = x_ori == std::floor(x_ori) ? 1 : x_ori - std::floor(x_ori);
  std::vector<double> c = ref_coeffs(at, ratio, scale);
  const auto n = static_cast<int64_t>(c.size()), pad = (n + 1) / 2;
  std::vector<int64_t> order(static_cast<size_t>(len + 2 * pad));
  std::iota(order.begin(), order.end(), int64_t{0});
  const double xp = x_ori + static_cast<double>(pad);
  std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) {
    return std::abs(xp - static_cast<double>(p)) < std::abs(xp - static_cast<double>(q));
  });
  std::vector<int64_t> idx(order.begin(), order.begin() + n);
  std::sort(idx.begin(), idx.end());
  if (at.exclude_outside) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (idx[i] - pad < 0 || idx[i] - pad >= len) c[i] = 0;
      sum += c[i];
    }
    for (double& v : c) v /= sum;
  }
  double out = 0;
  for (int64_t i = 0; i < n; ++i) out += c[i] * row[std::clamp(idx[i] - pad, int64_t{0}, len - 1)];
  return out;
}

// Recursion over axes, as the reference's interpolate_nd: resample each sub-tensor along the
// trailing axes first, then the resulting row along the leading axis.
std::vector<double> ref_resize(const RefAttrs& at, const std::vector<double>& x,
                               const std::vector<int64_t>& dims, const std::vector<double>& scales,
                               const std::vector<int64_t>& out,
                               const std::vector<double>& roi = {}) {
  const size_t rank = dims.size();
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * dims[d];
  std::function<double(size_t, int64_t, const std::vector<int64_t>&)> at_point =
      [&](size_t d, int64_t base, const std::vector<int64_t>& o) -> double {
    std::vector<double> row(static_cast<size_t>(dims[d]));
    for (int64_t i = 0; i < dims[d]; ++i)
      row[i] = d + 1 == rank ? x[base + i * stride[d]] : at_point(d + 1, base + i * stride[d], o);
    double rs = roi.empty() ? 0 : roi[d], re = roi.empty() ? 1 : roi[rank + d];
    return ref_1d(at, row, scales[d], out[d], o[d], rs, re);
  };
  std::vector<double> y;
  std::vector<int64_t> o(rank, 0);
  int64_t total = 1;
  for (int64_t v : out) total *= v;
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rem = flat;
    for (size_t d = rank; d-- > 0;) {
      o[d] = rem % out[d];
      rem /= out[d];
    }
    y.push_back(at_point(0, 0, o));
  }
  return y;
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

NodeCall resize_call(std::vector<NodeInput> inputs, std::vector<Attribute> attrs, int64_t opset,
                     const char* op = "Resize") {
  NodeCall c;
  c.op = op;
  c.inputs = std::move(inputs);
  c.attrs = std::move(attrs);
  c.opset = opset;
  return c;
}

std::vector<Attribute> attrs_of(const RefAttrs& at) {
  return {Attribute::make_string("mode", at.mode),
          Attribute::make_string("coordinate_transformation_mode", at.coord),
          Attribute::make_string("nearest_mode", at.nearest),
          Attribute::make_float("cubic_coeff_a", static_cast<float>(at.a)),
          Attribute::make_int("exclude_outside", at.exclude_outside),
          Attribute::make_float("extrapolation_value", static_cast<float>(at.extrapolation)),
          Attribute::make_int("antialias", at.antialias)};
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                     const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << what << " at " << i;
}

// Resize-18+ with scales: X, roi omitted, scales constant.
void check_scales(const RefAttrs& at, const std::vector<int64_t>& dims,
                  const std::vector<float>& scales, const std::vector<int64_t>& want_dims,
                  int64_t opset = 18) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  auto x = random_floats(static_cast<size_t>(n), 11);
  auto r = run_node(
      resize_call({{f32(dims, x)}, {}, {f32({static_cast<int64_t>(scales.size())}, scales), true}},
                  attrs_of(at), opset));
  ASSERT_EQ(r.outputs[0].dims(), want_dims);
  std::vector<double> s(scales.begin(), scales.end());
  expect_near_all(values_of(r.outputs[0]), ref_resize(at, {x.begin(), x.end()}, dims, s, want_dims),
                  at.mode + "/" + at.coord + "/" + at.nearest);
}

TEST(Resize, LinearAndCubicAntialiasDownsample) {
  RefAttrs at;
  at.antialias = true;
  at.mode = "linear";
  check_scales(at, {1, 1, 7, 9}, {1, 1, 0.5f, 0.4f}, {1, 1, 3, 3});
  at.mode = "cubic";
  check_scales(at, {1, 2, 9, 8}, {1, 1, 0.45f, 0.6f}, {1, 2, 4, 4});
  at.exclude_outside = true;
  at.a = -0.5;
  check_scales(at, {1, 1, 6, 10}, {1, 1, 0.5f, 0.3f}, {1, 1, 3, 3});
  // Upsampling ignores antialias.
  check_scales(at, {1, 1, 3, 4}, {1, 1, 2.0f, 1.5f}, {1, 1, 6, 6});
}

TEST(Resize, EveryNearestModeWithEveryCoordinateMode) {
  for (const char* coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                            "tf_half_pixel_for_nn", "half_pixel_symmetric"})
    for (const char* nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
      for (float scale : {0.6f, 1.0f, 1.75f, 3.0f}) {
        RefAttrs at;
        at.coord = coord;
        at.nearest = nearest;
        const int64_t out = static_cast<int64_t>(std::floor(7.0 * scale));
        check_scales(at, {2, 7}, {1.0f, scale}, {2, out}, 19);
      }
}

TEST(Resize, LinearAndCubicEveryCoordinateMode) {
  for (const char* mode : {"linear", "cubic"})
    for (const char* coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                              "half_pixel_symmetric"})
      for (float scale : {0.7f, 2.5f}) {
        RefAttrs at;
        at.mode = mode;
        at.coord = coord;
        const int64_t out = static_cast<int64_t>(std::floor(6.0 * scale));
        check_scales(at, {3, 6}, {scale, scale},
                     {static_cast<int64_t>(std::floor(3.0 * scale)), out}, 19);
      }
}

TEST(Resize, AxesAndKeepAspectRatioPolicy) {
  const std::vector<int64_t> dims{2, 6, 8};
  auto x = random_floats(96, 3);
  RefAttrs at;
  at.mode = "linear";
  // sizes (3, 3) on axes (1, 2): not_larger scales both by min(3/6, 3/8) = 0.375 -> (2, 2, 3);
  // not_smaller by max = 0.5 -> (2, 3, 4).
  for (auto [policy, s, want] : {std::tuple{"not_larger", 0.375, std::vector<int64_t>{2, 2, 3}},
                                 std::tuple{"not_smaller", 0.5, std::vector<int64_t>{2, 3, 4}},
                                 std::tuple{"stretch", 0.0, std::vector<int64_t>{2, 3, 3}}}) {
    auto attrs = attrs_of(at);
    attrs.push_back(Attribute::make_ints("axes", {-2, 2}));
    attrs.push_back(Attribute::make_string("keep_aspect_ratio_policy", policy));
    auto r = run_node(resize_call({{f32(dims, x)}, {}, {}, {i64({2}, {3, 3}), true}}, attrs, 18));
    ASSERT_EQ(r.outputs[0].dims(), want) << policy;
    std::vector<double> scales{1, s, s};
    if (s == 0) scales = {1, 0.5, 3.0 / 8};
    expect_near_all(values_of(r.outputs[0]),
                    ref_resize(at, {x.begin(), x.end()}, dims, scales, want), policy);
  }
}

TEST(Resize, CropAndResizeExtrapolates) {
  RefAttrs at;
  at.mode = "linear";
  at.coord = "tf_crop_and_resize";
  at.extrapolation = 7.5;
  const std::vector<float> x{1, 2, 4, 8, 3, 5, 6, 9};
  const std::vector<float> roi{0, -0.5f, 1, 1.5f};  // starts, then ends
  auto r = run_node(resize_call(
      {{f32({2, 4}, x)}, {f32({4}, roi), true}, {}, {i64({2}, {2, 6}), true}}, attrs_of(at), 13));
  ASSERT_EQ(r.outputs[0].dims(), (std::vector<int64_t>{2, 6}));
  auto got = values_of(r.outputs[0]);
  auto want =
      ref_resize(at, {x.begin(), x.end()}, {2, 4}, {1.0, 1.5}, {2, 6}, {roi.begin(), roi.end()});
  expect_near_all(got, want, "crop");
  // x_original = -0.5 * 3 + j * 2 * 3 / 5 = -1.5, -0.3, 0.9, 2.1, 3.3, 4.5: only columns 2 and 3
  // lie inside [0, 3].
  for (int j : {0, 1, 4, 5}) EXPECT_EQ(got[j], 7.5) << j;
  EXPECT_NEAR(got[2], 0.1 * 1 + 0.9 * 2, 1e-6);
  EXPECT_NEAR(got[3], 0.9 * 4 + 0.1 * 8, 1e-6);
}

TEST(Resize, Uint8RoundsAndNearestCopies) {
  auto attrs = attrs_of(RefAttrs{});
  attrs[0] = Attribute::make_string("mode", "linear");
  attrs[1] = Attribute::make_string("coordinate_transformation_mode", "asymmetric");
  auto r = run_node(resize_call(
      {{make<uint8_t>(DataType::kUInt8, {1, 2}, {0, 255})}, {}, {f32({2}, {1, 4}), true}}, attrs,
      13));
  // x_original = j / 4: 0, 63.75, 127.5 (ties to even), 191.25, then the edge.
  EXPECT_EQ(values<uint8_t>(r.outputs[0]),
            (std::vector<uint8_t>{0, 64, 128, 191, 255, 255, 255, 255}));
}

TEST(Resize, UpsampleAndResize10) {
  const Tensor x = f32({1, 3}, {1, 2, 3});
  auto u7 = run_node(resize_call({{x}}, {Attribute::make_floats("scales", {1, 2})}, 7, "Upsample"));
  EXPECT_EQ(values_of(u7.outputs[0]), (std::vector<double>{1, 1, 2, 2, 3, 3}));
  auto u9 = run_node(resize_call({{x}, {f32({2}, {1, 2}), true}},
                                 {Attribute::make_string("mode", "bilinear")}, 9, "Upsample"));
  EXPECT_EQ(values_of(u9.outputs[0]), (std::vector<double>{1, 1.5, 2, 2.5, 3, 3}));
  auto r10 = run_node(resize_call({{x}, {f32({2}, {1, 2}), false}},
                                  {Attribute::make_string("mode", "linear")}, 10));
  EXPECT_EQ(values_of(r10.outputs[0]), (std::vector<double>{1, 1.5, 2, 2.5, 3, 3}));
}

TEST(Resize, Errors) {
  auto message = [](const NodeCall& c) {
    try {
      run_node(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Tensor x = f32({1, 4}, {1, 2, 3, 4});
  const NodeInput scales{f32({2}, {1, 2}), true}, sizes{i64({2}, {1, 8}), true};
  EXPECT_NE(message(resize_call({{x}, {}, scales, sizes}, {}, 13)).find("exactly one of"),
            std::string::npos);
  EXPECT_NE(message(resize_call({{x}, {}, {}, {}}, {}, 13)).find("got neither"), std::string::npos);
  EXPECT_NE(message(resize_call({{x}, {}, {f32({3}, {1, 2, 2}), true}}, {}, 13))
                .find("'scales' has 3 values, expected 2"),
            std::string::npos);
  EXPECT_NE(message(resize_call({{x}, {}, {f32({2}, {1, -2}), true}}, {}, 13)).find("must be > 0"),
            std::string::npos);
  EXPECT_NE(message(resize_call({{x}, {}, scales}, {Attribute::make_string("mode", "area")}, 13))
                .find("attribute mode must be one of nearest, linear, cubic, got 'area'"),
            std::string::npos);
  EXPECT_NE(message(resize_call({{x}, {}, {}, sizes},
                                {Attribute::make_string("coordinate_transformation_mode",
                                                        "tf_crop_and_resize")},
                                13))
                .find("needs 'roi'"),
            std::string::npos);
  EXPECT_NE(message(resize_call({{x}, {f32({2}, {1, 2}), true}},
                                {Attribute::make_string("mode", "cubic")}, 10))
                .find("mode must be one of nearest, linear"),
            std::string::npos);
  // Fed at run time, the bad sizes are caught by the kernel, naming the node.
  EXPECT_NE(message(resize_call({{x}, {}, {}, {i64({2}, {1, -3}), false}}, {}, 13)).find("n0"),
            std::string::npos);
}

}  // namespace
}  // namespace onnxtrain::optest
