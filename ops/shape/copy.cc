// The shape family's strided copy and element helpers (see copy.h).
#include "ops/shape/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/elementwise/dtypes.h"  // dtype dispatch and Cast-like conversion
#include "ops/shape_util.h"

namespace onnxtrain::ops::shape {
namespace {

// Below this many bytes a copy runs on the calling thread.
constexpr int64_t kParallelBytes = int64_t{1} << 16;
// Minimum bytes per parallel chunk.
constexpr int64_t kGrainBytes = int64_t{1} << 15;

// One run of n elements: dst[k*ds] = src[k*ss]. N is the element size (0: std::string).
template <size_t N>
void copy_run(std::byte* dst, int64_t ds, const std::byte* src, int64_t ss, int64_t n) {
  if (ds == 1 && ss == 1) {
    std::memcpy(dst, src, static_cast<size_t>(n) * N);
    return;
  }
  for (int64_t k = 0; k < n; ++k) std::memcpy(dst + k * ds * N, src + k * ss * N, N);
}

template <>
void copy_run<0>(std::byte* dst, int64_t ds, const std::byte* src, int64_t ss, int64_t n) {
  auto* d = reinterpret_cast<std::string*>(dst);
  const auto* s = reinterpret_cast<const std::string*>(src);
  for (int64_t k = 0; k < n; ++k) d[k * ds] = s[k * ss];
}

using RunFn = void (*)(std::byte*, int64_t, const std::byte*, int64_t, int64_t);

RunFn run_fn(ElemKind e) {
  if (e.is_string) return &copy_run<0>;
  switch (e.bytes) {
    case 1:
      return &copy_run<1>;
    case 2:
      return &copy_run<2>;
    case 4:
      return &copy_run<4>;
    case 8:
      return &copy_run<8>;
    case 16:
      return &copy_run<16>;
    default:
      fail("strided copy: unsupported element size ", e.bytes);
  }
}

// dims/strides after dropping size-1 dims and merging dims that are contiguous in both tensors.
struct Loop {
  std::vector<int64_t> dims, ds, ss;
};

Loop coalesce(std::span<const int64_t> dims, std::span<const int64_t> ds,
              std::span<const int64_t> ss) {
  Loop l;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 1) continue;
    if (!l.dims.empty() && l.ds.back() == ds[k] * dims[k] && l.ss.back() == ss[k] * dims[k]) {
      l.dims.back() *= dims[k];
      l.ds.back() = ds[k];
      l.ss.back() = ss[k];
      continue;
    }
    l.dims.push_back(dims[k]);
    l.ds.push_back(ds[k]);
    l.ss.push_back(ss[k]);
  }
  if (l.dims.empty()) l = Loop{{1}, {1}, {1}};
  return l;
}

// Copies rows [begin, end) of the loop: a row is one run along the innermost dim.
void copy_rows(const Loop& l, RunFn run, size_t bytes, std::byte* dst, const std::byte* src,
               int64_t begin, int64_t end) {
  const size_t outer = l.dims.size() - 1;
  std::vector<int64_t> idx(outer, 0);
  int64_t doff = 0, soff = 0, rest = begin;
  for (size_t k = outer; k-- > 0;) {
    idx[k] = rest % l.dims[k];
    rest /= l.dims[k];
    doff += idx[k] * l.ds[k];
    soff += idx[k] * l.ss[k];
  }
  const auto b = static_cast<int64_t>(bytes);
  for (int64_t row = begin; row < end; ++row) {
    run(dst + doff * b, l.ds[outer], src + soff * b, l.ss[outer], l.dims[outer]);
    for (size_t k = outer; k-- > 0;) {  // odometer step
      doff += l.ds[k];
      soff += l.ss[k];
      if (++idx[k] < l.dims[k]) break;
      doff -= l.ds[k] * l.dims[k];
      soff -= l.ss[k] * l.dims[k];
      idx[k] = 0;
    }
  }
}

