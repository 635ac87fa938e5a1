// The nn op family (Conv, ConvTranspose, MaxPool/AveragePool, global pools, BatchNormalization,
// Gemm, MatMul, LRN) run as one-node graphs through InferenceSession on random shapes and
// attributes, checked against naive float64 loops written out here (independent of the kernels'
// own reference paths: Conv by direct nested loops, ConvTranspose by scatter).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "graph/bfloat16.h"
#include "graph/error.h"
#include "graph/ir.h"
#include "ops/nn/batch_norm_relu.h"
#include "ops/op_api.h"
#include "runtime/session.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;
using graph::ValueType;

// One node in a model of its own; inputs in0, in1, ... (an undefined Tensor omits the slot).
struct NodeCase {
  std::string op;
  std::vector<Tensor> inputs;
  std::vector<Attribute> attrs;
  int outputs = 1;
  int64_t opset = 13;
  int threads = 0;
  bool constant_weights = false;  // inputs after the first become initializers
};

std::vector<Tensor> run(const NodeCase& c) {
  optest::NodeCall call{c.op, {}, c.attrs, c.outputs, c.opset, "", c.threads, {}};
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    call.inputs.push_back({t.dtype() == DataType::kUndefined ? std::nullopt : std::optional<Tensor>(t),
                           c.constant_weights && i > 0});
  }
  return optest::run_node(call).outputs;
}

std::mt19937& rng() {
  static std::mt19937 gen(20240601);
  return gen;
}
int64_t pick(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng());
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

// Random tensor of `dtype` with the same values in `values` (as doubles).
Tensor random_tensor(DataType dtype, const std::vector<int64_t>& dims,
                     std::vector<double>& values) {
  std::uniform_real_distribution<double> d(-1, 1);
  values.resize(static_cast<size_t>(product(dims)));
  Tensor t(dtype, dims);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DataType::kFloat) {
      float f = static_cast<float>(d(rng()));
      values[i] = f;
      t.mutable_data_as<float>()[i] = f;
    } else {
      values[i] = d(rng());
      t.mutable_data_as<double>()[i] = values[i];
    }
  }
  return t;
}

using optest::values_of;

void expect_near(const Tensor& got, const std::vector<int64_t>& dims,
                 const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.dims(), dims) << what;
  const auto v = values_of(got);
  ASSERT_EQ(v.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < v.size() && reported < 5; ++i)
    if (!(std::abs(v[i] - want[i]) <= tol * (1 + std::abs(want[i])))) {
      ADD_FAILURE() << what << " at " << i << ": got " << v[i] << ", want " << want[i];
      ++reported;
    }
}

std::string str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Advances a coordinate odometer; false after the last one.
bool next(std::vector<int64_t>& c, const std::vector<int64_t>& limits) {
  for (size_t i = c.size(); i-- > 0;) {
    if (++c[i] < limits[i]) return true;
    c[i] = 0;
  }
  return false;
}

int64_t flat(const std::vector<int64_t>& c, const std::vector<int64_t>& dims) {
  int64_t f = 0;
  for (size_t i = 0; i < c.size(); ++i) f = f * dims[i] + c[i];
  return f;
}

// ---------------------------------------------------------------- window attributes

struct Window {
  std::vector<int64_t> in, kernel, strides, dilations, pads_begin, pads_end;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;
  std::vector<int64_t> out;  // filled by resolve()
};

void resolve(Window& w) {
  w.out.clear();
  for (size_t i = 0; i < w.in.size(); ++i) {
    int64_t ext = (w.kernel[i] - 1) * w.dilations[i] + 1, s = w.strides[i];
    if (w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER") {
      int64_t out = (w.in[i] + s - 1) / s;
      int64_t total = std::max<int64_t>(0, (out - 1) * s + ext - w.in[i]);
      w.pads_begin[i] = w.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.pads_end[i] = total - w.pads_begin[i];
      w.out.push_back(out);
      continue;
    }
    if (w.auto_pad == "VALID") w.pads_begin[i] = w.pads_end[i] = 0;
    double span = static_cast<double>(w.in[i] + w.pads_begin[i] + w.pads_end[i] - ext);
    int64_t out =
        static_cast<int64_t>(w.ceil_mode ? std::ceil(span / s) : std::floor(span / s)) + 1;
    if (w.ceil_mode && (out - 1) * s >= w.in[i] + w.pads_begin[i]) --out;
    w.out.push_back(out);
  }
}

// Random window over `rank` spatial dims whose padded input fits the kernel.
Window random_window(size_t rank, bool allow_dilation, bool allow_auto_pad) {
  Window w;
  for (size_t i = 0; i < rank; ++i) {
    w.kernel.push_back(pick(1, 3));
    w.strides.push_back(pick(1, 3));
    w.dilations.push_back(allow_dilation ? pick(1, 2) : 1);
    w.pads_begin.push_back(pick(0, w.kernel.back() - 1));
    w.pads_end.push_back(pick(0, w.kernel.back() - 1));
    int64_t ext = (w.kernel.back() - 1) * w.dilations.back() + 1;
    w.in.push_back(pick(ext, ext + (rank == 3 ? 3 : 6)));
  }
  if (allow_auto_pad) {
    static const char* modes[] = {"NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"};
    w.auto_pad = modes[pick(0, 4)];
  }
  return w;
}

std::vector<Attribute> window_attrs(const Window& w) {
  std::vector<int64_t> pads = w.pads_begin;
  pads.insert(pads.end(), w.pads_end.begin(), w.pads_end.end());
  std::vector<Attribute> a{Attribute::make_ints("kernel_shape", w.kernel),
                           Attribute::make_ints("strides", w.strides)};
  if (w.auto_pad == "NOTSET")
    a.push_back(Attribute::make_ints("pads", pads));
  else
    a.push_back(Attribute::make_string("auto_pad", w.auto_pad));
  if (w.dilations != std::vector<int64_t>(w.in.size(), 1))
    a.push_back(Attribute::make_ints("dilations", w.dilations));
  return a;
}

// ---------------------------------------------------------------- Conv

