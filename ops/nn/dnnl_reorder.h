// One reorder between two layouts of a tensor, for the kernels that run oneDNN primitives on
// blocked layouts behind the runtime's plain buffers (dnnl_exec, fused_conv).
//
// Weights are reordered every training step (they change every step): plain OIHW to the
// primitives' doubly blocked layouts (OIhw16i16o, IOhw16o16i, ...) before forward and
// backward-data, and backward-weights' blocked dW back to OIHW. oneDNN 2.6 moves OIhw16i16o ->
// OIHW with its generic jit:uni reorder at about 3 GB/s (ResNet-50 at 64x64, batch 16,
// 1 thread: 29 ms of a 426 ms step), so blocked -> plain goes through our own loop where
// oneDNN has no specialised (jit:blk) kernel: cells of b0 x b1 elements, parallel over cells,
// the plain side walked along its smaller stride. Everything else is oneDNN's reorder.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include <dnnl.hpp>

namespace onnxtrain::ops::nn {

// Plain (dense row-major) <-> a layout with exactly two dims blocked once each, 4-byte elements
// of one type, no offsets. Writing the blocked side zeroes its padding, as oneDNN does.
struct TwoBlockReorder {
  static constexpr int kMaxDims = 6;
  int ndims = 0;
  int elem_bytes = 4;  // 2 or 4: bit copies
  bool to_blocked = false;
  std::array<int64_t, kMaxDims> dims{}, cells{}, blocked_stride{}, plain_stride{}, block{};
  int outer_dim = 0, inner_dim = 0;  // the two blocked dims: in-cell offset outer*b_inner + inner
  int64_t cell_count = 0, cell_size = 0;

  // The plan for from -> to, or nullopt when the pair is not plain <-> two-blocked.
  static std::optional<TwoBlockReorder> plan(const dnnl::memory::desc& from,
                                             const dnnl::memory::desc& to);
  // Uses the calling thread's OpenMP thread count (the kernels' ThreadBudget).
  void run(const void* from, void* to) const;
};

class Reorder {
 public:
  Reorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to);
  void execute(dnnl::stream& s, dnnl::memory from, dnnl::memory to) const;
  // True when our loop runs it (tests).
  bool own() const { return own_.has_value(); }

 private:
  std::optional<TwoBlockReorder> own_;
  std::optional<dnnl::reorder> dnnl_;
};

}  // namespace onnxtrain::ops::nn
