// Window attributes, output-size rules and oneDNN glue shared by the nn op family.
#include "ops/nn/nn_util.h"

#include <omp.h>

#include <algorithm>
#include <mutex>

#include "ops/nn/conv_algorithm.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}
int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

std::string fmt(std::span<const int64_t> v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::vector<int64_t> read_list(const graph::Node& n, const char* name, size_t size, int64_t fill,
                               int64_t min_value, const std::string& where) {
  std::vector<int64_t> v = n.attr_ints(name, std::vector<int64_t>(size, fill));
  OT_CHECK(v.size() == size, where, ": ", name, " ", fmt(v), " has ", v.size(),
           " entries, expected ", size);
  for (int64_t x : v)
    OT_CHECK(x >= min_value, where, ": ", name, " ", fmt(v), " must be >= ", min_value);
  return v;
}

}  // namespace

WindowAttrs read_window_attrs(const graph::Node& n, size_t rank,
                              const std::optional<std::vector<int64_t>>& kernel_from_weights,
                              const std::string& where) {
  WindowAttrs a;
  a.kernel = n.attr_ints("kernel_shape");
  if (kernel_from_weights) {
    if (a.kernel.empty()) a.kernel = *kernel_from_weights;
    OT_CHECK(a.kernel == *kernel_from_weights, where, ": kernel_shape ", fmt(a.kernel),
             " does not match the weight's spatial dims ", fmt(*kernel_from_weights));
  }
  OT_CHECK(rank <= 12, where, ": ", rank, " spatial dims are more than supported (12)");
  OT_CHECK(!a.kernel.empty() || rank == 0, where, ": kernel_shape is required");
  OT_CHECK(a.kernel.size() == rank, where, ": kernel_shape ", fmt(a.kernel), " has ",
           a.kernel.size(), " entries, the input has ", rank, " spatial dims");
  for (int64_t k : a.kernel)
    OT_CHECK(k >= 1, where, ": kernel dims ", fmt(a.kernel), " must be >= 1");
  a.strides = read_list(n, "strides", rank, 1, 1, where);
  a.dilations = read_list(n, "dilations", rank, 1, 1, where);
  a.pads = read_list(n, "pads", 2 * rank, 0, 0, where);
  std::string pad = n.attr_string("auto_pad", "NOTSET");
  if (pad == "NOTSET" || pad.empty()) {
    a.auto_pad = AutoPad::kNotSet;
  } else if (pad == "SAME_UPPER") {
    a.auto_pad = AutoPad::kSameUpper;
  } else if (pad == "SAME_LOWER") {
    a.auto_pad = AutoPad::kSameLower;
  } else if (pad == "VALID") {
    a.auto_pad = AutoPad::kValid;
  } else {
    fail(where, ": unknown auto_pad '", pad, "' (NOTSET, SAME_UPPER, SAME_LOWER, VALID)");
  }
  a.ceil_mode = n.attr_int("ceil_mode", 0) != 0;
  return a;
}

AxisWindow forward_axis(const WindowAttrs& a, size_t axis, int64_t in, const std::string& where) {
  const size_t rank = a.kernel.size();
  const int64_t s = a.strides[axis];
  const int64_t extent = (a.kernel[axis] - 1) * a.dilations[axis] + 1;
  AxisWindow w;
  switch (a.auto_pad) {
    case AutoPad::kSameUpper:
    case AutoPad::kSameLower: {
      w.out = ceil_div(in, s);
      int64_t total = std::max<int64_t>(0, (w.out - 1) * s + extent - in);
      int64_t small = total / 2;
      w.pad_begin = a.auto_pad == AutoPad::kSameUpper ? small : total - small;
      w.pad_end = total - w.pad_begin;
      return w;
    }
    case AutoPad::kValid:
      break;
    case AutoPad::kNotSet:
      w.pad_begin = a.pads[axis];
      w.pad_end = a.pads[axis + rank];
      break;
  }
  int64_t span = in + w.pad_begin + w.pad_end - extent;
  OT_CHECK(span >= 0, where, ": kernel extent ", extent, " (kernel ", a.kernel[axis], ", dilation ",
           a.dilations[axis], ") exceeds the padded input size ", in + w.pad_begin + w.pad_end,
           " on spatial axis ", axis);
  if (a.ceil_mode) {
    w.out = ceil_div(span, s) + 1;
    if ((w.out - 1) * s >= in + w.pad_begin) --w.out;  // last window would start in the end pad
  } else {
    w.out = span / s + 1;
  }
  return w;
}

AxisWindow transpose_axis(const WindowAttrs& a, size_t axis, int64_t in, int64_t output_padding,
                          std::optional<int64_t> output_size, const std::string& where) {
  const size_t rank = a.kernel.size();
  const int64_t s = a.strides[axis];
  const int64_t extent = (a.kernel[axis] - 1) * a.dilations[axis] + 1;
  const int64_t natural = s * (in - 1) + output_padding + extent;
  AxisWindow w;
  bool same = a.auto_pad == AutoPad::kSameUpper || a.auto_pad == AutoPad::kSameLower;
  if (!output_size && same) output_size = in * s;
  if (output_size) {
    OT_CHECK(*output_size >= 0, where, ": output_shape entry ", *output_size, " is negative");
    int64_t total = natural - *output_size;
    int64_t half = floor_div(total, 2);
    if (a.auto_pad == AutoPad::kSameUpper) {
      w.pad_begin = half;
      w.pad_end = total - half;
    } else {
      w.pad_begin = total - half;
      w.pad_end = half;
    }
    w.out = *output_size;
    return w;
  }
  if (a.auto_pad == AutoPad::kNotSet) {
    w.pad_begin = a.pads[axis];
    w.pad_end = a.pads[axis + rank];
  }
  w.out = natural - w.pad_begin - w.pad_end;
  OT_CHECK(w.out >= 0, where, ": pads ", w.pad_begin, "+", w.pad_end, " exceed the output size ",
           natural, " on spatial axis ", axis);
  return w;
}