// y[n,m,o] = b[m] + sum_{c,k} x[n, g*C/G + c, o*s - p + k*d] * w[m,c,k]
std::vector<double> conv_reference(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>* b, int64_t n, int64_t c, int64_t m,
                                   int64_t group, const Window& win) {
  const int64_t cg = c / group, mg = m / group;
  const int64_t in_size = product(win.in), out_size = product(win.out),
                k_size = product(win.kernel);
  std::vector<double> y(static_cast<size_t>(n * m * out_size));
  const size_t r = win.in.size();
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t oc = 0; oc < m; ++oc) {
      std::vector<int64_t> o(r, 0);
      do {
        double acc = b ? (*b)[oc] : 0.0;
        for (int64_t ic = 0; ic < cg; ++ic) {
          std::vector<int64_t> k(r, 0);
          do {
            std::vector<int64_t> pos(r);
            bool inside = true;
            for (size_t a = 0; a < r; ++a) {
              pos[a] = o[a] * win.strides[a] - win.pads_begin[a] + k[a] * win.dilations[a];
              inside &= pos[a] >= 0 && pos[a] < win.in[a];
            }
            if (!inside) continue;
            int64_t xc = (oc / mg) * cg + ic;
            acc += x[(b0 * c + xc) * in_size + flat(pos, win.in)] *
                   w[(oc * cg + ic) * k_size + flat(k, win.kernel)];
          } while (next(k, win.kernel));
        }
        y[(b0 * m + oc) * out_size + flat(o, win.out)] = acc;
      } while (next(o, win.out));
    }
  return y;
}

void check_random_conv(DataType dtype, int index, int threads) {
  size_t rank = static_cast<size_t>(pick(1, 3));
  Window win = random_window(rank, true, true);
  int64_t group = pick(0, 3) == 0 ? pick(2, 3) : 1;
  bool depthwise = pick(0, 4) == 0;
  int64_t n = pick(1, 2), cg = depthwise ? 1 : pick(1, 3), mg = pick(1, 3);
  if (depthwise) group = pick(2, 5);
  const int64_t c = cg * group, m = mg * group;
  resolve(win);
  std::vector<int64_t> xd{n, c}, wd{m, cg};
  xd.insert(xd.end(), win.in.begin(), win.in.end());
  wd.insert(wd.end(), win.kernel.begin(), win.kernel.end());
  std::vector<double> xv, wv, bv;
  NodeCase nc{
      "Conv", {random_tensor(dtype, xd, xv), random_tensor(dtype, wd, wv)}, window_attrs(win)};
  nc.threads = threads;
  bool bias = pick(0, 1) == 1;
  if (bias) nc.inputs.push_back(random_tensor(dtype, {m}, bv));
  if (group > 1) nc.attrs.push_back(Attribute::make_int("group", group));
  std::vector<int64_t> yd{n, m};
  yd.insert(yd.end(), win.out.begin(), win.out.end());
  auto want = conv_reference(xv, wv, bias ? &bv : nullptr, n, c, m, group, win);
  std::string what = cat("conv #", index, " x", str(xd), " w", str(wd), " group ", group,
                         " strides ", str(win.strides), " dil ", str(win.dilations), " pads ",
                         str(win.pads_begin), str(win.pads_end), " ", win.auto_pad);
  expect_near(run(nc)[0], yd, want, dtype == DataType::kFloat ? 1e-4 : 1e-12, what);
}

TEST(Conv, RandomShapesMatchFloat64Reference) {
  for (int i = 0; i < 150; ++i) check_random_conv(DataType::kFloat, i, i % 2 ? 1 : 0);
}

TEST(Conv, Float64UsesExactReference) {
  for (int i = 0; i < 30; ++i) check_random_conv(DataType::kDouble, i, 0);
}

// Channel counts large enough that oneDNN picks blocked layouts (reorders through scratch),
// 1x1 (plain GEMM path), depthwise, and weights given as initializers.
TEST(Conv, BlockedLayoutsAndConstantWeights) {
  struct Shape {
    int64_t c, m, k, h, group, stride;
  } shapes[] = {{16, 32, 3, 12, 1, 1},
                {32, 16, 1, 9, 1, 1},
                {32, 32, 3, 10, 32, 2},
                {17, 24, 3, 7, 1, 2},
                {3, 16, 7, 20, 1, 2}};
  for (const Shape& s : shapes) {
    for (bool constant : {false, true}) {
      Window win;
      win.in = {s.h, s.h + 1};
      win.kernel = {s.k, s.k};
      win.strides = {s.stride, s.stride};
      win.dilations = {1, 1};
      win.pads_begin = win.pads_end = {s.k / 2, s.k / 2};
      resolve(win);
      std::vector<double> xv, wv, bv;
      NodeCase nc{"Conv",
                  {random_tensor(DataType::kFloat, {2, s.c, s.h, s.h + 1}, xv),
                   random_tensor(DataType::kFloat, {s.m, s.c / s.group, s.k, s.k}, wv),
                   random_tensor(DataType::kFloat, {s.m}, bv)},
                  window_attrs(win)};
      nc.attrs.push_back(Attribute::make_int("group", s.group));
      nc.constant_weights = constant;
      auto want = conv_reference(xv, wv, &bv, 2, s.c, s.m, s.group, win);
      expect_near(run(nc)[0], {2, s.m, win.out[0], win.out[1]}, want, 1e-4,
                  cat("conv c", s.c, " m", s.m, " k", s.k, " g", s.group));
    }
  }
}

TEST(Conv, ErrorsNameTheNode) {
  std::vector<double> v;
  NodeCase nc{"Conv",
              {random_tensor(DataType::kFloat, {1, 4, 5, 5}, v),
               random_tensor(DataType::kFloat, {2, 3, 3, 3}, v)},
              {}};
  try {
    run(nc);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("'n0' (Conv): weight has 3 input channels, x has 4 (group 1)"),
        std::string::npos)
        << e.what();
  }
  nc.inputs[1] = random_tensor(DataType::kFloat, {2, 4, 3}, v);
  EXPECT_THROW(run(nc), Error);  // rank mismatch
  nc.inputs[1] = random_tensor(DataType::kFloat, {2, 4, 7, 7}, v);
  EXPECT_THROW(run(nc), Error);  // kernel larger than the input
}

// ---------------------------------------------------------------- ConvTranspose

