// The reduction engine behind every Reduce* op, ArgMax/ArgMin, Softmax and LayerNormalization:
// a tensor is viewed as lanes [outer, n, inner] and each lane is folded by a policy; reduced axes
// that are not one block are folded one block per stage (no transpose). Lane splits depend on
// shapes only, never on the thread count, so results are bit-identical for any intra-op budget.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/op_api.h"

namespace onnxtrain::ops::reduce {

// x viewed as [outer, n, inner]: lane (o, i) holds x[(o * n + r) * inner + i] for r in [0, n).
struct Lanes {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
  int64_t numel() const { return outer * n * inner; }
};

// Lanes of `dims` around one axis: [prod(dims[:axis]), dims[axis], prod(dims[axis+1:])].
Lanes lanes_around(std::span<const int64_t> dims, int64_t axis);
// Lanes of `dims` split in two at `axis`: [prod(dims[:axis]), prod(dims[axis:]), 1] (the 2-D
// coercion of Softmax before opset 13, LayerNormalization, Flatten-like views).
Lanes lanes_split(std::span<const int64_t> dims, int64_t axis);

// How to reduce `dims` over a set of axes: one stage per block of adjacent reduced dims, the
// largest first; stage k folds lanes of the previous stage's result (of the input for k = 0).
struct ReducePlan {
  std::vector<int64_t> out_dims;  // keepdims applied
  std::vector<Lanes> stages;      // never empty
  int64_t reduced_count = 1;      // elements folded into each output
};

// Axes are normalized into [0, rank) here (duplicates and out-of-range throw naming `where`);
// an empty `axes` reduces over nothing (every lane has n = 1).
ReducePlan plan_reduce(std::span<const int64_t> dims, std::span<const int64_t> axes, bool keepdims,
                       const std::string& where);

// Runs fn(o, i0, m) for every block of m <= `block` adjacent lanes (o, i0 .. i0+m-1), spread
// over the intra-op threads. `work_per_lane` (elements touched per lane) sizes the grain.
inline constexpr int64_t kBlock = 128;
template <typename Fn>
void for_each_lane_block(const Lanes& l, int64_t block, int64_t work_per_lane,
                         const KernelContext& ctx, Fn&& fn) {
  const int64_t blocks_per_row = (l.inner + block - 1) / block;
  const int64_t tasks = l.outer * blocks_per_row;
  if (tasks == 0) return;
  const int64_t work = std::max<int64_t>(1, work_per_lane * std::min(l.inner, block));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / work);
  ctx.parallel_for(tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / blocks_per_row;
      const int64_t i0 = (t % blocks_per_row) * block;
      fn(o, i0, std::min(block, l.inner - i0));
    }
  });
}

// ---- policies: how one lane folds.
// A policy has `Acc init() const`, `void step(Acc&, T x, int64_t r) const` (r: position in the
// lane), `void merge(Acc& a, const Acc& b) const` (combine two partial folds of one lane, in
// either order) and `Out finish(const Acc&, int64_t n) const` (n: elements folded).

// Neumaier-compensated double sum: float64 sums stay accurate over long lanes.
struct CompensatedSum {
  double s = 0;
  double c = 0;
  void add(double x) {
    const double t = s + x;
    c += std::abs(s) >= std::abs(x) ? (s - t) + x : (x - t) + s;
    s = t;
  }
  double value() const { return s + c; }
};

// Integer sums and products wrap around like two's complement instead of being UB.
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// Accumulator for sums: double for float32 (29 spare bits keep long sums exact to float32
// precision), Neumaier-compensated double for float64, wrapping int64 for integers.
template <typename T>
struct SumAcc {
  static constexpr bool kCompensated = std::is_same_v<T, double>;
  using type = std::conditional_t<kCompensated, CompensatedSum,
                                  std::conditional_t<std::is_floating_point_v<T>, double, int64_t>>;
  // What a per-element map returns: double for floating types, int64 (exact) for integers.
  using wide = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  static void add(type& a, wide x) {
    if constexpr (kCompensated)
      a.add(x);
    else if constexpr (std::is_floating_point_v<T>)
      a += x;
    else
      a = wrap_add(a, x);
  }
  static void merge(type& a, const type& b) {
    if constexpr (kCompensated) {
      a.add(b.s);
      a.add(b.c);
    } else {
      add(a, b);
    }
  }
  static double value(const type& a) {
    if constexpr (kCompensated)
      return a.value();
    else
      return static_cast<double>(a);
  }
};