// ---- transposes: the output's contiguous dim is strided in the source, and some other dim is
// the source's contiguous one. Walking the output row by row reads one element per cache line
// of the source (a [1024, 256] float transpose: 256 distinct lines per output row); tiles of
// kTile x kTile elements keep both sides' lines in L1. BERT's weight and key transposes took
// 41 ms per training step through copy_rows.
constexpr int64_t kTile = 16;

// dst[a * da + b] = src[a + b * sb] for a < na, b < nb (one tile or less).
template <typename U>
void transpose_tile(U* dst, int64_t da, const U* src, int64_t sb, int64_t na, int64_t nb) {
  for (int64_t a = 0; a < na; ++a)
    for (int64_t b = 0; b < nb; ++b) dst[a * da + b] = src[a + b * sb];
}

template <typename U>
void transpose_copy(const KernelContext* ctx, const Loop& l, size_t k, std::byte* dst,
                    const std::byte* src) {
  const size_t last = l.dims.size() - 1;
  // The other dims, walked as one index space.
  std::vector<size_t> rest;
  for (size_t q = 0; q < last; ++q)
    if (q != k) rest.push_back(q);
  int64_t outer = 1;
  for (size_t q : rest) outer *= l.dims[q];
  const int64_t na = l.dims[k], nb = l.dims[last];
  const int64_t tiles_a = (na + kTile - 1) / kTile, tiles_b = (nb + kTile - 1) / kTile;
  const int64_t tasks = outer * tiles_a;
  auto* d = reinterpret_cast<U*>(dst);
  const auto* s = reinterpret_cast<const U*>(src);
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      int64_t o = t / tiles_a;
      const int64_t a0 = (t % tiles_a) * kTile;
      int64_t doff = 0, soff = 0;
      for (size_t r = rest.size(); r-- > 0;) {
        const int64_t i = o % l.dims[rest[r]];
        o /= l.dims[rest[r]];
        doff += i * l.ds[rest[r]];
        soff += i * l.ss[rest[r]];
      }
      const int64_t ta = std::min(kTile, na - a0);
      for (int64_t tb = 0; tb < tiles_b; ++tb) {
        const int64_t b0 = tb * kTile;
        transpose_tile(d + doff + a0 * l.ds[k] + b0, l.ds[k], s + soff + a0 + b0 * l.ss[last],
                       l.ss[last], ta, std::min(kTile, nb - b0));
      }
    }
  };
  const int64_t bytes = outer * na * nb * static_cast<int64_t>(sizeof(U));
  if (!ctx || ctx->num_threads() <= 1 || bytes < kParallelBytes) {
    work(0, tasks);
    return;
  }
  const int64_t per_task = kTile * nb * static_cast<int64_t>(sizeof(U));
  ctx->parallel_for(tasks, std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(per_task, 1)),
                    work);
}

// Runs the copy as a tiled transpose when it is one (see above); false when it is not.
bool try_transpose(const KernelContext* ctx, ElemKind e, const Loop& l, std::byte* dst,
                   const std::byte* src) {
  const size_t last = l.dims.size() - 1;
  if (e.is_string || last == 0 || l.ds[last] != 1 || l.ss[last] == 1 || l.dims[last] < kTile)
    return false;
  size_t k = last;
  for (size_t q = 0; q < last; ++q)
    if (l.ss[q] == 1) k = q;
  if (k == last || l.dims[k] < kTile) return false;
  switch (e.bytes) {
    case 1:
      transpose_copy<uint8_t>(ctx, l, k, dst, src);
      return true;
    case 2:
      transpose_copy<uint16_t>(ctx, l, k, dst, src);
      return true;
    case 4:
      transpose_copy<uint32_t>(ctx, l, k, dst, src);
      return true;
    case 8:
      transpose_copy<uint64_t>(ctx, l, k, dst, src);
      return true;
    default:
      return false;
  }
}

}  // namespace

ElemKind elem_kind(DataType t) {
  if (t == DataType::kString) return ElemKind{sizeof(std::string), true};
  int bits = graph::dtype_bits(t);
  return ElemKind{bits >= 8 ? static_cast<size_t>(bits / 8) : 0, false};
}