// Scatter: y[n, g*M/G + m, i*s + k*d - p] += x[n, g*C/G + c, i] * w[g*C/G + c, m, k]
std::vector<double> deconv_reference(const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>* b, int64_t n, int64_t c, int64_t m,
                                     int64_t group, const Window& win) {
  const int64_t cg = c / group, mg = m / group;
  const int64_t in_size = product(win.in), out_size = product(win.out),
                k_size = product(win.kernel);
  const size_t r = win.in.size();
  std::vector<double> y(static_cast<size_t>(n * m * out_size));
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t oc = 0; oc < m; ++oc)
      for (int64_t o = 0; o < out_size; ++o) y[(b0 * m + oc) * out_size + o] = b ? (*b)[oc] : 0.0;
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t ic = 0; ic < c; ++ic) {
      const int64_t g = ic / cg;
      std::vector<int64_t> i(r, 0);
      do {
        std::vector<int64_t> k(r, 0);
        do {
          std::vector<int64_t> pos(r);
          bool inside = true;
          for (size_t a = 0; a < r; ++a) {
            pos[a] = i[a] * win.strides[a] + k[a] * win.dilations[a] - win.pads_begin[a];
            inside &= pos[a] >= 0 && pos[a] < win.out[a];
          }
          if (!inside) continue;
          for (int64_t ml = 0; ml < mg; ++ml)
            y[(b0 * m + g * mg + ml) * out_size + flat(pos, win.out)] +=
                x[(b0 * c + ic) * in_size + flat(i, win.in)] *
                w[(ic * mg + ml) * k_size + flat(k, win.kernel)];
        } while (next(k, win.kernel));
      } while (next(i, win.in));
    }
  return y;
}

TEST(ConvTranspose, RandomShapesMatchScatterReference) {
  for (int index = 0; index < 120; ++index) {
    const DataType dtype = index % 5 == 4 ? DataType::kDouble : DataType::kFloat;
    size_t rank = static_cast<size_t>(pick(1, 3));
    Window win = random_window(rank, true, false);
    for (auto& x : win.in) x = pick(1, 4);
    int64_t group = pick(0, 2) == 0 ? pick(2, 3) : 1;
    const int64_t n = pick(1, 2), cg = pick(1, 3), mg = pick(1, 3), c = cg * group, m = mg * group;
    std::vector<int64_t> output_padding(rank), output_shape;
    const int mode = static_cast<int>(pick(0, 3));  // pads, pads+output_padding, output_shape, SAME
    win.out.clear();
    for (size_t a = 0; a < rank; ++a) {
      const int64_t ext = (win.kernel[a] - 1) * win.dilations[a] + 1;
      const int64_t natural_base = win.strides[a] * (win.in[a] - 1) + ext;
      if (mode == 1) output_padding[a] = pick(0, win.strides[a] - 1);
      while (mode <= 1 &&
             natural_base + output_padding[a] - win.pads_begin[a] - win.pads_end[a] < 1)
        (win.pads_end[a] > 0 ? win.pads_end[a] : win.pads_begin[a]) -= 1;
      if (mode >= 2) {
        const int64_t out = mode == 3 ? win.in[a] * win.strides[a]
                                      : natural_base + pick(-1, 1) - (pick(0, 1) ? 1 : 0);
        // total = natural - out, split with floor division as the ONNX reference does.
        const int64_t total = natural_base - std::max<int64_t>(out, 1);
        const int64_t half = static_cast<int64_t>(std::floor(total / 2.0));
        win.pads_begin[a] = mode == 3 ? half : total - half;  // mode 3 uses SAME_UPPER
        win.pads_end[a] = total - win.pads_begin[a];
        output_shape.push_back(std::max<int64_t>(out, 1));
      }
      win.out.push_back(natural_base + output_padding[a] - win.pads_begin[a] - win.pads_end[a]);
    }
    std::vector<int64_t> xd{n, c}, wd{c, mg};
    xd.insert(xd.end(), win.in.begin(), win.in.end());
    wd.insert(wd.end(), win.kernel.begin(), win.kernel.end());
    std::vector<double> xv, wv, bv;
    NodeCase nc{"ConvTranspose", {random_tensor(dtype, xd, xv), random_tensor(dtype, wd, wv)}, {}};
    bool bias = pick(0, 1) == 1;
    if (bias) nc.inputs.push_back(random_tensor(dtype, {m}, bv));
    nc.attrs.push_back(Attribute::make_ints("strides", win.strides));
    nc.attrs.push_back(Attribute::make_ints("dilations", win.dilations));
    if (group > 1) nc.attrs.push_back(Attribute::make_int("group", group));
    std::vector<int64_t> pads = win.pads_begin;
    pads.insert(pads.end(), win.pads_end.begin(), win.pads_end.end());
    if (mode <= 1) nc.attrs.push_back(Attribute::make_ints("pads", pads));
    if (mode == 1) nc.attrs.push_back(Attribute::make_ints("output_padding", output_padding));
    if (mode == 2) nc.attrs.push_back(Attribute::make_ints("output_shape", output_shape));
    if (mode == 3) nc.attrs.push_back(Attribute::make_string("auto_pad", "SAME_UPPER"));
    std::vector<int64_t> yd{n, m};
    yd.insert(yd.end(), win.out.begin(), win.out.end());
    auto want = deconv_reference(xv, wv, bias ? &bv : nullptr, n, c, m, group, win);
    std::string what = cat("convtranspose #", index, " mode ", mode, " x", str(xd), " w", str(wd),
                           " group ", group, " strides ", str(win.strides), " dil ",
                           str(win.dilations), " pads ", str(pads), " out ", str(win.out));
    expect_near(run(nc)[0], yd, want, dtype == DataType::kFloat ? 1e-4 : 1e-12, what);
  }
}

// ---------------------------------------------------------------- pools

struct PoolResult {
  std::vector<double> y, indices;
};

