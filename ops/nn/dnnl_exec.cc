// DnnlWindowPrimitive: primitive creation with layout fallback, reorders through scratch.
#include "ops/nn/dnnl_exec.h"

#include <cstddef>
#include <unordered_map>

namespace onnxtrain::ops::nn {

bool DnnlWindowPrimitive::init(const UserDescs& user, bool prefer_blocked, const PdFactory& make) {
  prim_.reset();
  if (prefer_blocked && try_init(user, true, make)) return true;
  return try_init(user, false, make);
}

bool DnnlWindowPrimitive::try_init(const UserDescs& user, bool blocked, const PdFactory& make) {
  using dnnl::memory;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const memory::data_type compute = user.compute;
  const memory::desc x = retyped(user.x, compute), w = retyped(user.w, compute);
  auto pick = [&](const memory::desc& d) { return blocked ? any_layout(d) : d; };
  // dst in the user's dtype first (no reorder back); under mixed precision also in the compute
  // dtype, for implementations that only write that.
  for (const memory::data_type y_type : {user.y.data_type(), compute}) {
    try {
      bind(user, make(pick(x), pick(w), pick(retyped(user.y, y_type)), attr), blocked);
      return true;
    } catch (const dnnl::error&) {
      prim_.reset();
    }
    if (y_type == compute) break;
  }
  return false;
}

void DnnlWindowPrimitive::bind(const UserDescs& user, const dnnl::primitive_desc& pd,
                               bool blocked) {
  user_ = user;
  x_md_ = pd.src_desc();
  w_md_ = pd.weights_desc();
  y_md_ = pd.dst_desc();
  pad_md_ = pd.scratchpad_desc();
  x_reorder_.reset();
  w_reorder_.reset();
  y_reorder_.reset();
  ScratchPlan plan;
  if (x_md_ != user.x) {
    x_reorder_ = Reorder(user.x, x_md_);
    x_off_ = plan.add(x_md_.get_size());
  }
  if (w_md_ != user.w) {
    // Weights change every training step, so they are reordered per run (cheap next to the
    // convolution itself) rather than cached.
    w_reorder_ = Reorder(user.w, w_md_);
    w_off_ = plan.add(w_md_.get_size());
  }
  if (y_md_ != user.y) {
    y_reorder_ = Reorder(y_md_, user.y);
    y_off_ = plan.add(y_md_.get_size());
  }
  pad_off_ = plan.add(pad_md_.get_size());
  scratch_bytes_ = plan.total();
  prim_ = dnnl::primitive(pd);
  stream_ = dnnl::stream(cpu_engine());
  impl_ = pd.impl_info_str();
  blocked_ = blocked;
  warm_gemm_kernels(impl_, user.compute);
}

void DnnlWindowPrimitive::execute(KernelContext& ctx, const void* x, const void* w, const void* b,
                                  void* y) {
  using dnnl::memory;
  const dnnl::engine& eng = cpu_engine();
  auto* scratch = static_cast<std::byte*>(scratch_bytes_ ? ctx.scratch(scratch_bytes_) : nullptr);
  // oneDNN takes non-const handles; inputs are only read.
  memory x_user(user_.x, eng, const_cast<void*>(x));
  memory w_user(user_.w, eng, const_cast<void*>(w));
  memory y_user(user_.y, eng, y);
  memory x_mem = x_reorder_ ? memory(x_md_, eng, scratch + x_off_) : x_user;
  memory w_mem = w_reorder_ ? memory(w_md_, eng, scratch + w_off_) : w_user;
  memory y_mem = y_reorder_ ? memory(y_md_, eng, scratch + y_off_) : y_user;
  dnnl::stream& s = *stream_;
  if (x_reorder_) x_reorder_->execute(s, x_user, x_mem);
  if (w_reorder_) w_reorder_->execute(s, w_user, w_mem);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, y_mem}};
  if (user_.has_bias) args.emplace(DNNL_ARG_BIAS, memory(user_.b, eng, const_cast<void*>(b)));
  if (pad_md_.get_size())
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(pad_md_, eng, scratch + pad_off_));
  prim_->execute(s, args);
  if (y_reorder_) y_reorder_->execute(s, y_mem, y_user);
  s.wait();
}