int64_t WindowGeom::add_axis(int64_t in_dim, int64_t out_dim, int64_t begin, int64_t end) {
  in.push_back(in_dim);
  out.push_back(out_dim);
  pad_begin.push_back(begin);
  pad_end.push_back(end);
  return out_dim;
}

void WindowGeom::finish(std::vector<int64_t> kernel_dims, std::vector<int64_t> strides_,
                        std::vector<int64_t> dilations_) {
  kernel = std::move(kernel_dims);
  strides = std::move(strides_);
  dilations = std::move(dilations_);
  finish();
}

void WindowGeom::finish() {
  in_size = product(in);
  out_size = product(out);
  kernel_size = product(kernel);
}

void collect_taps(const WindowGeom& g, int64_t o, bool transposed, std::vector<Tap>& taps) {
  const size_t rank = g.in.size();
  taps.clear();
  taps.push_back({0, 0});
  // Output coordinates, outermost axis first.
  int64_t coord[16];
  for (size_t a = rank; a-- > 0;) {
    coord[a] = o % g.out[a];
    o /= g.out[a];
  }
  std::vector<Tap> next;
  for (size_t a = 0; a < rank; ++a) {
    next.clear();
    const int64_t s = g.strides[a], d = g.dilations[a], in = g.in[a];
    for (const Tap& t : taps) {
      for (int64_t k = 0; k < g.kernel[a]; ++k) {
        int64_t pos;
        if (transposed) {
          int64_t num = coord[a] + g.pad_begin[a] - k * d;
          if (num < 0 || num % s != 0) continue;
          pos = num / s;
        } else {
          pos = coord[a] * s - g.pad_begin[a] + k * d;
        }
        if (pos < 0 || pos >= in) continue;
        next.push_back({t.k * g.kernel[a] + k, t.i * in + pos});
      }
    }
    taps.swap(next);
  }
}

// ---------------------------------------------------------------- oneDNN glue

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

void warm_gemm_kernels(std::string_view impl, dnnl::memory::data_type compute) {
  if (compute != dnnl::memory::data_type::f32 || impl.find("gemm:jit") == std::string_view::npos)
    return;
  static std::once_flag once;
  std::call_once(once, [] {
    constexpr int64_t n = 64;  // past oneDNN's small-matrix paths, into the blocked driver
    std::vector<float> a(n * n, 1.0f), b(n * n, 1.0f), c(n * n);
    (void)dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
}

ThreadBudget::ThreadBudget(int threads) : previous_(omp_get_max_threads()) {
  omp_set_num_threads(std::max(1, threads));
}

ThreadBudget::~ThreadBudget() {
  omp_set_num_threads(previous_);
}

dnnl::memory::dims to_dnnl(std::span<const int64_t> v) {
  return dnnl::memory::dims(v.begin(), v.end());
}

std::vector<int64_t> row_major_strides(std::span<const int64_t> dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * std::max<int64_t>(dims[i], 1);
  return s;
}

dnnl::memory::desc plain_desc(std::span<const int64_t> dims, dnnl::memory::data_type type) {
  std::vector<int64_t> s = row_major_strides(dims);
  return dnnl::memory::desc(to_dnnl(dims), type, to_dnnl(s));
}

dnnl::memory::desc strided_desc(std::span<const int64_t> dims, std::span<const int64_t> strides) {
  return dnnl::memory::desc(to_dnnl(dims), dnnl::memory::data_type::f32, to_dnnl(strides));
}

size_t ScratchPlan::add(size_t bytes) {
  size_t offset = total_;
  total_ += (bytes + 63) / 64 * 64;
  return offset;
}

// ---------------------------------------------------------------- misc

int64_t product(std::span<const int64_t> v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

std::string join_dims(std::span<const int64_t> v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s.empty() ? "scalar" : s;
}

std::optional<dnnl::memory::data_type> dnnl_float_type(DataType t) {
  switch (t) {
    case DataType::kFloat:
      return dnnl::memory::data_type::f32;
    case DataType::kBFloat16:
      return dnnl::memory::data_type::bf16;
    case DataType::kFloat16:
      return dnnl::memory::data_type::f16;
    default:
      return std::nullopt;
  }
}

}  // namespace onnxtrain::ops::nn

namespace onnxtrain::ops {

bool cpu_runs_natively(graph::DataType t) {
  using graph::DataType;
  if (t == DataType::kFloat) return true;
  if (t != DataType::kBFloat16) return false;
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;  // oneDNN's ISA values are bit sets, each a superset of the last
}

}  // namespace onnxtrain::ops

namespace onnxtrain::ops::nn {

void check_float_input(const InferenceContext& ctx, size_t i) {
  const ValueType& t = tensor_input(ctx, i);
  OT_CHECK(t.dtype == DataType::kUndefined || graph::is_float_dtype(t.dtype), ctx.where(),
           ": input ", i, " must be a float tensor, got ", graph::dtype_short_name(t.dtype));
}

dnnl::algorithm requested_conv_algorithm(const graph::Node& node) {
  const std::string algo = node.attr_string(kConvAlgorithmAttr, "");
  if (algo.empty()) return dnnl::algorithm::convolution_direct;
  OT_CHECK(algo == kConvWinograd, node.describe(), ": ", kConvAlgorithmAttr, " '", algo,
           "' is not a convolution algorithm (winograd, or no attribute for direct)");
  return dnnl::algorithm::convolution_winograd;
}

}  // namespace onnxtrain::ops::nn
