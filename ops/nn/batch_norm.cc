// BatchNormalization, inference and training mode (batch statistics plus updated running
// statistics). A plain loop rather than oneDNN: per channel it is one affine map (plus one
// statistics pass in training), memory-bound, and the loop covers f64 and mixed parameter
// dtypes (opset 15's T/T1/T2) on inputs of any rank. Training-mode nodes marked blocked = 1
// take and give their activations in oneDNN's blocked channel layout (the blocked section).
// BatchNormalizationGrad (both modes) sits below the forward.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/nn/batch_norm_relu.h"
#include "ops/nn/blocked_layout.h"
#include "ops/nn/nn_util.h"
#include "ops/shape_util.h"
#include "ops/simd_clones.h"

namespace onnxtrain::ops::nn {
namespace {

// Which outputs mean what depends on the opset: from 14 on (Y, running_mean, running_var) with
// training_mode; before, (Y, mean, var, saved_mean, saved_var), training when more than Y is asked
// for (and, before 7, is_test=0).
bool is_training(const graph::Node& n, int64_t opset, bool has_stat_outputs) {
  if (opset >= 14) return n.attr_int("training_mode", 0) != 0;
  if (opset < 7 && n.attr_int("is_test", 0) != 0) return false;
  return has_stat_outputs;
}

// Before opset 9, spatial=0 normalizes every (C, D...) position separately.
bool per_activation(const graph::Node& n, int64_t opset) {
  return opset < 9 && n.attr_int("spatial", 1) == 0;
}

void infer_batch_norm(InferenceContext& ctx) {
  const std::string where = ctx.where();
  check_float_input(ctx, 0);
  const ValueType& x = tensor_input(ctx, 0);
  if (x.shape)
    OT_CHECK(x.shape->size() >= 2, where, ": x has rank ", x.shape->size(),
             "; BatchNormalization needs (N, C, ...)");
  const bool spatial = !per_activation(ctx.node, ctx.opset);
  static const char* names[] = {"scale", "B", "input_mean", "input_var"};
  for (size_t i = 1; i <= 4; ++i) {
    const ValueType& p = tensor_input(ctx, i);
    check_float_input(ctx, i);
    if (!spatial || !p.shape || !x.shape) continue;
    OT_CHECK(p.shape->size() == 1, where, ": ", names[i - 1], " must have rank 1 (C), got rank ",
             p.shape->size());
    const Dim& c = (*x.shape)[1];
    const Dim& pc = (*p.shape)[0];
    OT_CHECK(!c.is_known() || !pc.is_known() || c.value == pc.value, where, ": ", names[i - 1],
             " has ", pc.value, " entries, x has ", c.value, " channels");
  }
  propagate_type(ctx);
  const ValueType& mean = tensor_input(ctx, 3);
  for (size_t i = 1; i < ctx.output_types.size(); ++i) set_output(ctx, i, mean.dtype, mean.shape);
}

// Sums f(0) + ... + f(n-1) in double over 8 independent lanes, merged at the end: one running
// double sum is a chain of dependent adds (one per add latency), the lanes let the compiler
// vectorize and pipeline them. Rounding stays that of a double sum.
double merge_lanes(const double* s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <typename F>
double lane_sum(int64_t n, F f) {
  double s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += f(i + k);
  for (int k = 0; i < n; ++i, ++k) s[k] += f(i);
  return merge_lanes(s);
}

// One channel's sums over its N planes of `inner` elements, in double over 8 lanes, in one pass
// reading x (and dy) once: with K the channel's first element,
//   s1 = sum(x - K), s2 = sum((x - K)^2)   [and sy = sum(dy), sxy = sum(dy (x - K))]
//   mean = K + s1/M, var = s2/M - (s1/M)^2, sum(dy (x - mean)) = sxy - (mean - K) sy.
// Shifting by a sample keeps the terms of the order of the spread, so the variance does not
// cancel the way sum(x^2) - M mean^2 does when |mean| is much larger than the spread.
struct ChannelSums {
  double mean = 0, var = 0, sum_dy = 0, sum_dy_xc = 0;  // sum_dy_xc = sum(dy (x - mean))
};

// mean = K + s1/M, var = s2/M - (s1/M)^2, sum(dy (x - mean)) = sxy - (mean - K) sy, from the
// shifted sums s1 = sum(x - K), s2 = sum((x - K)^2), sy = sum(dy), sxy = sum(dy (x - K)).
ChannelSums finish_sums(double shift, double m, double s1, double s2, double sy, double sxy) {
  ChannelSums r;
  const double d1 = s1 / m;
  r.mean = shift + d1;
  r.var = std::max(0.0, s2 / m - d1 * d1);
  r.sum_dy = sy;
  r.sum_dy_xc = sxy - d1 * sy;
  return r;
}

// ReluGrad's rule z > 0 ? dy : +0 as a bit mask: GCC keeps the float select as a branch (no
// vectorization, and a branch on a Relu mask mispredicts half the time: the fused gradient ran
// 3x slower than BatchNormalizationGrad after ReluGrad). bf16 / f16 storage masks the bits.
template <typename T>
inline T relu_grad_select(T dy, T z) {
  if constexpr (sizeof(T) == 2) {
    T r;
    r.bits = static_cast<uint16_t>(dy.bits & (0u - static_cast<unsigned>(float(z) > 0.0f)));
    return r;
  } else {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    const U mask = U{0} - static_cast<U>(z > T{0});
    return std::bit_cast<T>(static_cast<U>(std::bit_cast<U>(dy) & mask));
  }
}

// Relu's rule v < 0 ? +0 : v (NaN and -0 pass), as a bit mask for the same reason.
template <typename T>
inline T relu_select(T v) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  const U keep = static_cast<U>(static_cast<U>(v < T{0}) - U{1});  // all ones unless v < 0
  return std::bit_cast<T>(static_cast<U>(std::bit_cast<U>(v) & keep));
}

// With kRelu, `relu_out` is a fused BatchNormalization+Relu's output Z, dy is the Relu's
// gradient, and the sums use relu_grad_select(dy, Z).
template <typename T, bool kWithDy, bool kRelu = false>
OT_SIMD_CLONES ChannelSums channel_sums(const T* x, const T* dy, int64_t n, int64_t channels,
                                        int64_t inner, int64_t c, const T* relu_out = nullptr) {
  ChannelSums r;
  const int64_t count = n * inner;
  if (count == 0) return r;
  const double shift = static_cast<double>(x[c * inner]);
  double a[8] = {}, b[8] = {}, g[8] = {}, h[8] = {};
  auto lane_add = [&](int k, const T* xp, const T* dyp, const T* zp, int64_t i) {
    const double v = static_cast<double>(xp[i]) - shift;
    a[k] += v;
    b[k] += v * v;
    if constexpr (kWithDy) {
      T dv = dyp[i];
      if constexpr (kRelu) dv = relu_grad_select(dv, zp[i]);
      const double d = static_cast<double>(dv);
      g[k] += d;
      h[k] += d * v;
    }
  };
  for (int64_t p = 0; p < n; ++p) {
    const T* xp = x + (p * channels + c) * inner;
    const T* dyp = kWithDy ? dy + (p * channels + c) * inner : nullptr;
    const T* zp = kRelu ? relu_out + (p * channels + c) * inner : nullptr;
    int64_t i = 0;
    if constexpr (sizeof(T) == 2) {
      // bf16 / f16 storage: 16 float lanes (twice double's per vector; the double lanes made
      // this pass compute-bound, no faster than float32) over blocks of 256 elements, each
      // block's sums added into the double lanes. The terms are differences of two 8- or
      // 11-bit-significand values, so a block's float sum is within ~1e-5 relative: far below
      // the inputs' own rounding.
      const float fshift = static_cast<float>(shift);
      for (; i + 16 <= inner;) {
        const int64_t end = i + std::min<int64_t>(256, (inner - i) / 16 * 16);
        float fa[16] = {}, fb[16] = {}, fg[16] = {}, fh[16] = {};
        for (; i < end; i += 16)
          for (int k = 0; k < 16; ++k) {
            const float v = static_cast<float>(xp[i + k]) - fshift;
            fa[k] += v;
            fb[k] += v * v;
            if constexpr (kWithDy) {
              T dv = dyp[i + k];
              if constexpr (kRelu) dv = relu_grad_select(dv, zp[i + k]);
              const float d = static_cast<float>(dv);
              fg[k] += d;
              fh[k] += d * v;
            }
          }
        for (int k = 0; k < 16; ++k) {
          a[k % 8] += fa[k];
          b[k % 8] += fb[k];
          g[k % 8] += fg[k];
          h[k % 8] += fh[k];
        }
      }
    }
    for (; i + 8 <= inner; i += 8)
      for (int k = 0; k < 8; ++k) lane_add(k, xp, dyp, zp, i + k);
    for (int k = 0; i < inner; ++i, ++k) lane_add(k, xp, dyp, zp, i);
  }
  return finish_sums(shift, static_cast<double>(count), merge_lanes(a), merge_lanes(b),
                     kWithDy ? merge_lanes(g) : 0.0, kWithDy ? merge_lanes(h) : 0.0);
}

// ---------------------------------------------------------------- small maps: rows

// Below 64 elements per (image, channel) plane (use_rows) -- ResNet-50's layer3-4 at 64x64
// inputs have 16 and 4, a per-activation BN has 1 -- the per-channel loops above run a few
// elements per plane between strided jumps (layer4 at 64x64: 3.5 ns per element in the gradient,
// 0.7 at 16x16 maps). The row path reads each image's (channels x inner) slab as a row instead,
// a channel range per task (row_channels) and kSegment elements at a time: each image's segment
// is read contiguously, the sums accumulate element-wise in L1-resident rows (the same shifted
// terms: double; bf16 / f16 in float over at most 256 images, then double) and each channel's
// entries are summed at the end; the affine and gradient passes read their per-channel
// constants from rows of the same layout.
// Where the rows win (ResNet-50 64x64 b16, 2 threads, `--profile`, same period): below 64
// elements per plane for float32 (layer4 BatchNormalizationGrad 2.2 -> 1.2 ms per step, layer3
// 4.1 -> 3.7) but not at 64 (layer2: 3.3 -> 4.0 ms, the forward 1.35 -> 1.9); bf16 / f16 gain
// at 64 in the gradient (5.4 -> 3.3 ms) and lose in the forward (1.5 -> 1.8).
bool use_rows(int64_t n, int64_t inner, size_t elem_bytes, bool gradient) {
  if (n <= 0 || inner <= 0) return false;
  return inner < 64 || (inner == 64 && elem_bytes == 2 && gradient);
}
constexpr int64_t kSegment = 256;

// a += x - k, b += (x - k)^2 [, g += d, h += d (x - k)], element-wise over len; d is dy (with
// kRelu masked by the fused output z). A: the accumulators' type.
template <typename T, typename A, bool kWithDy, bool kRelu>
OT_SIMD_CLONES void accumulate_row(const T* x, const T* dy, const T* z, const A* k, A* a, A* b,
                                   A* g, A* h, int64_t len) {
  using C = ew::compute_t<T>;
  for (int64_t j = 0; j < len; ++j) {
    const A v = static_cast<A>(static_cast<C>(x[j])) - k[j];
    a[j] += v;
    b[j] += v * v;
    if constexpr (kWithDy) {
      T dv = dy[j];
      if constexpr (kRelu) dv = relu_grad_select(dv, z[j]);
      const A d = static_cast<A>(static_cast<C>(dv));
      g[j] += d;
      h[j] += d * v;
    }
  }
}

// channel_sums for channels [c0, c1) at once (out[c - c0]), through the row path.
template <typename T, bool kWithDy, bool kRelu = false>
void channel_sums_rows(const T* x, const T* dy, const T* z, int64_t n, int64_t channels,
                       int64_t inner, int64_t c0, int64_t c1, ChannelSums* out) {
  using A = std::conditional_t<sizeof(T) == 2, float, double>;
  constexpr int64_t kBlock = sizeof(T) == 2 ? 256 : std::numeric_limits<int64_t>::max();
  constexpr int kSums = kWithDy ? 4 : 2;
  const int64_t len = (c1 - c0) * inner, stride = channels * inner, base = c0 * inner;
  std::vector<double> shift(static_cast<size_t>(c1 - c0));
  std::vector<A> k(static_cast<size_t>(len));
  std::vector<double> sums(static_cast<size_t>(kSums * len), 0.0);
  for (int64_t c = c0; c < c1; ++c) {
    shift[c - c0] = static_cast<double>(static_cast<ew::compute_t<T>>(x[c * inner]));
    std::fill_n(k.data() + (c - c0) * inner, inner, static_cast<A>(shift[c - c0]));
  }
  A acc[4][kSegment];
  for (int64_t j = 0; j < len; j += kSegment) {
    const int64_t seg = std::min(kSegment, len - j);
    for (int64_t p0 = 0; p0 < n; p0 += kBlock) {
      for (int q = 0; q < kSums; ++q) std::fill_n(acc[q], seg, A{0});
      for (int64_t p = p0; p < std::min(n, p0 + kBlock); ++p) {
        const int64_t o = p * stride + base + j;
        accumulate_row<T, A, kWithDy, kRelu>(x + o, kWithDy ? dy + o : nullptr,
                                             kRelu ? z + o : nullptr, k.data() + j, acc[0],
                                             acc[1], acc[2], acc[3], seg);
      }
      for (int q = 0; q < kSums; ++q)
        for (int64_t i = 0; i < seg; ++i) sums[q * len + j + i] += acc[q][i];
    }
  }
  const double m = static_cast<double>(n * inner);
  for (int64_t c = c0; c < c1; ++c) {
    double t[4] = {};
    for (int q = 0; q < kSums; ++q)
      t[q] = lane_sum(inner, [&](int64_t i) { return sums[q * len + (c - c0) * inner + i]; });
    out[c - c0] = finish_sums(shift[c - c0], m, t[0], t[1], t[2], t[3]);
  }
}

// Channels per row-path task: rows of about 4096 elements.
int64_t row_channels(int64_t inner) {
  return std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1));
}