PoolResult pool_reference(const std::vector<double>& x, int64_t planes, const Window& win,
                          bool is_max, bool include_pad, bool column_major) {
  const int64_t in_size = product(win.in), out_size = product(win.out);
  const size_t r = win.in.size();
  PoolResult res;
  res.y.resize(static_cast<size_t>(planes * out_size));
  res.indices.resize(res.y.size());
  for (int64_t p = 0; p < planes; ++p) {
    std::vector<int64_t> o(r, 0);
    do {
      double best = -std::numeric_limits<double>::infinity(), sum = 0;
      int64_t arg = -1, count = 0, padded = 0;
      std::vector<int64_t> k(r, 0);
      do {
        std::vector<int64_t> pos(r);
        bool inside = true, in_pads = true;
        for (size_t a = 0; a < r; ++a) {
          pos[a] = o[a] * win.strides[a] - win.pads_begin[a] + k[a] * win.dilations[a];
          inside &= pos[a] >= 0 && pos[a] < win.in[a];
          in_pads &= pos[a] >= -win.pads_begin[a] && pos[a] < win.in[a] + win.pads_end[a];
        }
        padded += in_pads;
        if (!inside) continue;
        const int64_t i = flat(pos, win.in);
        const double v = x[p * in_size + i];
        ++count;
        sum += v;
        if (v > best) {
          best = v;
          int64_t cm = 0, scale = 1;
          for (size_t a = 0; a < r; ++a) {
            cm += pos[a] * scale;
            scale *= win.in[a];
          }
          arg = p * in_size + (column_major ? cm : i);
        }
      } while (next(k, win.kernel));
      const int64_t at = p * out_size + flat(o, win.out);
      res.y[at] = is_max ? best : sum / static_cast<double>(include_pad ? padded : count);
      res.indices[at] = static_cast<double>(arg);
    } while (next(o, win.out));
  }
  return res;
}

TEST(Pool, RandomMaxAndAverageMatchReference) {
  for (int index = 0; index < 160; ++index) {
    const bool is_max = index % 2 == 0;
    const DataType dtype = index % 7 == 3 ? DataType::kDouble : DataType::kFloat;
    size_t rank = static_cast<size_t>(pick(1, 3));
    Window win = random_window(rank, is_max, true);
    win.ceil_mode = win.auto_pad == "NOTSET" && pick(0, 2) == 0;
    resolve(win);
    const bool include_pad = !is_max && pick(0, 1) == 1;
    const bool indices = is_max && pick(0, 1) == 1;
    const bool column = indices && pick(0, 1) == 1;
    const int64_t n = pick(1, 2), c = pick(1, 3);
    std::vector<int64_t> xd{n, c};
    xd.insert(xd.end(), win.in.begin(), win.in.end());
    std::vector<double> xv;
    NodeCase nc{
        is_max ? "MaxPool" : "AveragePool", {random_tensor(dtype, xd, xv)}, window_attrs(win)};
    if (win.ceil_mode) nc.attrs.push_back(Attribute::make_int("ceil_mode", 1));
    if (include_pad) nc.attrs.push_back(Attribute::make_int("count_include_pad", 1));
    if (column) nc.attrs.push_back(Attribute::make_int("storage_order", 1));
    nc.outputs = indices ? 2 : 1;
    nc.opset = 12;
    std::vector<int64_t> yd{n, c};
    yd.insert(yd.end(), win.out.begin(), win.out.end());
    PoolResult want = pool_reference(xv, n * c, win, is_max, include_pad, column);
    std::string what =
        cat(nc.op, " #", index, " x", str(xd), " k", str(win.kernel), " s", str(win.strides), " d",
            str(win.dilations), " pads ", str(win.pads_begin), str(win.pads_end), " ", win.auto_pad,
            " ceil ", win.ceil_mode, " include_pad ", include_pad);
    auto got = run(nc);
    expect_near(got[0], yd, want.y, dtype == DataType::kFloat ? 1e-5 : 1e-12, what);
    if (indices) expect_near(got[1], yd, want.indices, 0, what + " indices");
  }
}

TEST(Pool, MaxPoolUint8AndGlobalPools) {
  Tensor x(DataType::kUInt8, {1, 1, 3, 3});
  for (int i = 0; i < 9; ++i) x.mutable_data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 7) % 10);
  NodeCase mp{"MaxPool", {x}, {Attribute::make_ints("kernel_shape", {2, 2})}};
  mp.opset = 12;
  expect_near(run(mp)[0], {1, 1, 2, 2}, {8, 8, 9, 9}, 0,
              "uint8 maxpool");  // x = [0 7 4; 1 8 5; 2 9 6]

  std::vector<double> xv;
  Tensor t = random_tensor(DataType::kFloat, {2, 3, 4, 5}, xv);
  std::vector<double> avg(6), mx(6, -1e9);
  for (int p = 0; p < 6; ++p)
    for (int i = 0; i < 20; ++i) {
      avg[p] += xv[p * 20 + i] / 20;
      mx[p] = std::max(mx[p], xv[p * 20 + i]);
    }
  expect_near(run({"GlobalAveragePool", {t}, {}})[0], {2, 3, 1, 1}, avg, 1e-6, "gap");
  expect_near(run({"GlobalMaxPool", {t}, {}})[0], {2, 3, 1, 1}, mx, 0, "gmp");
}

// ---------------------------------------------------------------- BatchNormalization

TEST(BatchNorm, InferenceAndTrainingMode) {
  for (DataType dtype : {DataType::kFloat, DataType::kDouble}) {
    const int64_t n = 3, c = 4, inner = 6;
    std::vector<double> xv, sv, bv, mv, vv;
    Tensor x = random_tensor(dtype, {n, c, 2, 3}, xv);
    Tensor s = random_tensor(dtype, {c}, sv), b = random_tensor(dtype, {c}, bv);
    Tensor mean = random_tensor(dtype, {c}, mv), var = random_tensor(dtype, {c}, vv);
    for (int64_t i = 0; i < c; ++i) {
      vv[i] = std::abs(vv[i]) + 0.5;
      if (dtype == DataType::kFloat) {
        vv[i] = static_cast<float>(vv[i]);
        var.mutable_data_as<float>()[i] = static_cast<float>(vv[i]);
      } else {
        var.mutable_data_as<double>()[i] = vv[i];
      }
    }
    const double eps = 1e-3, momentum = 0.8;
    const double tol = dtype == DataType::kFloat ? 1e-5 : 1e-7;  // eps/momentum are f32 attributes
    NodeCase nc{"BatchNormalization",
                {x, s, b, mean, var},
                {Attribute::make_float("epsilon", static_cast<float>(eps)),
                 Attribute::make_float("momentum", static_cast<float>(momentum))}};
    nc.opset = 15;
    std::vector<double> y(xv.size());
    for (int64_t i = 0; i < n * c * inner; ++i) {
      int64_t ch = (i / inner) % c;
      y[i] = sv[ch] * (xv[i] - mv[ch]) / std::sqrt(vv[ch] + eps) + bv[ch];
    }
    expect_near(run(nc)[0], {n, c, 2, 3}, y, tol, "bn inference");

    nc.attrs.push_back(Attribute::make_int("training_mode", 1));
    nc.outputs = 3;
    std::vector<double> bm(c), bvar(c), run_mean(c), run_var(c);
    for (int64_t i = 0; i < n * c * inner; ++i) bm[(i / inner) % c] += xv[i] / (n * inner);
    for (int64_t i = 0; i < n * c * inner; ++i) {
      int64_t ch = (i / inner) % c;
      bvar[ch] += (xv[i] - bm[ch]) * (xv[i] - bm[ch]) / (n * inner);
    }
    for (int64_t i = 0; i < n * c * inner; ++i) {
      int64_t ch = (i / inner) % c;
      y[i] = sv[ch] * (xv[i] - bm[ch]) / std::sqrt(bvar[ch] + eps) + bv[ch];
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      run_mean[ch] = mv[ch] * momentum + bm[ch] * (1 - momentum);
      run_var[ch] = vv[ch] * momentum + bvar[ch] * (1 - momentum);
    }
    auto got = run(nc);
    expect_near(got[0], {n, c, 2, 3}, y, tol, "bn training y");
    expect_near(got[1], {c}, run_mean, tol, "bn running mean");
    expect_near(got[2], {c}, run_var, tol, "bn running var");
  }
}