dnnl::memory::desc any_layout(const dnnl::memory::desc& d) {
  return dnnl::memory::desc(d.dims(), d.data_type(), dnnl::memory::format_tag::any);
}

dnnl::memory::desc retyped(const dnnl::memory::desc& d, dnnl::memory::data_type t) {
  if (d.data_type() == t) return d;
  dnnl_memory_desc_t c = d.data;
  // Strides and blocks count elements, so a dense layout (plain or blocked, no padding or extra
  // flags) holds the same elements in any dtype.
  OT_CHECK(c.format_kind == dnnl_blocked && c.extra.flags == 0,
           "retyped: only dense plain or blocked descs change dtype");
  for (int i = 0; i < c.ndims; ++i)
    OT_CHECK(c.padded_dims[i] == c.dims[i] && c.padded_offsets[i] == 0,
             "retyped: only unpadded descs change dtype");
  c.data_type = static_cast<dnnl_data_type_t>(t);
  return dnnl::memory::desc(c);
}

void DnnlRunner::init(const dnnl::primitive_desc& pd, std::vector<Arg> args) {
  ScratchPlan plan;
  args_.clear();
  for (Arg& a : args) {
    Bound b{a, pd.query_md(dnnl::query::exec_arg_md, a.id), std::nullopt, 0};
    if (b.prim != a.user) {
      b.reorder = a.output ? Reorder(b.prim, a.user)
                           : Reorder(a.user, b.prim);
      b.offset = plan.add(b.prim.get_size());
    }
    args_.push_back(std::move(b));
  }
  pad_md_ = pd.scratchpad_desc();
  pad_off_ = plan.add(pad_md_.get_size());
  scratch_bytes_ = plan.total();
  prim_ = dnnl::primitive(pd);
  // The backward primitives' compute dtype is diff_dst's (src_md is empty for backward data).
  dnnl::memory::desc dy = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_DIFF_DST);
  if (dy.data_type() == dnnl::memory::data_type::undef)
    dy = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_SRC);
  warm_gemm_kernels(pd.impl_info_str(), dy.data_type());
}

void DnnlRunner::execute(dnnl::stream& s, std::span<void* const> buffers, std::byte* scratch,
                         uint32_t laid_out) const {
  using dnnl::memory;
  const dnnl::engine& eng = cpu_engine();
  std::unordered_map<int, memory> exec_args;
  std::vector<std::pair<memory, memory>> outputs;  // (primitive's, user's) to reorder after
  for (size_t i = 0; i < args_.size(); ++i) {
    const Bound& b = args_[i];
    if (b.reorder && !b.arg.output && (laid_out >> i & 1u)) {
      exec_args.emplace(b.arg.id, memory(b.prim, eng, buffers[i]));
      continue;
    }
    memory user(b.arg.user, eng, buffers[i]);
    if (!b.reorder) {
      exec_args.emplace(b.arg.id, user);
      continue;
    }
    memory prim(b.prim, eng, scratch + b.offset);
    if (b.arg.output)
      outputs.emplace_back(prim, user);
    else
      b.reorder->execute(s, user, prim);
    exec_args.emplace(b.arg.id, prim);
  }
  if (pad_md_.get_size())
    exec_args.emplace(DNNL_ARG_SCRATCHPAD, memory(pad_md_, eng, scratch + pad_off_));
  prim_->execute(s, exec_args);
  for (size_t i = 0, k = 0; i < args_.size(); ++i)
    if (args_[i].reorder && args_[i].arg.output) {
      args_[i].reorder->execute(s, outputs[k].first, outputs[k].second);
      ++k;
    }
  s.wait();
}

}  // namespace onnxtrain::ops::nn