// Runs f(image offset, j, seg) over a task's row of len elements for every image, kSegment
// elements at a time (the segment's constants stay in L1 while the images stream through).
template <typename F>
void for_each_segment(int64_t n, int64_t stride, int64_t base, int64_t len, F f) {
  for (int64_t j = 0; j < len; j += kSegment)
    for (int64_t p = 0; p < n; ++p) f(p * stride + base + j, j, std::min(kSegment, len - j));
}

// ---------------------------------------------------------------- blocked channel layout

// blocked = 1 (kBlockedAttr, passes::block_layout): x and y -- the gradient's dy, x, z and dx --
// hold ops/nn/blocked_layout.h's layout, each (image, channel block) a slab of `inner` rows of B
// channels. The loops run along a row's B channels, one lane per channel, so they vectorize
// without gathers and keep per-channel accumulators: the statistics are channel_sums' shifted
// double sums (bf16 / f16 through float partials, kLowRows), y and dx the plain loops' formulas;
// only the summation order differs from the plain layout's.

// The cases the blocked path covers (the ones the pass marks); anything else fails here rather
// than reading a blocked tensor as plain.
void check_blocked(const std::string& where, bool training, bool spatial, const TensorView& x) {
  std::string why;
  if (!training)
    why = "inference mode";
  else if (!spatial)
    why = "per-activation statistics (spatial = 0)";
  else if (x.rank() != 4)
    why = cat("X of rank ", x.rank());
  else if (!can_block_channels(x.dims[1]))
    why = cat("X with ", x.dims[1], " channels");
  OT_CHECK(why.empty(), where, ": ", kBlockedAttr,
           " = 1 covers training mode with spatial statistics on a rank-4 X whose channels divide "
           "by ",
           kBlockedChannelMultiple, "; got ", why);
}