template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(v);
  else
    return false;
}

template <typename T>
T cast_result(double v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    // Integer reductions round toward zero; out-of-range results saturate instead of being UB.
    if (!(v == v)) return T{0};
    const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
    const double hi = static_cast<double>(std::numeric_limits<T>::max());
    if (v >= hi) return std::numeric_limits<T>::max();  // hi itself may not convert back
    if (v <= lo) return std::numeric_limits<T>::lowest();
    return static_cast<T>(v);
  }
}

// Sum of map(x) over the lane, then post(sum, n): ReduceSum, Mean, SumSquare, L1, L2, LogSum.
// Post::kIdentity marks a plain sum, which integer types return exactly.
template <typename T, typename Map, typename Post>
struct SumPolicy {
  using Acc = typename SumAcc<T>::type;
  using Out = T;
  Map map;
  Post post;
  Acc init() const { return Acc{}; }
  void step(Acc& a, T x, int64_t) const { SumAcc<T>::add(a, map(x)); }
  void merge(Acc& a, const Acc& b) const { SumAcc<T>::merge(a, b); }
  Out finish(const Acc& a, int64_t n) const {
    if constexpr (std::is_integral_v<T> && Post::kIdentity) return static_cast<T>(a);  // exact
    return cast_result<T>(post(SumAcc<T>::value(a), n));
  }
};

template <typename T>
struct ProdPolicy {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  using Out = T;
  static Acc mul(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<T>)
      return a * b;
    else
      return wrap_mul(a, b);
  }
  Acc init() const { return Acc{1}; }
  void step(Acc& a, T x, int64_t) const { a = mul(a, static_cast<Acc>(x)); }
  void merge(Acc& a, const Acc& b) const { a = mul(a, b); }
  Out finish(const Acc& a, int64_t) const { return static_cast<T>(a); }
};

// Max (kMax) or min; NaN propagates as in numpy.
template <typename T, bool kMax>
struct ExtremumPolicy {
  using Acc = T;
  using Out = T;
  // A NaN replaces anything and is never replaced (nothing compares above NaN); branch-free, so the
  // lane loops vectorize.
  static bool better(T x, T a) { return (kMax ? x > a : x < a) || is_nan(x); }
  Acc init() const {
    if constexpr (std::is_floating_point_v<T>)
      return kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    else
      return kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
  }
  void step(Acc& a, T x, int64_t) const { a = better(x, a) ? x : a; }
  void merge(Acc& a, const Acc& b) const { step(a, b, 0); }
  Out finish(const Acc& a, int64_t) const { return a; }
};

// log(sum(exp(x))) in one pass with a running maximum.
template <typename T>
struct LogSumExpPolicy {
  struct Acc {
    double m = -std::numeric_limits<double>::infinity();
    double s = 0;
  };
  using Out = T;
  Acc init() const { return Acc{}; }
  static void add(Acc& a, double m, double s) {
    if (s == 0) return;
    if (m > a.m) {
      a.s = a.s * std::exp(a.m - m) + s;
      a.m = m;
    } else {
      a.s += s * std::exp(m - a.m);
    }
  }
  void step(Acc& a, T x, int64_t) const { add(a, static_cast<double>(x), 1.0); }
  void merge(Acc& a, const Acc& b) const { add(a, b.m, b.s); }
  Out finish(const Acc& a, int64_t) const {
    return cast_result<T>(a.s == 0 ? -std::numeric_limits<double>::infinity()
                                   : a.m + std::log(a.s));
  }
};