// Batch statistics of data far from zero: x = 1e7 + k (k in -3..3, exact in float32). The
// kernels' one-pass sums in double are shifted by a sample of the channel; unshifted,
// sum(x^2) - M mean^2 rounds ~3e15-sized sums and is off by ~0.3% of the variance (~4). The
// statistics outputs (running mean and variance; dscale, dbias) are checked against float64
// two-pass references. y and dx are not: their float32 affine step cannot resolve a spread of
// 4 at 1e7 (float32's spacing there is 1), in any implementation.
TEST(BatchNorm, LargeOffsetStatisticsForwardAndGrad) {
  const int64_t n = 2, c = 3, inner = 16, count = n * inner;
  std::uniform_int_distribution<int> k(-3, 3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xf(n * c * inner), dyf(n * c * inner), sf(c), bf(c), mf(c, 0.0f), vf(c, 1.0f);
  for (size_t i = 0; i < xf.size(); ++i) {
    xf[i] = 1e7f + static_cast<float>(k(rng()));
    dyf[i] = u(rng());
  }
  for (int64_t ch = 0; ch < c; ++ch) {
    sf[ch] = 0.5f + static_cast<float>(ch);
    bf[ch] = u(rng());
  }
  const std::vector<int64_t> dims{n, c, 4, 4};
  const double eps = 1e-5;
  std::vector<double> mean(c), var(c);
  for (int64_t i = 0; i < n * c * inner; ++i) mean[(i / inner) % c] += double(xf[i]) / count;
  for (int64_t i = 0; i < n * c * inner; ++i) {
    const int64_t ch = (i / inner) % c;
    var[ch] += (xf[i] - mean[ch]) * (xf[i] - mean[ch]) / count;
  }
  for (int64_t ch = 0; ch < c; ++ch) ASSERT_GT(var[ch], 1.0) << "the data has a spread";
  std::vector<double> dscale(c), dbias(c), run_var(c);
  for (int64_t i = 0; i < n * c * inner; ++i) {
    const int64_t ch = (i / inner) % c;
    const double xhat = (xf[i] - mean[ch]) / std::sqrt(var[ch] + eps);
    dbias[ch] += dyf[i];
    dscale[ch] += dyf[i] * xhat;
  }
  for (int64_t ch = 0; ch < c; ++ch) run_var[ch] = 0.9 * 1.0 + 0.1 * var[ch];

  NodeCase nc{"BatchNormalization",
              {optest::f32(dims, xf), optest::f32({c}, sf), optest::f32({c}, bf), optest::f32({c}, mf), optest::f32({c}, vf)},
              {Attribute::make_float("epsilon", static_cast<float>(eps)),
               Attribute::make_float("momentum", 0.9f), Attribute::make_int("training_mode", 1)}};
  nc.opset = 15;
  nc.outputs = 3;
  const std::vector<Tensor> fwd = run(nc);
  std::vector<double> run_mean(c);
  for (int64_t ch = 0; ch < c; ++ch) run_mean[ch] = 0.1 * mean[ch];
  expect_near(fwd[1], {c}, run_mean, 1e-6, "bn running mean at offset 1e7");
  expect_near(fwd[2], {c}, run_var, 1e-6, "bn running variance at offset 1e7");

  optest::NodeCall g;
  g.op = "BatchNormalizationGrad";
  g.domain = ops::kOnnxtrainDomain;
  g.inputs = {{optest::f32(dims, dyf)}, {optest::f32(dims, xf)}, {optest::f32({c}, sf)}};
  g.attrs = {Attribute::make_float("epsilon", static_cast<float>(eps)),
             Attribute::make_int("training_mode", 1)};
  g.outputs = 3;
  const std::vector<Tensor> grads = optest::run_node(g).outputs;
  expect_near(grads[1], {c}, dscale, 1e-5, "bn dscale at offset 1e7");
  expect_near(grads[2], {c}, dbias, 1e-5, "bn dbias at offset 1e7");
}

// BatchNormalization and its gradient (plain and with the fused Relu) in training mode against
// float64 loops, over plane sizes on both sides of the kernel's row path (below 64 elements per
// plane, 64 for bf16 gradients) and the per-plane path, float32 and bf16, with an offset so the
// shifted sums matter, and a bf16 batch past the row path's 256-image float blocks.
TEST(BatchNorm, RowAndPlanePathsMatchFloat64) {
  struct Case {
    DataType dtype;
    int64_t n, c;
    std::vector<int64_t> spatial;
  };
  const Case cases[] = {
      {DataType::kFloat, 3, 5, {1, 1}},  {DataType::kFloat, 2, 7, {2, 2}},
      {DataType::kFloat, 1, 3, {3, 5}},  {DataType::kFloat, 3, 4, {8, 8}},
      {DataType::kFloat, 2, 3, {10, 10}}, {DataType::kBFloat16, 3, 6, {2, 2}},
      {DataType::kBFloat16, 2, 5, {8, 8}}, {DataType::kBFloat16, 2, 3, {9, 9}},
      {DataType::kBFloat16, 300, 3, {2, 1}},
  };
  const double eps = 1e-5, momentum = 0.9;
  std::normal_distribution<double> normal(0.0, 1.0);
  for (const Case& k : cases) {
    const int64_t inner = product(k.spatial), m = k.n * inner, total = k.n * k.c * inner;
    std::vector<int64_t> dims{k.n, k.c};
    dims.insert(dims.end(), k.spatial.begin(), k.spatial.end());
    const bool low = k.dtype == DataType::kBFloat16;
    // Values representable in the dtype; x around an offset of 20.
    auto value = [&](double offset) {
      const float f = static_cast<float>(offset + normal(rng()));
      return low ? graph::bf16_to_float(graph::bf16_from_float(f)) : f;
    };
    std::vector<float> x(total), dy(total), scale(k.c), bias(k.c), rmean(k.c, 0.5f),
        rvar(k.c, 2.0f);
    for (float& v : x) v = value(20.0);
    for (float& v : dy) v = value(0.0);
    for (int64_t ch = 0; ch < k.c; ++ch) {
      scale[ch] = 0.5f + 0.25f * static_cast<float>(ch);
      bias[ch] = static_cast<float>(normal(rng()));
    }
    auto tensor = [&](const std::vector<float>& v) {
      if (!low) return optest::f32(dims, v);
      std::vector<uint16_t> bits(v.size());
      for (size_t i = 0; i < v.size(); ++i) bits[i] = graph::bf16_from_float(v[i]);
      return Tensor::from_vector(DataType::kBFloat16, dims, bits);
    };
    auto read = [&](const Tensor& t) {
      if (t.dtype() != DataType::kBFloat16) return optest::values_of(t);
      std::vector<double> out(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = graph::bf16_to_float(t.data_as<uint16_t>()[i]);
      return out;
    };
    auto chan = [&](int64_t i) { return (i / inner) % k.c; };
    std::vector<double> mean(k.c), var(k.c);
    for (int64_t i = 0; i < total; ++i) mean[chan(i)] += double(x[i]) / double(m);
    for (int64_t i = 0; i < total; ++i)
      var[chan(i)] += (x[i] - mean[chan(i)]) * (x[i] - mean[chan(i)]) / double(m);
    for (bool relu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << graph::dtype_short_name(k.dtype) << " n=" << k.n
                                        << " inner=" << inner << (relu ? " fused Relu" : ""));
      // Forward: y, running mean and variance.
      std::vector<Attribute> attrs{Attribute::make_float("epsilon", static_cast<float>(eps)),
                                   Attribute::make_float("momentum", float(momentum)),
                                   Attribute::make_int("training_mode", 1)};
      if (relu) attrs.push_back(Attribute::make_int(std::string(ops::kFusedReluAttr), 1));
      NodeCase fwd{"BatchNormalization",
                   {tensor(x), optest::f32({k.c}, scale), optest::f32({k.c}, bias),
                    optest::f32({k.c}, rmean), optest::f32({k.c}, rvar)},
                   attrs};
      fwd.opset = 15;
      fwd.outputs = 3;
      const std::vector<Tensor> out = run(fwd);
      std::vector<double> y(total), z(total);
      double y_max = 0;
      for (int64_t i = 0; i < total; ++i) {
        const int64_t ch = chan(i);
        y[i] = (x[i] - mean[ch]) / std::sqrt(var[ch] + eps) * scale[ch] + bias[ch];
        if (relu) y[i] = std::max(y[i], 0.0);
        y_max = std::max(y_max, std::abs(y[i]));
      }
      const std::vector<double> got_y = read(out[0]);
      const double y_tol = low ? y_max / 128 : 1e-5 * y_max;
      for (int64_t i = 0; i < total; ++i) ASSERT_NEAR(got_y[i], y[i], y_tol) << "y[" << i << "]";
      const std::vector<double> got_rm = optest::values_of(out[1]),
                                got_rv = optest::values_of(out[2]);
      for (int64_t ch = 0; ch < k.c; ++ch) {
        EXPECT_NEAR(got_rm[ch], momentum * rmean[ch] + (1 - momentum) * mean[ch], 2e-5);
        EXPECT_NEAR(got_rv[ch], momentum * rvar[ch] + (1 - momentum) * var[ch], 2e-5);
      }
      // Gradient: dx, dscale, dbias; with the fused Relu dy is masked by its output z (the
      // kernel's own y, as training feeds it).
      std::vector<float> zf(total);
      for (int64_t i = 0; i < total; ++i) zf[i] = static_cast<float>(got_y[i]);
      optest::NodeCall g;
      g.op = "BatchNormalizationGrad";
      g.domain = ops::kOnnxtrainDomain;
      g.inputs = {{tensor(dy)}, {tensor(x)}, {optest::f32({k.c}, scale)}};
      g.attrs = {Attribute::make_float("epsilon", static_cast<float>(eps)),
                 Attribute::make_int("training_mode", 1)};
      if (relu) {
        g.attrs.push_back(Attribute::make_int(std::string(ops::kFusedReluAttr), 1));
        while (g.inputs.size() < static_cast<size_t>(ops::kBatchNormGradReluOutput))
          g.inputs.push_back({std::nullopt});
        g.inputs.push_back({tensor(zf)});
      }
      g.outputs = 3;
      const std::vector<Tensor> grads = optest::run_node(g).outputs;
      std::vector<double> dbias(k.c), dscale(k.c), d(total);
      for (int64_t i = 0; i < total; ++i) {
        d[i] = relu && !(zf[i] > 0) ? 0.0 : dy[i];
        const int64_t ch = chan(i);
        dbias[ch] += d[i];
        dscale[ch] += d[i] * (x[i] - mean[ch]) / std::sqrt(var[ch] + eps);
      }
      const std::vector<double> got_dx = read(grads[0]), got_ds = optest::values_of(grads[1]),
                                got_db = optest::values_of(grads[2]);
      double dx_max = 0;
      std::vector<double> dx(total);
      for (int64_t i = 0; i < total; ++i) {
        const int64_t ch = chan(i);
        const double inv = 1.0 / std::sqrt(var[ch] + eps), xhat = (x[i] - mean[ch]) * inv;
        dx[i] = scale[ch] * inv / double(m) * (double(m) * d[i] - dbias[ch] - xhat * dscale[ch]);
        dx_max = std::max(dx_max, std::abs(dx[i]));
      }
      const double dx_tol = low ? dx_max / 64 : 1e-5 * dx_max;
      for (int64_t i = 0; i < total; ++i)
        ASSERT_NEAR(got_dx[i], dx[i], dx_tol) << "dx[" << i << "]";
      for (int64_t ch = 0; ch < k.c; ++ch) {
        EXPECT_NEAR(got_db[ch], dbias[ch], 1e-5 * (1 + std::abs(dbias[ch]))) << "dbias " << ch;
        EXPECT_NEAR(got_ds[ch], dscale[ch], 1e-4 * (1 + std::abs(dscale[ch]))) << "dscale " << ch;
      }
    }
  }
}

// ---------------------------------------------------------------- Gemm / MatMul

TEST(Gemm, RandomAttributesAndBiasShapes) {
  for (int index = 0; index < 60; ++index) {
    const DataType dtype = index % 4 == 3 ? DataType::kDouble : DataType::kFloat;
    const int64_t m = pick(1, 7), k = pick(1, 9), n = pick(1, 8);
    const bool ta = pick(0, 1), tb = pick(0, 1);
    const float alpha = pick(0, 1) ? 1.0f : 0.5f, beta = pick(0, 2) == 0 ? 0.0f : 1.25f;
    std::vector<std::vector<int64_t>> c_shapes{{}, {1}, {n}, {1, n}, {m, 1}, {m, n}, {1, 1}};
    const int64_t c_kind = pick(-1, 6);  // -1: no C
    std::vector<double> av, bv, cv;
    NodeCase nc{"Gemm",
                {random_tensor(dtype, ta ? std::vector{k, m} : std::vector{m, k}, av),
                 random_tensor(dtype, tb ? std::vector{n, k} : std::vector{k, n}, bv)},
                {Attribute::make_float("alpha", alpha), Attribute::make_float("beta", beta),
                 Attribute::make_int("transA", ta), Attribute::make_int("transB", tb)}};
    std::vector<int64_t> cd;
    if (c_kind >= 0) {
      cd = c_shapes[static_cast<size_t>(c_kind)];
      nc.inputs.push_back(random_tensor(dtype, cd, cv));
    }
    while (c_kind >= 0 && cd.size() < 2) cd.insert(cd.begin(), 1);
    std::vector<double> want(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += (ta ? av[p * m + i] : av[i * k + p]) * (tb ? bv[j * k + p] : bv[p * n + j]);
        double cval = c_kind >= 0 ? cv[(cd[0] == 1 ? 0 : i) * cd[1] + (cd[1] == 1 ? 0 : j)] : 0.0;
        want[i * n + j] = alpha * acc + beta * cval;
      }
    expect_near(
        run(nc)[0], {m, n}, want, dtype == DataType::kFloat ? 1e-5 : 1e-12,
        cat("gemm #", index, " m", m, " k", k, " n", n, " ta", ta, " tb", tb, " C", c_kind));
  }
}

TEST(MatMul, BroadcastingAndVectors) {
  struct Case {
    std::vector<int64_t> a, b, y;
  } cases[] = {{{3, 4}, {4, 5}, {3, 5}},
               {{4}, {4, 5}, {5}},
               {{3, 4}, {4}, {3}},
               {{4}, {4}, {}},
               {{2, 3, 4}, {4, 5}, {2, 3, 5}},
               {{2, 1, 3, 4}, {5, 4, 2}, {2, 5, 3, 2}},
               {{1, 3, 4}, {6, 4, 2}, {6, 3, 2}},
               {{7}, {2, 7, 3}, {2, 3}},
               {{2, 3, 6}, {6}, {2, 3}}};
  for (DataType dtype : {DataType::kFloat, DataType::kDouble}) {
    for (const Case& c : cases) {
      std::vector<double> av, bv;
      NodeCase nc{"MatMul", {random_tensor(dtype, c.a, av), random_tensor(dtype, c.b, bv)}, {}};
      // Reference through promoted shapes and broadcast batch indices.
      std::vector<int64_t> a = c.a, b = c.b;
      if (a.size() == 1) a.insert(a.begin(), 1);
      if (b.size() == 1) b.push_back(1);
      const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
      std::vector<int64_t> ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
      const size_t r = std::max(ab.size(), bb.size());
      while (ab.size() < r) ab.insert(ab.begin(), 1);
      while (bb.size() < r) bb.insert(bb.begin(), 1);
      std::vector<int64_t> batch(r);
      for (size_t i = 0; i < r; ++i) batch[i] = std::max(ab[i], bb[i]);
      std::vector<double> want;
      std::vector<int64_t> bi(r, 0);
      do {
        std::vector<int64_t> ai(r), bj(r);
        for (size_t i = 0; i < r; ++i) {
          ai[i] = ab[i] == 1 ? 0 : bi[i];
          bj[i] = bb[i] == 1 ? 0 : bi[i];
        }
        const int64_t ao = (r ? flat(ai, ab) : 0) * m * k, bo = (r ? flat(bj, bb) : 0) * k * n;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double acc = 0;
            for (int64_t p = 0; p < k; ++p) acc += av[ao + i * k + p] * bv[bo + p * n + j];
            want.push_back(acc);
          }
      } while (r && next(bi, batch));
      expect_near(run(nc)[0], c.y, want, 1e-5, cat("matmul ", str(c.a), " x ", str(c.b)));
    }
  }
  std::vector<double> v;
  NodeCase bad{
      "MatMul",
      {random_tensor(DataType::kFloat, {2, 3}, v), random_tensor(DataType::kFloat, {4, 2}, v)},
      {}};
  EXPECT_THROW(run(bad), Error);
}