// Calls f(std::integral_constant<int, B>) for the machine's channel_block(), 8 or 16: the lane
// loops below need B at compile time to become whole vectors.
template <typename F>
void with_channel_block(F&& f) {
  if (channel_block() == 8)
    f(std::integral_constant<int, 8>{});
  else
    f(std::integral_constant<int, 16>{});
}

// bf16 / f16 rows summed in float per lane before the double sums: at most 64 terms per float
// partial, between channel_sums' 16 and the row path's up to 256 (a float sum of 64 terms is
// within ~4e-6 of the magnitudes summed, far below the inputs' own rounding). Against 16, the
// fewer partials make the bf16 gradient 4-7% faster (ResNet-50 shapes, 1 thread).
constexpr int64_t kLowRows = 64;

// Adds channel l's shifted sums over `images` slabs of `rows` rows, `stride` elements apart, to
// sums[q * kB + l] (q: s1, s2 [, sy, sxy] of channel_sums); shift: the kB channels' K. The loops
// are shaped for GCC to vectorize them across the lanes with the sums in registers: double sums
// run over all the slabs, bf16 / f16's float partials over stretches of kLowRows rows, each
// stretch with partials of its own (partials kept across stretches, or a branch in the row loop,
// leave that loop scalar).
template <typename T, int kB, bool kWithDy, bool kRelu>
OT_SIMD_CLONES void blocked_sums(const T* x, const T* dy, const T* z, int64_t images,
                                 int64_t stride, int64_t rows, const double* shift,
                                 double* sums) {
  using C = ew::compute_t<T>;
  using A = std::conditional_t<sizeof(T) == 2, float, double>;
  A k[kB];
  for (int l = 0; l < kB; ++l) k[l] = static_cast<A>(shift[l]);
  // Rows [r0, r1) of image p into a, b [, g, h].
  auto add_rows = [&](int64_t p, int64_t r0, int64_t r1, A* a, A* b, A* g, A* h) {
    const T* xp = x + p * stride;
    const T* dyp = kWithDy ? dy + p * stride : nullptr;
    const T* zp = kRelu ? z + p * stride : nullptr;
    for (int64_t r = r0 * kB; r < r1 * kB; r += kB)
      for (int l = 0; l < kB; ++l) {
        const A v = static_cast<A>(static_cast<C>(xp[r + l])) - k[l];
        a[l] += v;
        b[l] += v * v;
        if constexpr (kWithDy) {
          T dv = dyp[r + l];
          if constexpr (kRelu) dv = relu_grad_select(dv, zp[r + l]);
          const A d = static_cast<A>(static_cast<C>(dv));
          g[l] += d;
          h[l] += d * v;
        }
      }
  };
  auto add_to_sums = [&](const A* a, const A* b, const A* g, const A* h) {
    for (int l = 0; l < kB; ++l) {
      sums[l] += a[l];
      sums[kB + l] += b[l];
      if constexpr (kWithDy) {
        sums[2 * kB + l] += g[l];
        sums[3 * kB + l] += h[l];
      }
    }
  };
  if constexpr (sizeof(T) == 2) {
    for (int64_t p = 0; p < images; ++p)
      for (int64_t r0 = 0; r0 < rows; r0 += kLowRows) {
        A a[kB] = {}, b[kB] = {}, g[kB] = {}, h[kB] = {};
        add_rows(p, r0, std::min(rows, r0 + kLowRows), a, b, g, h);
        add_to_sums(a, b, g, h);
      }
  } else {
    A a[kB] = {}, b[kB] = {}, g[kB] = {}, h[kB] = {};
    for (int64_t p = 0; p < images; ++p) add_rows(p, 0, rows, a, b, g, h);
    add_to_sums(a, b, g, h);
  }
}

// Images per statistics task of the blocked path: a channel block's images split into ranges
// when the blocks alone make fewer than 64 tasks, each range at least ~16K elements. The split
// depends on the shape only, so the summation order, and the result, not on the thread count.
int64_t blocked_images_per_task(int64_t n, int64_t blocks, int64_t slab) {
  const int64_t want = (64 + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, n * slab / 16384);
  const int64_t ranges = std::clamp<int64_t>(std::min(want, most), 1, n);
  return (n + ranges - 1) / ranges;
}