// Index of the max (kMax) or min along the lane; ties go to the first index unless `last`.
template <typename T, bool kMax>
struct ArgPolicy {
  struct Acc {
    T v{};
    int64_t index = -1;
  };
  using Out = int64_t;
  bool last = false;
  Acc init() const { return Acc{}; }
  void step(Acc& a, T x, int64_t r) const { merge(a, Acc{x, r}); }
  // Partial results may come from interleaved parts of a lane: ties go by index.
  void merge(Acc& a, const Acc& b) const {
    if (b.index < 0) return;
    const bool tie = b.v == a.v || (is_nan(b.v) && is_nan(a.v));
    if (a.index < 0 || (!tie && ExtremumPolicy<T, kMax>::better(b.v, a.v)) ||
        (tie && (last ? b.index > a.index : b.index < a.index)))
      a = b;
  }
  Out finish(const Acc& a, int64_t) const { return std::max<int64_t>(a.index, 0); }
};

// Folds v[r * stride] for r in [r0, r1). Contiguous runs keep kWays independent partial folds so
// the loop is not one long dependency chain, then merge them in a fixed order.
template <typename Policy, typename T>
typename Policy::Acc fold_run(const Policy& p, const T* v, int64_t r0, int64_t r1, int64_t stride) {
  using Acc = typename Policy::Acc;
  Acc a = p.init();
  if (stride != 1) {
    for (int64_t r = r0; r < r1; ++r) p.step(a, v[r * stride], r);
    return a;
  }
  constexpr int64_t kWays = 8;
  Acc part[kWays];
  for (Acc& q : part) q = p.init();
  int64_t r = r0;
  for (; r + kWays <= r1; r += kWays)
    for (int64_t j = 0; j < kWays; ++j) p.step(part[j], v[r + j], r + j);
  for (; r < r1; ++r) p.step(a, v[r], r);
  for (const Acc& q : part) p.merge(a, q);
  return a;
}

// Folds every lane of x with `p` into y[o * inner + i].
// Long lanes with few of them (full reductions) are cut into fixed chunks folded in parallel and
// merged in order, so a loss mean over a large batch still uses every thread deterministically.
template <typename Policy, typename T>
void reduce_lanes(const Lanes& l, const T* x, typename Policy::Out* y, const Policy& p,
                  const KernelContext& ctx) {
  using Acc = typename Policy::Acc;
  constexpr int64_t kChunk = 1 << 14;
  if (l.outer * l.inner < 16 && l.n >= 2 * kChunk) {
    const int64_t chunks = (l.n + kChunk - 1) / kChunk;
    const int64_t lanes = l.outer * l.inner;
    std::vector<Acc> partial(static_cast<size_t>(lanes * chunks));
    ctx.parallel_for(lanes * chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t lane = t / chunks, c = t % chunks;
        const T* v = x + (lane / l.inner) * l.n * l.inner + lane % l.inner;
        partial[static_cast<size_t>(t)] =
            fold_run(p, v, c * kChunk, std::min(l.n, (c + 1) * kChunk), l.inner);
      }
    });
    for (int64_t lane = 0; lane < lanes; ++lane) {
      Acc a = partial[static_cast<size_t>(lane * chunks)];
      for (int64_t c = 1; c < chunks; ++c)
        p.merge(a, partial[static_cast<size_t>(lane * chunks + c)]);
      y[lane] = p.finish(a, l.n);
    }
    return;
  }
  if (l.inner == 1) {
    for_each_lane_block(l, 1, l.n, ctx, [&](int64_t o, int64_t, int64_t) {
      y[o] = p.finish(fold_run(p, x + o * l.n, 0, l.n, 1), l.n);
    });
    return;
  }
  // Strided lanes: a block of adjacent lanes walks the rows in order, so each row is read as one
  // contiguous run of up to kWide elements (long runs keep the prefetcher and TLB happy); blocks
  // narrow only to give every thread work. Each lane still folds in row order, so the width
  // never changes a result.
  constexpr int64_t kWide = 2048;
  int64_t width = kWide;
  while (width > 64 && l.outer * ((l.inner + width - 1) / width) < 4 * ctx.num_threads())
    width /= 2;
  for_each_lane_block(l, width, l.n, ctx, [&](int64_t o, int64_t i0, int64_t m) {
    constexpr int64_t kSmall = 64;  // narrow blocks (small inner) stay off the heap
    Acc small[kSmall];
    std::vector<Acc> wide;
    Acc* acc = small;
    if (m > kSmall) {
      wide.resize(static_cast<size_t>(m));
      acc = wide.data();
    }
    for (int64_t j = 0; j < m; ++j) acc[j] = p.init();
    const T* row = x + o * l.n * l.inner + i0;
    for (int64_t r = 0; r < l.n; ++r) {
      const T* v = row + r * l.inner;
      for (int64_t j = 0; j < m; ++j) p.step(acc[j], v[j], r);
    }
    for (int64_t j = 0; j < m; ++j) y[o * l.inner + i0 + j] = p.finish(acc[j], l.n);
  });
}

