// Data-movement helpers of the shape family: one strided copy that Transpose, Slice, Concat,
// Split, Expand, Tile and Pad all reduce to, plus dtype-agnostic element access (bytes for
// fixed-size dtypes, std::string objects for strings) and reading int inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ops/op_api.h"

namespace onnxtrain::ops::shape {

// How one element is moved. Packed 4-bit dtypes are not addressable (bytes == 0).
struct ElemKind {
  size_t bytes = 0;
  bool is_string = false;
};

ElemKind elem_kind(DataType t);
// The element kind, or throws "<where>: dtype i4 is not supported by <op>" for packed dtypes.
ElemKind addressable_elem(DataType t, const std::string& where);

// First element of a view: the byte buffer, or the std::string array for strings.
const void* elems(const TensorView& v);
// Same for an output; sizes a string output's vector to its element count first.
void* out_elems(TensorView& v);
// p advanced by n elements.
inline const void* advance(const void* p, ElemKind e, int64_t n) {
  return static_cast<const std::byte*>(p) + n * static_cast<int64_t>(e.bytes);
}
inline void* advance(void* p, ElemKind e, int64_t n) {
  return static_cast<std::byte*>(p) + n * static_cast<int64_t>(e.bytes);
}

// Row-major strides (in elements) of dims.
std::vector<int64_t> contiguous_strides(std::span<const int64_t> dims);

// For every index i over `dims`: dst[i . dst_strides] = src[i . src_strides]. Strides are in
// elements and may be 0 (broadcast) or negative (reversed); dst and src must not overlap
// within one call. Adjacent dims are merged first so contiguous runs become memcpy. Large copies
// are split across ctx's intra-op threads (ctx may be null: single-threaded).
void strided_copy(const KernelContext* ctx, ElemKind e, std::span<const int64_t> dims, void* dst,
                  std::span<const int64_t> dst_strides, const void* src,
                  std::span<const int64_t> src_strides);

// dst (contiguous, dims[perm[0]], .., dims[perm[n]]) = src (contiguous `dims`) with its axes
// permuted: Transpose, and the 6-D views of DepthToSpace / SpaceToDepth.
void permute_copy(const KernelContext* ctx, ElemKind e, std::span<const int64_t> dims,
                  std::span<const int64_t> perm, void* dst, const void* src);

// One element of value v in dtype t (numeric dtypes, bool, f16, bf16), converted as Cast does.
void scalar_bytes(DataType t, double v, void* out, const std::string& where);

// n contiguous elements from src to dst (memcpy, or string assignment).
void copy_elems(ElemKind e, void* dst, const void* src, int64_t n);

// Copies every element of `in` into `out` (same dtype and element count): the kernel of the
// ops that only change the shape (Reshape, Flatten, Squeeze, Unsqueeze). Works for all dtypes.
void copy_all(const KernelContext& ctx, const TensorView& in, TensorView& out);

// Fills n elements at dst with the single element at value.
void fill_elems(const KernelContext* ctx, ElemKind e, void* dst, int64_t n, const void* value);

// Largest tensor the family's generating ops (ConstantOfShape, Range, Expand, Tile) create.
inline constexpr int64_t kMaxOutputBytes = int64_t{4} << 30;
// Element count of dims, checked for negative dims / overflow and against kMaxOutputBytes,
// before anything is allocated.
int64_t checked_output_elements(DataType t, std::span<const int64_t> dims,
                                const std::string& where);

// Values of an int32/int64 input tensor (shape, axes, pads, repeats).
std::vector<int64_t> view_ints(const TensorView& v, const std::string& where);
// The same for optional input i of a kernel: nullopt when omitted.
std::optional<std::vector<int64_t>> input_ints(const KernelContext& ctx, int i);
// The values of input i when it is constant at inference time.
std::optional<std::vector<int64_t>> const_ints(const InferenceContext& ctx, size_t i);

// Output i as a known shape, or as `rank` unknown dims (rank < 0: rank unknown too).
void set_output_dims(InferenceContext& ctx, size_t i, DataType dtype,
                     const std::optional<std::vector<int64_t>>& dims, int64_t rank = -1);

// Output 0 of a grad op that rebuilds a forward input of shape `shape_input` (a 1-D int64
// Shape(X)) in dY's type: concrete dims once the shape is constant, the rank before that.
void infer_from_shape_input(InferenceContext& ctx, size_t shape_input);

}  // namespace onnxtrain::ops::shape