// channel_sums for every channel of a blocked x (dy, z): a task per channel block and image
// range, the ranges' sums added in order.
template <typename T, int kB, bool kWithDy, bool kRelu = false>
std::vector<ChannelSums> blocked_channel_sums(const T* x, const T* dy, const T* z, int64_t n,
                                              int64_t channels, int64_t inner,
                                              const KernelContext& ctx) {
  std::vector<ChannelSums> out(static_cast<size_t>(channels));
  if (n * inner == 0) return out;
  const int64_t blocks = channels / kB, slab = inner * kB, stride = blocks * slab;
  const int64_t per = blocked_images_per_task(n, blocks, slab), ranges = (n + per - 1) / per;
  std::vector<double> shift(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c)
    shift[c] = static_cast<double>(static_cast<ew::compute_t<T>>(x[c / kB * slab + c % kB]));
  std::vector<double> parts(static_cast<size_t>(blocks * ranges * 4 * kB), 0.0);
  ctx.parallel_for(blocks * ranges, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t cb = t / ranges, p0 = t % ranges * per, p1 = std::min(n, p0 + per);
      const int64_t o = p0 * stride + cb * slab;
      blocked_sums<T, kB, kWithDy, kRelu>(x + o, kWithDy ? dy + o : nullptr,
                                          kRelu ? z + o : nullptr, p1 - p0, stride, inner,
                                          shift.data() + cb * kB, parts.data() + t * 4 * kB);
    }
  });
  const double m = static_cast<double>(n * inner);
  for (int64_t c = 0; c < channels; ++c) {
    double t[4] = {};
    for (int64_t r = 0; r < ranges; ++r)
      for (int q = 0; q < 4; ++q) t[q] += parts[((c / kB * ranges + r) * 4 + q) * kB + c % kB];
    out[c] = finish_sums(shift[c], m, t[0], t[1], t[2], t[3]);
  }
  return out;
}

// Lanes a step of the blocked elementwise loops (affine_blocked, batch_norm_grad_blocked_slabs):
// a row, and for bf16 / f16 two -- one row of 16 is a 256-bit vector, which GCC computes in
// 256-bit float halves; two rows fill 512-bit float vectors (the plain loops' width). (The
// statistics loop is faster with one row a step.)
template <typename T, int kB>
inline constexpr int blocked_step = sizeof(T) == 2 ? 2 * kB : kB;

// Slabs (image, channel block) per elementwise task of the blocked path: ~16K elements, as the
// plain path's planes.
int64_t blocked_grain(int64_t slab) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(slab, 1));
}

double read(const TensorView& v, int64_t i) {
  return v.dtype == DataType::kDouble ? v.as<double>()[i] : v.as<float>()[i];
}

void write(TensorView& v, int64_t i, double value) {
  if (v.dtype == DataType::kDouble)
    v.as<double>()[i] = value;
  else
    v.as<float>()[i] = static_cast<float>(value);
}