// ai.onnxtrain FusedMatMul (passes::fold_transposes): transA / transB read the operand with its
// last two dims swapped, through oneDNN's strides (float32) or a transposed copy (the float64
// reference loop): equal to MatMul on explicitly transposed operands, with broadcasting and a
// 1-D other operand; a flag on a 1-D operand is refused.
TEST(MatMul, FusedMatMulReadsTransposedOperands) {
  auto transposed = [](const Tensor& t) {
    std::vector<int64_t> d = t.dims();
    const int64_t r = d[d.size() - 2], c = d.back(), plane = r * c;
    std::swap(d[d.size() - 2], d[d.size() - 1]);
    Tensor out(t.dtype(), d);
    const size_t e = t.dtype() == DataType::kFloat ? 4 : 8;
    const std::byte* src = t.data();
    std::byte* dst = out.mutable_data();
    for (int64_t p = 0; p < t.numel() / plane; ++p)
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j)
          std::memcpy(dst + (p * plane + j * r + i) * e, src + (p * plane + i * c + j) * e, e);
    return out;
  };
  struct Case {
    std::vector<int64_t> a, b;  // as stored
    int ta, tb;
  } cases[] = {{{3, 4}, {5, 4}, 0, 1},          {{4, 3}, {4, 5}, 1, 0},
               {{4, 3}, {5, 4}, 1, 1},          {{2, 3, 4}, {6, 4}, 0, 1},
               {{2, 1, 4, 3}, {5, 4, 2}, 1, 0}, {{2, 4, 3}, {2, 5, 4}, 1, 1},
               {{7}, {2, 3, 7}, 0, 1},          {{2, 6, 3}, {6}, 1, 0}};
  for (DataType dtype : {DataType::kFloat, DataType::kDouble}) {
    for (const Case& c : cases) {
      std::vector<double> av, bv;
      const Tensor a = random_tensor(dtype, c.a, av), b = random_tensor(dtype, c.b, bv);
      optest::NodeCall fused{"FusedMatMul",
                             {{a}, {b}},
                             {Attribute::make_int("transA", c.ta), Attribute::make_int("transB", c.tb)},
                             1,
                             17,
                             std::string(ops::kOnnxtrainDomain),
                             2,
                             {}};
      const Tensor got = optest::run_node(fused).outputs.at(0);
      const Tensor want = run(NodeCase{"MatMul", {c.ta ? transposed(a) : a, c.tb ? transposed(b) : b}, {}})[0];
      ASSERT_EQ(got.dims(), want.dims()) << str(c.a) << " x " << str(c.b);
      const auto gv = values_of(got), wv = values_of(want);
      for (size_t i = 0; i < gv.size(); ++i)
        ASSERT_NEAR(gv[i], wv[i], 1e-6 * (1 + std::abs(wv[i])))
            << str(c.a) << " x " << str(c.b) << " transA " << c.ta << " transB " << c.tb << " at " << i;
    }
  }
  std::vector<double> v;
  optest::NodeCall bad{"FusedMatMul",
                       {{random_tensor(DataType::kFloat, {4}, v)}, {random_tensor(DataType::kFloat, {4, 3}, v)}},
                       {Attribute::make_int("transA", 1)},
                       1,
                       17,
                       std::string(ops::kOnnxtrainDomain),
                       2,
                       {}};
  EXPECT_THROW(optest::run_node(bad), Error);
}

