// The one broadcasting engine of the elementwise family: out[i] = f(in_0[..], ..., in_k[..]) over
// numpy-broadcast operands. Dims are collapsed first (runs of dims where every operand is either
// contiguous or broadcast merge into one), so same-shape and scalar operands become a single
// contiguous row and the inner loop is a plain loop over memory that the compiler vectorizes.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/elementwise/dtypes.h"
#include "ops/op_api.h"
#include "ops/simd_clones.h"

namespace onnxtrain::ops::ew {

inline constexpr int kMaxOperands = 3;
// Elements per parallel_for chunk: below this, threading costs more than it saves.
inline constexpr int64_t kGrain = 16384;

// Collapsed iteration space: dims[d] with per-operand element strides (0 = broadcast).
struct BroadcastLayout {
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, kMaxOperands> strides;
  std::array<bool, kMaxOperands> inner_contiguous{};  // inner stride is 1 (else 0)
  int num_operands = 0;
  int64_t total = 0;
};

// Checks that every operand broadcasts to out_dims and builds the collapsed layout.
BroadcastLayout make_layout(std::span<const int64_t> out_dims,
                            std::span<const std::span<const int64_t>> operand_dims,
                            const std::string& where);

// numpy-broadcast dims of several operands.
std::vector<int64_t> broadcast_all(std::span<const std::span<const int64_t>> operand_dims,
                                   const std::string& where);

template <typename T>
struct Operand {
  const T* data;
  std::span<const int64_t> dims;
};

namespace detail {

// One row of the collapsed space; Contig says per operand whether it advances (stride 1) or
// stays on one element (stride 0). Compile-time strides keep this loop vectorizable.
// Half and BFloat16 are the element types that are classes.
template <typename Out, typename... In>
inline constexpr bool kSixteenBitFloat = std::is_class_v<Out> || (std::is_class_v<In> || ...);

// A scalar rule built on ops/vec_math.h (Gelu, Erf, Exp, Sigmoid, Tanh...) says so with
// `static constexpr bool kVectorMath = true;`: its rows are worth the widest vectors too.
template <typename F>
concept VectorMath = requires { requires F::kVectorMath; };

// A rule whose arithmetic depends on an attribute (Gelu's approximate) offers
// `template <typename G> void with_static(G&& g) const`, calling g with a rule that has the
// choice compiled in: a branch left in the row loop keeps GCC from vectorizing it.
template <typename F>
concept StaticVariants = requires(const F& f) { f.with_static([](const auto&) {}); };

template <typename F, typename Out, typename... In>
inline constexpr bool kCloned = kSixteenBitFloat<Out, In...> || VectorMath<F>;

template <bool... Contig, typename Out, typename F, typename... In>
  requires(!kCloned<F, Out, In...>)
inline void run_row(std::integer_sequence<bool, Contig...>, int64_t n, Out* out, const F& f,
                    const In*... in) {
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<Out>(f(in[Contig ? j : 0]...));
}

// bf16 / f16 operands or outputs (mixed precision's activations: a ResNet's residual Add, its
// gradients' Sum, Relu; the Casts of weights and their gradients) convert every element, which
// baseline x86-64 has no packing instructions to vectorize: compiled for the CPU's widest vectors
// (ops/simd_clones.h). Measured at ResNet-50 224² b8, 2 threads: bf16 Add and Sum ran no faster
// than float32 without it (15.5 ms per step; 7 with it). Rules marked VectorMath likewise: GELU
// and its gradient on BERT's [N, T, 4H] activations took 3-5 ns per element through libm.
template <bool... Contig, typename Out, typename F, typename... In>
  requires(kCloned<F, Out, In...>)
OT_SIMD_CLONES void run_row(std::integer_sequence<bool, Contig...>, int64_t n, Out* out,
                            const F& f, const In*... in) {
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<Out>(f(in[Contig ? j : 0]...));
}

// Elements [begin, end) of the collapsed space. Offsets are updated incrementally, so a row costs
// a few adds beyond its loop even when the inner dim is short.
template <bool... Contig, typename Out, typename F, typename... In>
void run_range(std::integer_sequence<bool, Contig...> mask, const BroadcastLayout& layout,
               int64_t begin, int64_t end, Out* out, const F& f, const In*... in) {
  constexpr size_t kN = sizeof...(In);
  const size_t last = layout.dims.size() - 1;
  const int64_t inner = layout.dims[last];
  std::vector<int64_t> idx(last + 1, 0);
  std::array<int64_t, kN> off{};
  int64_t rest = begin;
  for (size_t d = last + 1; d-- > 0;) {
    idx[d] = rest % layout.dims[d];
    rest /= layout.dims[d];
    for (size_t k = 0; k < kN; ++k) off[k] += idx[d] * layout.strides[k][d];
  }
  auto row = [&]<size_t... K>(std::index_sequence<K...>, int64_t n) {
    run_row(mask, n, out + begin, f, (in + off[K])...);
  };
  while (begin < end) {
    const int64_t n = std::min(inner - idx[last], end - begin);
    row(std::index_sequence_for<In...>{}, n);
    begin += n;
    idx[last] += n;
    for (size_t k = 0; k < kN; ++k) off[k] += n * layout.strides[k][last];
    for (size_t d = last; d > 0 && idx[d] == layout.dims[d]; --d) {
      for (size_t k = 0; k < kN; ++k)
        off[k] += layout.strides[k][d - 1] - layout.dims[d] * layout.strides[k][d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// Turns flags[0..K) into a compile-time bool sequence and calls g with it.
template <size_t K, bool... C, typename G>
void with_mask(const std::array<bool, kMaxOperands>& flags, G&& g) {
  if constexpr (K == 0) {
    g(std::integer_sequence<bool, C...>{});
  } else if (flags[K - 1]) {
    with_mask<K - 1, true, C...>(flags, std::forward<G>(g));
  } else {
    with_mask<K - 1, false, C...>(flags, std::forward<G>(g));
  }
}

}  // namespace detail

// out (dims out.dims, element type Out) = f(operands...) elementwise with broadcasting, split
// across ctx's threads. Out may alias an operand with the same dims.
template <typename Out, typename F, typename... In>
void broadcast_apply(const KernelContext& ctx, TensorView& out, const F& f, Operand<In>... in) {
  static_assert(sizeof...(In) >= 1 && sizeof...(In) <= kMaxOperands);
  if constexpr (detail::StaticVariants<F>) {
    f.with_static([&](const auto& g) { broadcast_apply<Out>(ctx, out, g, in...); });
    return;
  }
  OT_CHECK(out.dtype == dtype_of<Out>, ctx.node().describe(), ": output dtype ",
           graph::dtype_short_name(out.dtype), " does not match the computed ",
           graph::dtype_short_name(dtype_of<Out>));
  std::array<std::span<const int64_t>, sizeof...(In)> dims{in.dims...};
  BroadcastLayout layout = make_layout(out.dims, dims, ctx.node().describe());
  if (layout.total == 0) return;
  Out* o = out.as<Out>();
  detail::with_mask<sizeof...(In)>(layout.inner_contiguous, [&](auto mask) {
    ctx.parallel_for(layout.total, kGrain, [&](int64_t begin, int64_t end) {
      detail::run_range(mask, layout, begin, end, o, f, in.data...);
    });
  });
}

}  // namespace onnxtrain::ops::ew