ElemKind addressable_elem(DataType t, const std::string& where) {
  ElemKind e = elem_kind(t);
  OT_CHECK(e.bytes > 0, where, ": dtype ", graph::dtype_short_name(t), " is not supported");
  return e;
}

const void* elems(const TensorView& v) {
  if (v.dtype == DataType::kString) {
    OT_CHECK(v.strings, "string tensor without storage");
    return v.strings->data();
  }
  return v.data;
}

void* out_elems(TensorView& v) {
  if (v.dtype == DataType::kString) {
    OT_CHECK(v.strings, "string tensor without storage");
    v.strings->resize(static_cast<size_t>(v.numel()));
    return v.strings->data();
  }
  return v.data;
}

std::vector<int64_t> contiguous_strides(std::span<const int64_t> dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t k = dims.size(); k-- > 1;) s[k - 1] = s[k] * dims[k];
  return s;
}

void strided_copy(const KernelContext* ctx, ElemKind e, std::span<const int64_t> dims, void* dst,
                  std::span<const int64_t> dst_strides, const void* src,
                  std::span<const int64_t> src_strides) {
  for (int64_t d : dims)
    if (d == 0) return;
  Loop l = coalesce(dims, dst_strides, src_strides);
  RunFn run = run_fn(e);
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (try_transpose(ctx, e, l, d, s)) return;
  const int64_t inner = l.dims.back();
  int64_t rows = 1;
  for (size_t k = 0; k + 1 < l.dims.size(); ++k) rows *= l.dims[k];
  const int64_t row_bytes = inner * static_cast<int64_t>(e.bytes);
  if (!ctx || ctx->num_threads() <= 1 || rows * row_bytes < kParallelBytes) {
    copy_rows(l, run, e.bytes, d, s, 0, rows);
    return;
  }
  if (rows >= ctx->num_threads()) {
    ctx->parallel_for(rows, std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(row_bytes, 1)),
                      [&](int64_t b, int64_t en) { copy_rows(l, run, e.bytes, d, s, b, en); });
    return;
  }
  // Few long rows (a big contiguous block): split each row instead.
  const auto eb = static_cast<int64_t>(e.bytes);
  const int64_t ds = l.ds.back(), ss = l.ss.back();
  for (int64_t row = 0; row < rows; ++row) {
    // Offsets of this row's first element.
    std::byte* rd = d;
    const std::byte* rs = s;
    int64_t rest = row;
    for (size_t k = l.dims.size() - 1; k-- > 0;) {
      int64_t i = rest % l.dims[k];
      rest /= l.dims[k];
      rd += i * l.ds[k] * eb;
      rs += i * l.ss[k] * eb;
    }
    ctx->parallel_for(inner, std::max<int64_t>(1, kGrainBytes / eb), [&](int64_t b, int64_t en) {
      run(rd + b * ds * eb, ds, rs + b * ss * eb, ss, en - b);
    });
  }
}

void permute_copy(const KernelContext* ctx, ElemKind e, std::span<const int64_t> dims,
                  std::span<const int64_t> perm, void* dst, const void* src) {
  const auto in_strides = contiguous_strides(dims);
  std::vector<int64_t> out_dims, src_strides;
  for (int64_t p : perm) {
    out_dims.push_back(dims[p]);
    src_strides.push_back(in_strides[p]);
  }
  strided_copy(ctx, e, out_dims, dst, contiguous_strides(out_dims), src, src_strides);
}

void scalar_bytes(DataType t, double v, void* out, const std::string& where) {
  ew::dispatch(ew::AllTypes{}, t, where, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T x = ew::convert<T>(v);
    std::memcpy(out, &x, sizeof(T));
  });
}

void copy_elems(ElemKind e, void* dst, const void* src, int64_t n) {
  run_fn(e)(static_cast<std::byte*>(dst), 1, static_cast<const std::byte*>(src), 1, n);
}