// ---------------------------------------------------------------- LRN

TEST(Lrn, EvenAndOddSizes) {
  for (int64_t size : {2, 3, 4}) {
    std::vector<double> xv;
    const int64_t n = 2, c = 5, inner = 3;
    Tensor x = random_tensor(DataType::kFloat, {n, c, inner}, xv);
    const double alpha = 1e-2, beta = 0.6, bias = 1.5;
    NodeCase nc{"LRN",
                {x},
                {Attribute::make_int("size", size),
                 Attribute::make_float("alpha", static_cast<float>(alpha)),
                 Attribute::make_float("beta", static_cast<float>(beta)),
                 Attribute::make_float("bias", static_cast<float>(bias))}};
    std::vector<double> want(xv.size());
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t i = 0; i < inner; ++i) {
          double sum = 0;
          for (int64_t k = std::max<int64_t>(0, ch - (size - 1) / 2);
               k <= std::min(c - 1, ch + size / 2); ++k)
            sum += xv[(b * c + k) * inner + i] * xv[(b * c + k) * inner + i];
          const int64_t at = (b * c + ch) * inner + i;
          want[at] = xv[at] / std::pow(bias + alpha / size * sum, beta);
        }
    expect_near(run(nc)[0], {n, c, inner}, want, 1e-5, cat("lrn size ", size));
  }
}

