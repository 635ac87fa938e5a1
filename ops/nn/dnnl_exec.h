// Runs a oneDNN src/weights/(bias)/dst primitive (convolution, deconvolution) directly on the
// runtime's plain row-major buffers, or through blocked layouts with per-run reorders via the
// kernel's scratch when the primitive is faster that way.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <span>

#include "ops/nn/dnnl_reorder.h"
#include "ops/nn/nn_util.h"

namespace onnxtrain::ops::nn {

// The runtime's buffers as plain descs (weights may be strided, e.g. ConvTranspose's io order).
// x and y may be float32 around bf16/f16 weights (ops/precision.h's conv_compute_dtype): the
// primitive then reads x in w's dtype (the reorder into scratch rounds it) and writes y in
// float32 where oneDNN can, else in w's dtype with a reorder back.
struct UserDescs {
  dnnl::memory::desc x, w, b, y;
  dnnl::memory::data_type compute = dnnl::memory::data_type::f32;  // what the primitive computes
  bool has_bias = false;
};

// Builds a primitive desc for the given x/w/dst descs (either the user's or format `any`).
using PdFactory = std::function<dnnl::primitive_desc(
    const dnnl::memory::desc& x, const dnnl::memory::desc& w, const dnnl::memory::desc& y,
    const dnnl::primitive_attr& attr)>;

class DnnlWindowPrimitive {
 public:
  // Tries blocked layouts first when `prefer_blocked`, then the plain ones. Returns false (and
  // stays unusable) when oneDNN has no implementation; callers then use their reference loop.
  bool init(const UserDescs& user, bool prefer_blocked, const PdFactory& make);
  void reset() { prim_.reset(); }
  bool ready() const { return prim_.has_value(); }
  const char* impl() const { return impl_.c_str(); }
  bool blocked() const { return blocked_; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  // x, w, b (may be null without bias), y: the runtime's buffers in the user layouts.
  void execute(KernelContext& ctx, const void* x, const void* w, const void* b, void* y);

 private:
  bool try_init(const UserDescs& user, bool blocked, const PdFactory& make);
  void bind(const UserDescs& user, const dnnl::primitive_desc& pd, bool blocked);

  UserDescs user_;
  std::optional<dnnl::primitive> prim_;
  std::optional<dnnl::stream> stream_;
  dnnl::memory::desc x_md_, w_md_, y_md_, pad_md_;
  std::optional<Reorder> x_reorder_, w_reorder_, y_reorder_;
  size_t x_off_ = 0, w_off_ = 0, y_off_ = 0, pad_off_ = 0, scratch_bytes_ = 0;
  std::string impl_;
  bool blocked_ = false;
};

// One oneDNN primitive (the backward convolutions) over the runtime's plain buffers. Each
// argument whose primitive layout differs from the user's goes through a reorder in scratch:
// inputs before the primitive, outputs after. The primitive desc must use
// scratchpad_mode::user; its scratchpad is carved from the same scratch block.
class DnnlRunner {
 public:
  struct Arg {
    int id;                   // DNNL_ARG_*
    dnnl::memory::desc user;  // the runtime buffer's layout
    bool output;
  };
  void init(const dnnl::primitive_desc& pd, std::vector<Arg> args);
  void reset() { prim_.reset(); }
  bool ready() const { return prim_.has_value(); }
  size_t scratch_bytes() const { return scratch_bytes_; }
  // buffers[i] belongs to args[i]; scratch holds scratch_bytes() (64-byte aligned). An input i
  // whose bit is set in `laid_out` is already in the primitive's layout (staged_md(i)): no
  // reorder.
  void execute(dnnl::stream& s, std::span<void* const> buffers, std::byte* scratch,
               uint32_t laid_out = 0) const;
  // Input i's layout for the primitive when it differs from the user's (else nullptr), and where
  // execute() left input i in that layout inside `scratch` (valid until scratch is reused): a
  // second primitive wanting the same layout of the same buffer takes it from there.
  const dnnl::memory::desc* staged_md(size_t i) const {
    return i < args_.size() && args_[i].reorder && !args_[i].arg.output ? &args_[i].prim
                                                                         : nullptr;
  }
  std::byte* staged(size_t i, std::byte* scratch) const { return scratch + args_[i].offset; }

 private:
  struct Bound {
    Arg arg;
    dnnl::memory::desc prim;
    std::optional<Reorder> reorder;
    size_t offset = 0;
  };
  std::optional<dnnl::primitive> prim_;
  std::vector<Bound> args_;
  dnnl::memory::desc pad_md_;
  size_t pad_off_ = 0, scratch_bytes_ = 0;
};

// Format `any` twin of a desc (lets oneDNN pick blocked layouts).
dnnl::memory::desc any_layout(const dnnl::memory::desc& d);
// The same layout (plain strided, or blocked without padding) in dtype t.
dnnl::memory::desc retyped(const dnnl::memory::desc& d, dnnl::memory::data_type t);

}  // namespace onnxtrain::ops::nn