// x: (N,C,D...), scale/B/mean/var: (C) -> y: (N,C,D...)
//   [training: running_mean, running_var: (C); before opset 14 also saved_mean, saved_var: (C)]
class BatchNormKernel final : public Kernel {
 public:
  explicit BatchNormKernel(const graph::Node& node)
      : where_(node.describe()),
        epsilon_(node.attr_float("epsilon", 1e-5f)),
        momentum_(node.attr_float("momentum", 0.9f)),
        fused_relu_(node.attr_int(kFusedReluAttr, 0) != 0),
        fused_add_(node.attr_int(kFusedAddAttr, 0) != 0),
        blocked_(node.attr_int(kBlockedAttr, 0) != 0) {}

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    OT_CHECK(x && x->rank() >= 2, where_, ": x must have rank >= 2");
    const TensorView* residual = fused_add_ ? ctx.input(kBatchNormResidualInput) : nullptr;
    if (fused_add_)
      OT_CHECK(residual && residual->dims == x->dims && residual->dtype == x->dtype, where_,
               ": fused_add needs the residual (input ", kBatchNormResidualInput,
               ") in x's shape and dtype");
    const graph::Node& node = ctx.node();
    bool stats_requested = false;
    for (int i = 1; i < ctx.num_outputs(); ++i) stats_requested |= ctx.has_output(i);
    const bool training = is_training(node, ctx.opset(), stats_requested);
    if (blocked_) check_blocked(where_, training, !per_activation(node, ctx.opset()), *x);
    const int64_t n = x->dims[0];
    int64_t channels = x->dims[1];
    int64_t inner = x->numel() / std::max<int64_t>(n * channels, 1);
    if (per_activation(node, ctx.opset())) {
      channels *= inner;
      inner = 1;
    }
    std::vector<double> scale(channels), bias(channels), mean(channels), var(channels);
    static const char* names[] = {"scale", "B", "input_mean", "input_var"};
    std::vector<double>* params[] = {&scale, &bias, &mean, &var};
    for (int i = 1; i <= 4; ++i) {
      const TensorView* p = ctx.input(i);
      OT_CHECK(p, where_, ": input ", names[i - 1], " is required");
      OT_CHECK(p->dtype == DataType::kFloat || p->dtype == DataType::kDouble, where_, ": ",
               names[i - 1], " dtype ", graph::dtype_short_name(p->dtype), " not supported");
      OT_CHECK(p->numel() == channels, where_, ": ", names[i - 1], " has ", p->numel(),
               " entries, expected ", channels);
      for (int64_t c = 0; c < channels; ++c) (*params[i - 1])[c] = read(*p, c);
    }
    TensorView& y = ctx.output(0, x->dims);
    dispatch_float_or_low(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      std::vector<double> batch_mean, batch_var;
      const T* r = residual ? residual->as<T>() : nullptr;
      if (training) {
        batch_stats<T>(x->as<T>(), n, channels, inner, batch_mean, batch_var, ctx);
        apply<T>(x->as<T>(), r, y.as<T>(), n, channels, inner, scale, bias, batch_mean, batch_var,
                 ctx);
        write_stats(ctx, mean, var, batch_mean, batch_var);
      } else {
        apply<T>(x->as<T>(), r, y.as<T>(), n, channels, inner, scale, bias, mean, var, ctx);
      }
    });
  }

 private:
  // Mean and biased variance over (N, D...) per channel: one shifted pass (channel_sums).
  template <typename T>
  void batch_stats(const T* x, int64_t n, int64_t channels, int64_t inner,
                   std::vector<double>& mean, std::vector<double>& var,
                   const KernelContext& ctx) const {
    mean.assign(channels, 0.0);
    var.assign(channels, 0.0);
    if (blocked_) {
      with_channel_block([&](auto block) {
        const std::vector<ChannelSums> sums =
            blocked_channel_sums<T, decltype(block)::value, false>(x, nullptr, nullptr, n, channels,
                                                                   inner, ctx);
        for (int64_t c = 0; c < channels; ++c) {
          mean[c] = sums[c].mean;
          var[c] = sums[c].var;
        }
      });
      return;
    }
    if (use_rows(n, inner, sizeof(T), false)) {
      ctx.parallel_for(channels, row_channels(inner), [&](int64_t begin, int64_t end) {
        std::vector<ChannelSums> sums(static_cast<size_t>(end - begin));
        channel_sums_rows<T, false>(x, nullptr, nullptr, n, channels, inner, begin, end,
                                    sums.data());
        for (int64_t c = begin; c < end; ++c) {
          mean[c] = sums[c - begin].mean;
          var[c] = sums[c - begin].var;
        }
      });
      return;
    }
    ctx.parallel_for(channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const ChannelSums sums = channel_sums<T, false>(x, nullptr, n, channels, inner, c);
        mean[c] = sums.mean;
        var[c] = sums.var;
      }
    });
  }

  // Calls f(relu, add) with the node's marks as std::bool_constant values.
  template <typename F>
  void with_marks(bool add, F&& f) const {
    auto relu = [&](auto add_c) {
      if (fused_relu_)
        f(std::true_type{}, add_c);
      else
        f(std::false_type{}, add_c);
    };
    if (add)
      relu(std::true_type{});
    else
      relu(std::false_type{});
  }

  // bf16 / f16 x and y (mixed precision's activations) are computed in float. r: the fused
  // residual (kFusedAddAttr) or nullptr.
  template <typename T>
  void apply(const T* x, const T* r, T* y, int64_t n, int64_t channels, int64_t inner,
             const std::vector<double>& scale, const std::vector<double>& bias,
             const std::vector<double>& mean, const std::vector<double>& var,
             const KernelContext& ctx) const {
    using C = ew::compute_t<T>;
    std::vector<C> a(channels), b(channels);
    for (int64_t c = 0; c < channels; ++c) {
      const double inv = 1.0 / std::sqrt(var[c] + static_cast<double>(epsilon_));
      a[c] = static_cast<C>(scale[c] * inv);
      b[c] = static_cast<C>(bias[c] - mean[c] * scale[c] * inv);
    }
    if (blocked_) {
      // Each task a range of (image, channel block) slabs.
      with_channel_block([&](auto block) {
        constexpr int kB = decltype(block)::value;
        const int64_t blocks = channels / kB;
        ctx.parallel_for(n * blocks, blocked_grain(inner * kB), [&](int64_t begin, int64_t end) {
          with_marks(r != nullptr, [&](auto relu, auto add) {
            affine_blocked<T, kB, decltype(relu)::value, decltype(add)::value>(
                x, r, y, begin, end, blocks, inner, a.data(), b.data());
          });
        });
      });
      return;
    }
    if (use_rows(n, inner, sizeof(T), false)) {
      // Row path: each task a channel range of every image, its constants in rows.
      ctx.parallel_for(channels, row_channels(inner), [&](int64_t c0, int64_t c1) {
        const int64_t len = (c1 - c0) * inner;
        std::vector<C> ar(static_cast<size_t>(len)), br(static_cast<size_t>(len));
        for (int64_t c = c0; c < c1; ++c) {
          std::fill_n(ar.data() + (c - c0) * inner, inner, a[c]);
          std::fill_n(br.data() + (c - c0) * inner, inner, b[c]);
        }
        for_each_segment(
            n, channels * inner, c0 * inner, len, [&](int64_t off, int64_t j, int64_t seg) {
              with_marks(r != nullptr, [&](auto relu, auto add) {
                affine_row<T, decltype(relu)::value, decltype(add)::value>(
                    x + off, r ? r + off : nullptr, y + off, seg, ar.data() + j, br.data() + j);
              });
            });
      });
      return;
    }
    const int64_t planes = n * channels;
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1));
    ctx.parallel_for(planes, grain, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const C ac = a[p % channels], bc = b[p % channels];
        with_marks(r != nullptr, [&](auto relu, auto add) {
          affine_plane<T, decltype(relu)::value, decltype(add)::value>(
              x + p * inner, r ? r + p * inner : nullptr, y + p * inner, inner, ac, bc);
        });
      }
    });
  }

  // One output element: x a + b [rounded to T, plus the residual r] [then max(0, .)]. The
  // rounding is the unfused BatchNormalization's output; the sum is Add's, in C, so the fused
  // node writes the bits of BatchNormalization -> Add -> Relu.
  template <typename T, bool kRelu, bool kAdd, typename C>
  static T affine_one(T x, T r, C a, C b) {
    C v = static_cast<C>(x) * a + b;
    if constexpr (kAdd) v = static_cast<C>(static_cast<T>(v)) + static_cast<C>(r);
    if constexpr (kRelu) v = relu_select(v);
    return static_cast<T>(v);
  }
  // r[i], read only with kAdd (r is null otherwise).
  template <bool kAdd, typename T>
  static T residual_at(const T* r, int64_t i) {
    if constexpr (kAdd)
      return r[i];
    else
      return T{};
  }

  // y = x a + b [+ r] over one plane [then max(0, y)], in the CPU's widest vectors.
  template <typename T, bool kRelu, bool kAdd, typename C>
  OT_SIMD_CLONES static void affine_plane(const T* x, const T* r, T* y, int64_t count, C a, C b) {
    for (int64_t i = 0; i < count; ++i)
      y[i] = affine_one<T, kRelu, kAdd>(x[i], residual_at<kAdd>(r, i), a, b);
  }

  // affine_plane with per-element a and b (the row path).
  template <typename T, bool kRelu, bool kAdd, typename C>
  OT_SIMD_CLONES static void affine_row(const T* x, const T* r, T* y, int64_t count, const C* a,
                                        const C* b) {
    for (int64_t i = 0; i < count; ++i)
      y[i] = affine_one<T, kRelu, kAdd>(x[i], residual_at<kAdd>(r, i), a[i], b[i]);
  }

  // affine_plane over the blocked slabs [s0, s1) (image s / blocks, channel block s % blocks) of
  // `rows` rows each, a lane's a and b its channel's, blocked_step<T, kB> lanes a step.
  template <typename T, int kB, bool kRelu, bool kAdd, typename C>
  OT_SIMD_CLONES static void affine_blocked(const T* x, const T* r, T* __restrict y, int64_t s0,
                                            int64_t s1, int64_t blocks, int64_t rows, const C* a,
                                            const C* b) {
    constexpr int kL = blocked_step<T, kB>;
    auto lane = [&](int64_t i, C ai, C bi) {
      y[i] = affine_one<T, kRelu, kAdd>(x[i], residual_at<kAdd>(r, i), ai, bi);
    };
    for (int64_t s = s0; s < s1; ++s) {
      C ak[kL], bk[kL];
      for (int h = 0; h < kL; h += kB)
        for (int l = 0; l < kB; ++l) {
          ak[h + l] = a[s % blocks * kB + l];
          bk[h + l] = b[s % blocks * kB + l];
        }
      const int64_t end = (s + 1) * rows * kB;
      int64_t i = s * rows * kB;
      for (; i + kL <= end; i += kL)
        for (int l = 0; l < kL; ++l) lane(i + l, ak[l], bk[l]);
      for (; i < end; i += kB)
        for (int l = 0; l < kB; ++l) lane(i + l, ak[l], bk[l]);
    }
  }

  void write_stats(KernelContext& ctx, const std::vector<double>& running_mean,
                   const std::vector<double>& running_var, const std::vector<double>& batch_mean,
                   const std::vector<double>& batch_var) const {
    const int64_t channels = static_cast<int64_t>(batch_mean.size());
    const double m = momentum_;
    std::vector<int64_t> dims = ctx.input(3)->dims;
    auto emit = [&](int i, auto value_of) {
      if (!ctx.has_output(i)) return;
      TensorView& out = ctx.output(i, dims);
      OT_CHECK(out.dtype == DataType::kFloat || out.dtype == DataType::kDouble, where_, ": output ",
               i, " dtype ", graph::dtype_short_name(out.dtype), " not supported");
      for (int64_t c = 0; c < channels; ++c) write(out, c, value_of(c));
    };
    emit(1, [&](int64_t c) { return running_mean[c] * m + batch_mean[c] * (1 - m); });
    emit(2, [&](int64_t c) { return running_var[c] * m + batch_var[c] * (1 - m); });
    if (ctx.opset() < 14) {
      emit(3, [&](int64_t c) { return batch_mean[c]; });
      emit(4, [&](int64_t c) { return batch_var[c]; });
    }
  }

  std::string where_;
  float epsilon_, momentum_;
  bool fused_relu_;  // passes::fuse_batchnorm_relu: writes max(0, y)
  bool fused_add_;   // kFusedAddAttr: adds the residual input before the Relu
  bool blocked_;     // kBlockedAttr: x, the residual and y in the blocked channel layout
};