// Timing of a ResNet-50-sized 3x3 conv (not a pass/fail check; run with
// --gtest_also_run_disabled_tests --gtest_filter='*Timing*').
TEST(Conv, DISABLED_ResNetConvTiming) {
  for (int64_t batch : {1, 8}) {
    std::vector<double> v;
    Window win;
    win.in = {56, 56};
    win.kernel = {3, 3};
    win.strides = win.dilations = {1, 1};
    win.pads_begin = win.pads_end = {1, 1};
    NodeCase nc{"Conv",
                {random_tensor(DataType::kFloat, {batch, 64, 56, 56}, v),
                 random_tensor(DataType::kFloat, {64, 64, 3, 3}, v)},
                window_attrs(win)};
    nc.constant_weights = true;
    auto m = std::make_unique<graph::Model>();
    m->set_opset("", 13);
    graph::Graph& g = *m->graph;
    graph::Value* x = g.add_input(
        "x", ValueType::tensor(DataType::kFloat, graph::make_shape({batch, 64, 56, 56})));
    graph::Node* n = g.add_node("Conv", {x, g.add_initializer("w", nc.inputs[1])}, {"y"});
    for (const Attribute& a : nc.attrs) n->set_attr(a);
    g.add_output(n->output(0));
    runtime::InferenceSession s(std::move(m));
    std::map<std::string, Tensor> feeds{{"x", nc.inputs[0]}};
    s.run(feeds);
    std::vector<double> times;
    for (int i = 0; i < 20; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      s.run(feeds);
      times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double ms = times[0], median = times[times.size() / 2];
    double gflops = 2.0 * batch * 64 * 64 * 9 * 56 * 56 / (ms * 1e6);
    std::printf("Conv %lldx64x56x56 3x3 -> 64: min %.3f ms (%.1f GFLOP/s), median %.3f ms\n",
                static_cast<long long>(batch), ms, gflops, median);
  }
}

}  // namespace
}  // namespace onnxtrain