// Stage adaptors for multi-stage plans: the first stage folds inputs into partial accumulators,
// later stages merge partial accumulators, the last one also finishes.
template <typename Policy>
struct PartialOf {
  const Policy& p;
  using Acc = typename Policy::Acc;
  using Out = Acc;
  Acc init() const { return p.init(); }
  template <typename In>
  void step(Acc& a, In x, int64_t r) const {
    p.step(a, x, r);
  }
  void merge(Acc& a, const Acc& b) const { p.merge(a, b); }
  Out finish(const Acc& a, int64_t) const { return a; }
};
template <typename Policy, bool kFinish>
struct MergeOf {
  const Policy& p;
  int64_t reduced_count;
  using Acc = typename Policy::Acc;
  using Out = std::conditional_t<kFinish, typename Policy::Out, Acc>;
  Acc init() const { return p.init(); }
  void step(Acc& a, const Acc& b, int64_t) const { p.merge(a, b); }
  void merge(Acc& a, const Acc& b) const { p.merge(a, b); }
  Out finish(const Acc& a, int64_t) const {
    if constexpr (kFinish)
      return p.finish(a, reduced_count);
    else
      return a;
  }
};

// Runs a plan: the whole of a Reduce*/Arg* kernel after attribute parsing. `y` must hold
// numel(plan.out_dims) elements.
template <typename Policy, typename T>
void run_reduce(const ReducePlan& plan, const T* x, typename Policy::Out* y, const Policy& p,
                KernelContext& ctx) {
  using Acc = typename Policy::Acc;
  const size_t last = plan.stages.size() - 1;
  if (last == 0) return reduce_lanes(plan.stages[0], x, y, p, ctx);
  auto lanes_out = [&](size_t k) {
    return static_cast<size_t>(plan.stages[k].outer * plan.stages[k].inner);
  };
  std::vector<Acc> in(lanes_out(0)), out;
  reduce_lanes(plan.stages[0], x, in.data(), PartialOf<Policy>{p}, ctx);
  for (size_t k = 1; k < last; ++k) {
    out.resize(lanes_out(k));
    reduce_lanes(plan.stages[k], in.data(), out.data(), MergeOf<Policy, false>{p, 0}, ctx);
    std::swap(in, out);
  }
  reduce_lanes(plan.stages[last], in.data(), y, MergeOf<Policy, true>{p, plan.reduced_count}, ctx);
}

// Calls fn.template operator()<T>() for the element type `t`, restricted to the types an op
// supports (FloatTypes: f32, f64; NumericTypes: also i32, i64); anything else fails naming the
// node.
struct FloatTypes {};
struct NumericTypes {};
template <typename T>
inline constexpr DataType kDataTypeOf = std::is_same_v<T, float>     ? DataType::kFloat
                                        : std::is_same_v<T, double>  ? DataType::kDouble
                                        : std::is_same_v<T, int32_t> ? DataType::kInt32
                                                                     : DataType::kInt64;
template <typename Fn, typename... Ts>
bool dispatch_among(DataType t, Fn& fn) {
  return ((t == kDataTypeOf<Ts> ? (fn.template operator()<Ts>(), true) : false) || ...);
}
template <typename Types, typename Fn>
void dispatch(DataType t, const std::string& where, Fn&& fn) {
  bool done = false;
  if constexpr (std::is_same_v<Types, NumericTypes>)
    done = dispatch_among<Fn, float, double, int32_t, int64_t>(t, fn);
  else
    done = dispatch_among<Fn, float, double>(t, fn);
  if (!done) fail(where, ": element type ", graph::dtype_short_name(t), " is not supported");
}

}  // namespace onnxtrain::ops::reduce