// ---------------------------------------------------------------- BatchNormalizationGrad

// One plane of dx, in the CPU's widest vectors: training dx = k dy - a sum_dy - xhat a
// sum_dy_xhat (t0 = a sum_dy, t1 = a sum_dy_xhat, xhat = (x - mean) inv), inference dx = k dy;
// with kRelu, dy is masked by the fused output z first. C is T's compute type (float for
// bf16 / f16 storage).
template <typename T, bool kTraining, bool kRelu, typename C>
OT_SIMD_CLONES void batch_norm_grad_plane(const T* x, const T* dy, const T* z, T* dx, int64_t count,
                                          C tk, C t0, C tm, C ti, C t1) {
  for (int64_t i = 0; i < count; ++i) {
    T dt = dy[i];
    if constexpr (kRelu) dt = relu_grad_select(dt, z[i]);
    const C d = static_cast<C>(dt);
    if constexpr (kTraining)
      dx[i] = static_cast<T>(tk * d - t0 - (static_cast<C>(x[i]) - tm) * ti * t1);
    else
      dx[i] = static_cast<T>(tk * d);
  }
}

// batch_norm_grad_plane's training dx with per-element constants (the row path).
template <typename T, bool kRelu, typename C>
OT_SIMD_CLONES void batch_norm_grad_row(const T* x, const T* dy, const T* z, T* dx, int64_t count,
                                        const C* tk, const C* t0, const C* tm, const C* ti,
                                        const C* t1) {
  for (int64_t i = 0; i < count; ++i) {
    T dt = dy[i];
    if constexpr (kRelu) dt = relu_grad_select(dt, z[i]);
    const C d = static_cast<C>(dt);
    dx[i] = static_cast<T>(tk[i] * d - t0[i] - (static_cast<C>(x[i]) - tm[i]) * ti[i] * t1[i]);
  }
}

// One channel's dx = k dy - t0 - (x - mean) inv t1 (t0 = t1 = 0 in inference mode).
struct GradConstants {
  double k, t0, mean, inv, t1;
};

// A channel's dB and dScale, and its dx constants, from its sums over M = count elements:
// inv = 1/sqrt(var + eps), dScale = sum_dy_xc inv, k = scale inv, and in training (mean and var
// the batch's) t0 = k/M sum_dy, t1 = k/M dScale. Every path of batch_norm_grad(_blocked) uses it.
GradConstants grad_constants(const ChannelSums& cs, double scale, double epsilon, double count,
                             bool training, double& dbias, double& dscale) {
  const double inv = 1.0 / std::sqrt(cs.var + epsilon);
  dbias = cs.sum_dy;
  dscale = cs.sum_dy_xc * inv;
  const double k = scale * inv, a = training ? k / count : 0.0;
  return {k, a * cs.sum_dy, cs.mean, inv, a * dscale};
}