void copy_all(const KernelContext& ctx, const TensorView& in, TensorView& out) {
  OT_CHECK(in.dtype == out.dtype && in.numel() == out.numel(), ctx.node().describe(),
           ": internal: copy between mismatched tensors");
  if (in.dtype == DataType::kString) {
    *out.strings = *in.strings;
    return;
  }
  if (in.data == out.data) return;
  ElemKind e = elem_kind(in.dtype);
  if (e.bytes == 0) {  // packed 4-bit: plain bytes
    auto bytes = graph::dtype_storage_bytes(in.dtype, in.numel());
    if (*bytes > 0) std::memcpy(out.data, in.data, static_cast<size_t>(*bytes));
    return;
  }
  const int64_t n = in.numel();
  strided_copy(&ctx, e, std::span<const int64_t>(&n, 1), out.data, std::vector<int64_t>{1}, in.data,
               std::vector<int64_t>{1});
}

void fill_elems(const KernelContext* ctx, ElemKind e, void* dst, int64_t n, const void* value) {
  const int64_t zero = 0, one = 1;
  strided_copy(ctx, e, std::span<const int64_t>(&n, 1), dst, std::span<const int64_t>(&one, 1),
               value, std::span<const int64_t>(&zero, 1));
}

int64_t checked_output_elements(DataType t, std::span<const int64_t> dims,
                                const std::string& where) {
  const int64_t n = graph::checked_element_count(dims, where);
  const int64_t elem = t == DataType::kString ? int64_t{sizeof(std::string)} : 1;
  auto bytes = graph::dtype_storage_bytes(t == DataType::kString ? DataType::kUInt8 : t, n);
  OT_CHECK(bytes && *bytes <= kMaxOutputBytes / elem, where, ": output of ", n, " ",
           graph::dtype_short_name(t), " elements exceeds the ", kMaxOutputBytes >> 30,
           " GiB tensor cap");
  return n;
}

std::vector<int64_t> view_ints(const TensorView& v, const std::string& where) {
  std::vector<int64_t> out(static_cast<size_t>(v.numel()));
  if (v.dtype == DataType::kInt64) {
    if (!out.empty()) std::memcpy(out.data(), v.data, out.size() * sizeof(int64_t));
  } else if (v.dtype == DataType::kInt32) {
    const auto* p = static_cast<const int32_t*>(v.data);
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  } else {
    fail(where, ": expected an int32/int64 tensor, got ", graph::dtype_short_name(v.dtype));
  }
  return out;
}

std::optional<std::vector<int64_t>> input_ints(const KernelContext& ctx, int i) {
  const TensorView* v = ctx.input(i);
  if (!v) return std::nullopt;
  return view_ints(*v, ctx.node().describe());
}

std::optional<std::vector<int64_t>> const_ints(const InferenceContext& ctx, size_t i) {
  const graph::Tensor* t = ctx.input_value(i);
  if (!t) return std::nullopt;
  return to_int64s(*t, ctx.where());
}

void set_output_dims(InferenceContext& ctx, size_t i, DataType dtype,
                     const std::optional<std::vector<int64_t>>& dims, int64_t rank) {
  if (dims) {
    set_output(ctx, i, dtype, to_shape(*dims));
  } else if (rank >= 0) {
    set_output(ctx, i, dtype, Shape(static_cast<size_t>(rank)));
  } else {
    set_output(ctx, i, dtype, std::nullopt);
  }
}

void infer_from_shape_input(InferenceContext& ctx, size_t shape_input) {
  const ValueType& dy = tensor_input(ctx, 0);
  int64_t rank = -1;
  if (const ValueType* t = ctx.input_type(shape_input); t && t->shape && t->shape->size() == 1 &&
                                                         (*t->shape)[0].is_known())
    rank = (*t->shape)[0].value;
  set_output_dims(ctx, 0, dy.dtype, const_ints(ctx, shape_input), rank);
}

}  // namespace onnxtrain::ops::shape
