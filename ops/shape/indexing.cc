// Offsets of the index-driven ops (see indexing.h).
#include "ops/shape/indexing.h"

#include <algorithm>

namespace onnxtrain::ops::shape {
namespace {

// Minimum elements per parallel chunk of index-driven copies.
constexpr int64_t kGrainElems = 4096;

int64_t product(std::span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

}  // namespace

int64_t checked_index(int64_t i, int64_t n, const std::string& where) {
  OT_CHECK(i >= -n && i < n, where, ": index ", i, " is out of range for a dim of size ", n);
  return i < 0 ? i + n : i;
}

std::vector<int64_t> axis_offsets(std::span<const int64_t> dims, size_t axis,
                                  const std::vector<int64_t>& idx) {
  const int64_t outer = product(dims.first(axis)), n = dims[axis];
  const int64_t inner = product(dims.subspan(axis + 1));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(outer) * idx.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j : idx) out.push_back((o * n + j) * inner);
  return out;
}

std::vector<int64_t> element_offsets(std::span<const int64_t> dims, const TensorView& indices,
                                     size_t axis, const std::string& where) {
  OT_CHECK(indices.dims.size() == dims.size(), where, ": indices have rank ", indices.rank(),
           ", data has rank ", dims.size());
  for (size_t k = 0; k < dims.size(); ++k)
    OT_CHECK(k == axis || indices.dims[k] <= dims[k], where, ": indices dim ", k, " is ",
             indices.dims[k], ", data has ", dims[k]);
  std::vector<int64_t> idx = view_ints(indices, where);
  const auto strides = contiguous_strides(dims);
  std::vector<int64_t> coord(dims.size(), 0);
  for (int64_t& v : idx) {
    int64_t off = 0;
    for (size_t k = 0; k < dims.size(); ++k)
      off += (k == axis ? checked_index(v, dims[k], where) : coord[k]) * strides[k];
    v = off;
    for (size_t k = dims.size(); k-- > 0;) {  // next coordinate of indices
      if (++coord[k] < indices.dims[k]) break;
      coord[k] = 0;
    }
  }
  return idx;
}

TupleOffsets tuple_offsets(std::span<const int64_t> dims, const TensorView& indices,
                           size_t batch_dims, const std::string& where) {
  const size_t b = batch_dims;
  OT_CHECK(indices.rank() >= 1 && b < indices.dims.size() && b <= dims.size(), where,
           ": batch_dims ", b, " does not fit ranks ", dims.size(), " and ", indices.rank());
  const auto m = static_cast<size_t>(indices.dims.back());
  OT_CHECK(b + m <= dims.size(), where, ": index tuples of length ", m, " after ", b,
           " batch dims exceed the data rank ", dims.size());
  for (size_t k = 0; k < b; ++k)
    OT_CHECK(dims[k] == indices.dims[k], where, ": batch dim ", k, " is ", indices.dims[k],
             " in the indices but ", dims[k], " in the data");
  const std::vector<int64_t> idx = view_ints(indices, where);
  const auto strides = contiguous_strides(dims);
  const auto index_dims = std::span<const int64_t>(indices.dims).first(indices.dims.size() - 1);
  const int64_t tuples = product(index_dims);
  const int64_t per_batch = product(index_dims.subspan(b));
  const int64_t batch_elems = b > 0 ? strides[b - 1] : 0;  // data elements per batch entry
  TupleOffsets out{std::vector<int64_t>(static_cast<size_t>(tuples)), product(dims.subspan(b + m))};
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t off = b > 0 ? (t / per_batch) * batch_elems : 0;
    for (size_t j = 0; j < m; ++j)
      off +=
          checked_index(idx[static_cast<size_t>(t) * m + j], dims[b + j], where) * strides[b + j];
    out.offsets[static_cast<size_t>(t)] = off;
  }
  return out;
}

void gather_rows(const KernelContext& ctx, ElemKind e, const void* src, void* dst,
                 const std::vector<int64_t>& offsets, int64_t block) {
  ctx.parallel_for(static_cast<int64_t>(offsets.size()),
                   std::max<int64_t>(1, kGrainElems / std::max<int64_t>(block, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t t = begin; t < end; ++t)
                       copy_elems(e, advance(dst, e, t * block),
                                  advance(src, e, offsets[static_cast<size_t>(t)]), block);
                   });
}

}  // namespace onnxtrain::ops::shape