// Per channel c over M = N*D... elements, inv = 1/sqrt(var + eps), xhat = (x - mean) * inv:
//   dB = sum(dy), dScale = sum(dy * xhat)
//   training (mean/var are the batch statistics of x, recomputed here):
//     dx = scale * inv / M * (M * dy - dB - xhat * dScale)
//   inference (mean/var are the running statistics, constants): dx = scale * inv * dy
template <typename T>
void batch_norm_grad(const T* dy, const T* x, int64_t n, int64_t channels, int64_t inner,
                     bool training, double epsilon, const std::vector<double>& scale,
                     const std::vector<double>& mean_in, const std::vector<double>& var_in, T* dx,
                     std::vector<double>& dscale, std::vector<double>& dbias,
                     const KernelContext& ctx, const T* relu_out) {
  dscale.assign(channels, 0.0);
  dbias.assign(channels, 0.0);
  const double count = static_cast<double>(n * inner);
  if (training && use_rows(n, inner, sizeof(T), true)) {
    // Row path: the sums and dx of a channel range of every image, dx's constants in rows.
    using C = ew::compute_t<T>;
    ctx.parallel_for(channels, row_channels(inner), [&](int64_t begin, int64_t end) {
      std::vector<ChannelSums> sums(static_cast<size_t>(end - begin));
      if (relu_out)
        channel_sums_rows<T, true, true>(x, dy, relu_out, n, channels, inner, begin, end,
                                         sums.data());
      else
        channel_sums_rows<T, true>(x, dy, nullptr, n, channels, inner, begin, end, sums.data());
      const int64_t len = (end - begin) * inner;
      std::vector<C> rows(static_cast<size_t>(5 * len));
      C *rk = rows.data(), *r0 = rk + len, *rm = r0 + len, *ri = rm + len, *r1 = ri + len;
      for (int64_t c = begin; c < end; ++c) {
        const GradConstants g =
            grad_constants(sums[c - begin], scale[c], epsilon, count, true, dbias[c], dscale[c]);
        const int64_t o = (c - begin) * inner;
        std::fill_n(rk + o, inner, static_cast<C>(g.k));
        std::fill_n(r0 + o, inner, static_cast<C>(g.t0));
        std::fill_n(rm + o, inner, static_cast<C>(g.mean));
        std::fill_n(ri + o, inner, static_cast<C>(g.inv));
        std::fill_n(r1 + o, inner, static_cast<C>(g.t1));
      }
      if (!dx) return;
      for_each_segment(
          n, channels * inner, begin * inner, len, [&](int64_t off, int64_t j, int64_t seg) {
            if (relu_out)
              batch_norm_grad_row<T, true>(x + off, dy + off, relu_out + off, dx + off, seg, rk + j,
                                           r0 + j, rm + j, ri + j, r1 + j);
            else
              batch_norm_grad_row<T, false>(x + off, dy + off, nullptr, dx + off, seg, rk + j,
                                            r0 + j, rm + j, ri + j, r1 + j);
          });
    });
    return;
  }
  ctx.parallel_for(channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      ChannelSums sums;
      if (training) {
        sums = relu_out ? channel_sums<T, true, true>(x, dy, n, channels, inner, c, relu_out)
                        : channel_sums<T, true>(x, dy, n, channels, inner, c);
      } else {
        sums.mean = mean_in[c];
        sums.var = var_in[c];
        const double mean = sums.mean;
        for (int64_t b = 0; b < n; ++b) {
          const T* xp = x + (b * channels + c) * inner;
          const T* dyp = dy + (b * channels + c) * inner;
          const T* zp = relu_out ? relu_out + (b * channels + c) * inner : nullptr;
          auto d = [dyp, zp](int64_t i) {
            return static_cast<double>(zp ? relu_grad_select(dyp[i], zp[i]) : dyp[i]);
          };
          sums.sum_dy += lane_sum(inner, d);
          sums.sum_dy_xc += lane_sum(inner, [xp, d, mean](int64_t i) {
            return d(i) * (static_cast<double>(xp[i]) - mean);
          });
        }
      }
      const GradConstants g =
          grad_constants(sums, scale[c], epsilon, count, training, dbias[c], dscale[c]);
      if (!dx) continue;
      using C = ew::compute_t<T>;
      const C tk = static_cast<C>(g.k), tm = static_cast<C>(g.mean), ti = static_cast<C>(g.inv);
      const C t0 = static_cast<C>(g.t0), t1 = static_cast<C>(g.t1);
      for (int64_t b = 0; b < n; ++b) {
        const T* xp = x + (b * channels + c) * inner;
        const T* dyp = dy + (b * channels + c) * inner;
        const T* zp = relu_out ? relu_out + (b * channels + c) * inner : nullptr;
        T* dxp = dx + (b * channels + c) * inner;
        // In T (vectorizes): dx = k dy - a sum_dy - xhat a sum_dy_xhat, a = k / M (training).
        if (training && zp)
          batch_norm_grad_plane<T, true, true>(xp, dyp, zp, dxp, inner, tk, t0, tm, ti, t1);
        else if (training)
          batch_norm_grad_plane<T, true, false>(xp, dyp, zp, dxp, inner, tk, t0, tm, ti, t1);
        else if (zp)
          batch_norm_grad_plane<T, false, true>(xp, dyp, zp, dxp, inner, tk, t0, tm, ti, t1);
        else
          batch_norm_grad_plane<T, false, false>(xp, dyp, zp, dxp, inner, tk, t0, tm, ti, t1);
      }
    }
  });
}

// batch_norm_grad_plane's training dx over the blocked slabs [s0, s1) of `rows` rows each, as
// affine_blocked; consts: the rows tk, t0, tm, ti, t1 of blocks * kB channels each.
template <typename T, int kB, bool kRelu, typename C>
OT_SIMD_CLONES void batch_norm_grad_blocked_slabs(const T* x, const T* dy, const T* z,
                                                  T* __restrict dx, int64_t s0, int64_t s1,
                                                  int64_t blocks, int64_t rows, const C* consts) {
  constexpr int kL = blocked_step<T, kB>;
  const int64_t channels = blocks * kB;
  C tk[kL], t0[kL], tm[kL], ti[kL], t1[kL];
  auto lane = [&](int64_t i, int l) {
    T dt = dy[i];
    if constexpr (kRelu) dt = relu_grad_select(dt, z[i]);
    const C d = static_cast<C>(dt);
    dx[i] = static_cast<T>(tk[l] * d - t0[l] - (static_cast<C>(x[i]) - tm[l]) * ti[l] * t1[l]);
  };
  for (int64_t s = s0; s < s1; ++s) {
    const C* t = consts + s % blocks * kB;
    for (int h = 0; h < kL; h += kB)
      for (int l = 0; l < kB; ++l) {
        tk[h + l] = t[l];
        t0[h + l] = t[channels + l];
        tm[h + l] = t[2 * channels + l];
        ti[h + l] = t[3 * channels + l];
        t1[h + l] = t[4 * channels + l];
      }
    const int64_t end = (s + 1) * rows * kB;
    int64_t i = s * rows * kB;
    for (; i + kL <= end; i += kL)
      for (int l = 0; l < kL; ++l) lane(i + l, l);
    for (; i < end; i += kB)
      for (int l = 0; l < kB; ++l) lane(i + l, l);
  }
}

// batch_norm_grad in training mode on blocked dy, x, relu_out and dx (kBlockedAttr): the sums
// per channel block and image range, then dx per (image, channel block) slab.
template <typename T, int kB>
void batch_norm_grad_blocked(const T* dy, const T* x, int64_t n, int64_t channels, int64_t inner,
                             double epsilon, const std::vector<double>& scale, T* dx,
                             std::vector<double>& dscale, std::vector<double>& dbias,
                             const KernelContext& ctx, const T* relu_out) {
  const std::vector<ChannelSums> sums =
      relu_out ? blocked_channel_sums<T, kB, true, true>(x, dy, relu_out, n, channels, inner, ctx)
               : blocked_channel_sums<T, kB, true>(x, dy, nullptr, n, channels, inner, ctx);
  using C = ew::compute_t<T>;
  std::vector<C> consts(static_cast<size_t>(5 * channels));
  C *tk = consts.data(), *t0 = tk + channels, *tm = t0 + channels, *ti = tm + channels,
    *t1 = ti + channels;
  const double count = static_cast<double>(n * inner);
  dscale.assign(channels, 0.0);
  dbias.assign(channels, 0.0);
  for (int64_t c = 0; c < channels; ++c) {
    const GradConstants g =
        grad_constants(sums[c], scale[c], epsilon, count, true, dbias[c], dscale[c]);
    tk[c] = static_cast<C>(g.k);
    t0[c] = static_cast<C>(g.t0);
    tm[c] = static_cast<C>(g.mean);
    ti[c] = static_cast<C>(g.inv);
    t1[c] = static_cast<C>(g.t1);
  }
  if (!dx) return;
  const int64_t blocks = channels / kB;
  ctx.parallel_for(n * blocks, blocked_grain(inner * kB), [&](int64_t begin, int64_t end) {
    if (relu_out)
      batch_norm_grad_blocked_slabs<T, kB, true>(x, dy, relu_out, dx, begin, end, blocks, inner,
                                                 consts.data());
    else
      batch_norm_grad_blocked_slabs<T, kB, false>(x, dy, nullptr, dx, begin, end, blocks, inner,
                                                  consts.data());
  });
}

