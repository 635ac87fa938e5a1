// Index arithmetic shared by the gathers and scatters: every index-driven op turns its indices
// into a list of element offsets into the data (checked, negative indices wrapped) and then
// moves `block` contiguous elements per offset.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ops/shape/copy.h"

namespace onnxtrain::ops::shape {

// i in [-n, n) -> [0, n); throws naming the node otherwise.
int64_t checked_index(int64_t i, int64_t n, const std::string& where);

// Gather / Compress: for each outer block o and index j (already in [0, dims[axis])), the
// offset of slice data[o, idx[j], :]; blocks of prod(dims[axis+1:]) elements.
std::vector<int64_t> axis_offsets(std::span<const int64_t> dims, size_t axis,
                                  const std::vector<int64_t>& idx);

// GatherElements / ScatterElements: for each element p of indices (same rank as the data),
// the offset of data[p with the axis coordinate replaced by indices[p]]; blocks of 1.
std::vector<int64_t> element_offsets(std::span<const int64_t> dims, const TensorView& indices,
                                     size_t axis, const std::string& where);

// GatherND / ScatterND: for each index tuple (the last indices dim, after batch_dims leading
// dims shared with the data), the offset of the addressed slice, and the slice size.
struct TupleOffsets {
  std::vector<int64_t> offsets;
  int64_t block = 1;
};
TupleOffsets tuple_offsets(std::span<const int64_t> dims, const TensorView& indices,
                           size_t batch_dims, const std::string& where);

// dst[t * block ..] = src[offsets[t] ..] for every t, split across the intra-op threads.
void gather_rows(const KernelContext& ctx, ElemKind e, const void* src, void* dst,
                 const std::vector<int64_t>& offsets, int64_t block);

}  // namespace onnxtrain::ops::shape