void infer_batch_norm_grad(InferenceContext& ctx) {
  check_float_input(ctx, 0);
  check_float_input(ctx, 1);
  check_float_input(ctx, 2);
  const size_t outs = ctx.output_types.size();
  if (outs > 0) propagate_type(ctx, 0, 1);
  if (outs > 1) propagate_type(ctx, 1, 2);
  if (outs > 2) propagate_type(ctx, 2, 2);
}

// dy: (N,C,D...), x: (N,C,D...), scale: (C) [, mean, var: (C) in inference mode]
//   -> dx: (N,C,D...), dscale: (C), dB: (C). Attributes: epsilon, training_mode, spatial (0:
//   opset < 9 per-activation statistics over (C, D...)).
class BatchNormGradKernel final : public Kernel {
 public:
  explicit BatchNormGradKernel(const graph::Node& node)
      : where_(node.describe()),
        epsilon_(node.attr_float("epsilon", 1e-5f)),
        training_(node.attr_int("training_mode", 1) != 0),
        spatial_(node.attr_int("spatial", 1) != 0),
        fused_relu_(node.attr_int(kFusedReluAttr, 0) != 0),
        blocked_(node.attr_int(kBlockedAttr, 0) != 0) {}

  void run(KernelContext& ctx) override {
    const TensorView* dy = ctx.input(0);
    const TensorView* x = ctx.input(1);
    OT_CHECK(dy && x && x->rank() >= 2, where_, ": inputs dY and X (rank >= 2) are required");
    OT_CHECK(dy->dims == x->dims && dy->dtype == x->dtype, where_, ": dY (", join_dims(dy->dims),
             ") must match X (", join_dims(x->dims), ") in shape and dtype");
    const TensorView* z = fused_relu_ ? ctx.input(kBatchNormGradReluOutput) : nullptr;
    OT_CHECK(!fused_relu_ || (z && z->dims == x->dims && z->dtype == x->dtype), where_,
             ": fused_relu needs the fused output Z (input ", kBatchNormGradReluOutput,
             ") shaped and typed like X");
    if (blocked_) check_blocked(where_, training_, spatial_, *x);
    const int64_t n = x->dims[0];
    int64_t channels = x->dims[1];
    int64_t inner = x->numel() / std::max<int64_t>(n * channels, 1);
    if (!spatial_) {
      channels *= inner;
      inner = 1;
    }
    auto param = [&](int i, const char* name) {
      const TensorView* p = ctx.input(i);
      OT_CHECK(p, where_, ": input ", name, " is required",
               i > 2 ? " in inference mode (training_mode=0)" : "");
      OT_CHECK(p->dtype == DataType::kFloat || p->dtype == DataType::kDouble, where_, ": ", name,
               " dtype ", graph::dtype_short_name(p->dtype), " not supported");
      OT_CHECK(p->numel() == channels, where_, ": ", name, " has ", p->numel(),
               " entries, expected ", channels);
      std::vector<double> v(channels);
      for (int64_t c = 0; c < channels; ++c) v[c] = read(*p, c);
      return v;
    };
    const std::vector<double> scale = param(2, "scale");
    std::vector<double> mean, var;
    if (!training_) {
      mean = param(3, "mean");
      var = param(4, "var");
    }
    TensorView* dx = ctx.has_output(0) ? &ctx.output(0, x->dims) : nullptr;
    std::vector<double> dscale, dbias;
    dispatch_float_or_low(x->dtype, where_, [&](auto tag) {
      using T = decltype(tag);
      if (blocked_) {
        with_channel_block([&](auto block) {
          batch_norm_grad_blocked<T, decltype(block)::value>(
              dy->as<T>(), x->as<T>(), n, channels, inner, epsilon_, scale,
              dx ? dx->as<T>() : nullptr, dscale, dbias, ctx, z ? z->as<T>() : nullptr);
        });
        return;
      }
      batch_norm_grad<T>(dy->as<T>(), x->as<T>(), n, channels, inner, training_, epsilon_, scale,
                         mean, var, dx ? dx->as<T>() : nullptr, dscale, dbias, ctx,
                         z ? z->as<T>() : nullptr);
    });
    const std::vector<double>* sums[] = {&dscale, &dbias};
    for (int i = 1; i <= 2; ++i) {
      if (ctx.num_outputs() <= i || !ctx.has_output(i)) continue;
      TensorView& out = ctx.output(i, ctx.input(2)->dims);
      OT_CHECK(out.dtype == DataType::kFloat || out.dtype == DataType::kDouble, where_, ": output ",
               i, " dtype ", graph::dtype_short_name(out.dtype), " not supported");
      for (int64_t c = 0; c < channels; ++c) write(out, c, (*sums[i - 1])[c]);
    }
  }

 private:
  std::string where_;
  double epsilon_;
  bool training_, spatial_, fused_relu_;
  bool blocked_;  // kBlockedAttr: dy, x, z and dx in the blocked channel layout
};

// dX, dScale, dB through one BatchNormalizationGrad node; the mode is resolved here (it depends
// on the opset and on which forward outputs exist) and passed as training_mode. The running
// statistics inputs get no gradient, and neither do the statistics outputs. Outputs are the
// prefix of (dX, dScale, dB) up to the last one needed.
void batch_norm_gradient(GradientBuilder& b) {
  graph::Value* dy = b.output_grad(0);
  if (!dy) return;
  const graph::Node& n = b.node();
  bool stat_outputs = false;
  for (int i = 1; i < b.num_outputs(); ++i) stat_outputs |= b.output(i) != nullptr;
  const bool training = is_training(n, b.opset(), stat_outputs);
  const bool want[3] = {b.needs_input_grad(0), b.needs_input_grad(1), b.needs_input_grad(2)};
  int outputs = 0;
  for (int i = 0; i < 3; ++i)
    if (want[i]) outputs = i + 1;
  if (outputs == 0) return;
  std::vector<graph::Value*> inputs{dy, b.input(0), b.input(1)};
  if (!training) {
    inputs.push_back(b.input(3));
    inputs.push_back(b.input(4));
  }
  std::vector<graph::Attribute> attrs{
      graph::Attribute::make_float("epsilon", n.attr_float("epsilon", 1e-5f)),
      graph::Attribute::make_int("training_mode", training ? 1 : 0),
      graph::Attribute::make_int("spatial", per_activation(n, b.opset()) ? 0 : 1)};
  std::vector<graph::Value*> g =
      b.emit("BatchNormalizationGrad", inputs, outputs, std::move(attrs), kOnnxtrainDomain);
  for (int i = 0; i < outputs; ++i)
    if (want[i]) b.set_input_grad(i, g[i]);
}

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_batch_norm) {
  OpSchema s;
  s.op_type = "BatchNormalization";
  s.infer = infer_batch_norm;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<BatchNormKernel>(n); };
  s.gradient = batch_norm_gradient;
  return s;
}

ONNXTRAIN_REGISTER_OP(nn_batch_norm_grad) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "BatchNormalizationGrad";
  s.foldable = false;
  s.infer = infer_batch_norm_grad;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<BatchNormGradKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::nn
