// ai.onnxtrain.FusedConv: the inference-only Conv that passes::optimize_inference emits — Conv
// with an already folded BatchNormalization bias, an optional residual Z added to the result
// and an optional Relu, as one oneDNN primitive (sum and eltwise post-ops) whose weights are
// packed once per plan. x / y / z may hold oneDNN's blocked channel layout (x_blocked,
// y_blocked, z_blocked = 1) so consecutive convolutions skip the reorders to plain NCHW.
// Mixed precision (onnxrun --precision bf16: passes::autocast after optimize_inference): x, z
// and y bf16 around the float32 weight and bias (ops/precision.h's conv_compute_dtype), the
// weight rounded to bf16 once, in the packing reorder; oneDNN accumulates in float32.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "ops/nn/blocked_layout.h"
#include "ops/nn/dnnl_exec.h"
#include "ops/nn/nn_util.h"
#include "ops/precision.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

using dnnl::memory;

// X and W as ops/precision.h's conv_compute_dtype allows them (one dtype, or bf16 / f16 X
// around a float32 W), Z in X's dtype (it is added to Y, which has X's); unknown dtypes pass.
void check_fused_conv_dtypes(const std::string& where, DataType x, DataType w, DataType z) {
  OT_CHECK(conv_compute_dtype(x, w), where, ": x is ", graph::dtype_short_name(x),
           ", weight is ", graph::dtype_short_name(w),
           "; they must match (or x be bf16/f16 around an f32 weight: mixed precision)");
  OT_CHECK(z == DataType::kUndefined || x == DataType::kUndefined || z == x, where, ": Z is ",
           graph::dtype_short_name(z), ", x is ", graph::dtype_short_name(x), "; they must match");
}

// Output (N, M, spatial...) from fully known x and w shapes (the pass only fuses those).
void infer_fused_conv(InferenceContext& ctx) {
  const std::string where = ctx.where();
  check_float_input(ctx, 0);
  const ValueType& x = tensor_input(ctx, 0);
  const ValueType& w = tensor_input(ctx, 1);
  check_fused_conv_dtypes(where, x.dtype, w.dtype,
                          ctx.input_type(3) ? ctx.input_type(3)->dtype : DataType::kUndefined);
  if (!x.shape || !w.shape) {
    set_output(ctx, 0, x.dtype, std::nullopt);
    return;
  }
  const size_t rank = x.shape->size();
  OT_CHECK(rank >= 3 && w.shape->size() == rank, where, ": x rank ", rank, " and weight rank ",
           w.shape->size(), " must be equal and >= 3");
  std::vector<int64_t> kernel;
  for (size_t i = 2; i < rank; ++i) kernel.push_back((*w.shape)[i].value);
  Shape out{(*x.shape)[0], (*w.shape)[0]};
  const bool kernel_known =
      std::all_of(kernel.begin(), kernel.end(), [](int64_t k) { return k >= 0; });
  std::optional<std::vector<int64_t>> kernel_opt;
  if (kernel_known) kernel_opt = kernel;
  WindowAttrs a = read_window_attrs(ctx.node, rank - 2, kernel_opt, where);
  for (size_t i = 0; i < rank - 2; ++i) {
    const Dim& in = (*x.shape)[i + 2];
    out.push_back(in.is_known() ? Dim::known(forward_axis(a, i, in.value, where).out) : Dim{});
  }
  set_output(ctx, 0, x.dtype, out);
}

// x: (N,C,H,W), w: (M,C/g,R,S), b: (M), z: (N,M,P,Q) -> y = act(conv(x, w) + b + z): (N,M,P,Q)
class FusedConvKernel final : public Kernel {
 public:
  explicit FusedConvKernel(const graph::Node& node)
      : where_(node.describe()),
        relu_(node.attr_string("activation", "") == "Relu"),
        x_blocked_(node.attr_int(kXBlockedAttr, 0) != 0),
        y_blocked_(node.attr_int(kYBlockedAttr, 0) != 0),
        z_blocked_(node.attr_int(kZBlockedAttr, 0) != 0) {
    const std::string act = node.attr_string("activation", "");
    OT_CHECK(act.empty() || act == "Relu", where_, ": activation '", act,
             "' not supported (expected \"\" or \"Relu\")");
  }

  void prepare(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* w = ctx.input(1);
    OT_CHECK(x && w, where_, ": inputs X and W are required");
    const TensorView* b = ctx.input(2);
    const TensorView* z = ctx.input(3);
    check_fused_conv_dtypes(where_, x->dtype, w->dtype, z ? z->dtype : DataType::kUndefined);
    const std::optional<memory::data_type> act = dnnl_float_type(x->dtype),
                                           wt = dnnl_float_type(w->dtype),
                                           compute = dnnl_float_type(
                                               *conv_compute_dtype(x->dtype, w->dtype));
    OT_CHECK(act && wt && compute, where_, ": x is ", graph::dtype_short_name(x->dtype),
             ", w is ", graph::dtype_short_name(w->dtype), "; FusedConv takes f32, bf16 or f16");
    OT_CHECK(!b || b->dtype == w->dtype, where_, ": bias is ", graph::dtype_short_name(b->dtype),
             ", weight is ", graph::dtype_short_name(w->dtype));
    act_ = *act;
    wt_ = *wt;
    compute_ = *compute;
    OT_CHECK(x->rank() == 4 && w->rank() == 4, where_, ": x rank ", x->rank(), ", w rank ",
             w->rank(), "; FusedConv is 2-D only");
    x_dims_ = x->dims;
    w_dims_ = w->dims;
    has_bias_ = b != nullptr;
    has_z_ = z != nullptr;
    group_ = ctx.node().attr_int("group", 1);
    OT_CHECK(group_ >= 1 && x->dims[1] == w->dims[1] * group_ && w->dims[0] % group_ == 0, where_,
             ": x has ", x->dims[1], " channels, weight (", join_dims(w->dims), ") with group ",
             group_);
    WindowAttrs a = read_window_attrs(
        ctx.node(), 2, std::vector<int64_t>(w->dims.begin() + 2, w->dims.end()), where_);
    geom_ = WindowGeom{};
    y_dims_ = {x->dims[0], w->dims[0]};
    for (size_t i = 0; i < 2; ++i) {
      AxisWindow aw = forward_axis(a, i, x->dims[i + 2], where_);
      y_dims_.push_back(geom_.add_axis(x->dims[i + 2], aw.out, aw.pad_begin, aw.pad_end));
    }
    geom_.finish(std::vector<int64_t>(w->dims.begin() + 2, w->dims.end()), a.strides, a.dilations);
    if (b)
      OT_CHECK(b->rank() == 1 && b->dims[0] == w->dims[0], where_, ": bias must have shape (",
               w->dims[0], "), got (", join_dims(b->dims), ")");
    if (z)
      OT_CHECK(z->dims == y_dims_, where_, ": Z has shape (", join_dims(z->dims),
               "), the convolution gives (", join_dims(y_dims_), ")");
    // Each blocked tensor needs its own channel count to divide into blocks; a plain x with 3
    // channels may feed a blocked y with 32.
    OT_CHECK(!x_blocked_ || can_block_channels(x->dims[1]), where_, ": blocked x needs channels ",
             "divisible by ", kBlockedChannelMultiple, ", got ", x->dims[1]);
    OT_CHECK(!(y_blocked_ || z_blocked_) || can_block_channels(w->dims[0]), where_,
             ": blocked y / z need channels divisible by ", kBlockedChannelMultiple, ", got ",
             w->dims[0]);
    OT_CHECK(product(y_dims_) > 0 && x->numel() > 0, where_, ": empty tensors are not supported");
    init_dnnl(ctx, *w);
    if (scratch_bytes_) ctx.scratch(scratch_bytes_);  // sizes the plan's workspace
  }

  void run(KernelContext& ctx) override {
    const TensorView* x = ctx.input(0);
    const TensorView* w = ctx.input(1);
    const TensorView* b = ctx.input(2);
    const TensorView* z = ctx.input(3);
    if (!prim_ || !x || !w || x->dims != x_dims_ || w->dims != w_dims_ ||
        (b != nullptr) != has_bias_ || (z != nullptr) != has_z_)
      prepare(ctx);
    TensorView& y = ctx.output(0, y_dims_);
    const dnnl::engine& eng = cpu_engine();
    auto* scratch = static_cast<std::byte*>(scratch_bytes_ ? ctx.scratch(scratch_bytes_) : nullptr);
    ThreadBudget budget(ctx.num_threads());
    dnnl::stream& s = *stream_;
    memory x_user(x_user_md_, eng, x->data);
    memory x_mem = x_reorder_ ? memory(x_md_, eng, scratch + x_off_) : x_user;
    if (x_reorder_) x_reorder_->execute(s, x_user, x_mem);
    memory w_mem = w_packed_ ? *w_packed_ : memory(w_md_, eng, scratch + w_off_);
    if (!w_packed_) {
      memory w_user(w_user_md_, eng, w->data);
      if (w_reorder_)
        w_reorder_->execute(s, w_user, w_mem);
      else
        w_mem = w_user;
    }
    memory y_user(y_user_md_, eng, y.data);
    memory y_mem = y_reorder_ ? memory(y_md_, eng, scratch + y_off_) : y_user;
    if (z) {
      // The sum post-op accumulates into dst, so dst starts as Z (in the primitive's layout).
      memory z_user(z_user_md_, eng, z->data);
      if (z_reorder_)
        z_reorder_->execute(s, z_user, y_mem);
      else if (z->data != y_mem.get_data_handle())
        copy_parallel(ctx, z->data, y_mem.get_data_handle(), y_md_.get_size());
    }
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, y_mem}};
    if (b) args.emplace(DNNL_ARG_BIAS, memory(b_md_, eng, b->data));
    if (pad_md_.get_size())
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(pad_md_, eng, scratch + pad_off_));
    prim_->execute(s, args);
    if (y_reorder_) y_reorder_->execute(s, y_mem, y_user);
    s.wait();
  }

 private:
  // Tries the caller's layouts for x/y where they are blocked (format `any` for the plain ones,
  // which oneDNN then runs blocked behind reorders), then all-user layouts.
  void init_dnnl(KernelContext& ctx, const TensorView& w) {
    x_user_md_ = activation_desc(x_dims_, x_blocked_, act_);
    y_user_md_ = activation_desc(y_dims_, y_blocked_, act_);
    z_user_md_ = activation_desc(y_dims_, z_blocked_, act_);
    // The primitive reads x in the compute dtype (a float32 x around a bf16 weight is rounded
    // by the reorder into scratch) and writes y in x's dtype.
    const memory::desc x_prim_md = activation_desc(x_dims_, x_blocked_, compute_);
    std::vector<int64_t> wd = w_dims_;
    if (group_ > 1) wd = {group_, w_dims_[0] / group_, w_dims_[1], w_dims_[2], w_dims_[3]};
    w_user_md_ = plain_desc(wd, wt_);
    b_md_ = plain_desc(std::vector<int64_t>{w_dims_[0]}, wt_);
    dnnl::post_ops ops;
    if (has_z_) ops.append_sum(1.0f);
    if (relu_) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    memory::dims strides = to_dnnl(geom_.strides), pad_l = to_dnnl(geom_.pad_begin),
                 pad_r = to_dnnl(geom_.pad_end), dil;
    for (int64_t d : geom_.dilations) dil.push_back(d - 1);  // oneDNN counts the gaps
    auto make = [&](const memory::desc& xm, const memory::desc& ym,
                    dnnl::algorithm alg = dnnl::algorithm::convolution_direct) {
      using dnnl::convolution_forward;
      const auto prop = dnnl::prop_kind::forward_inference;
      const memory::desc wm = any_layout(plain_desc(wd, compute_));
      auto d =
          has_bias_
              ? convolution_forward::desc(prop, alg, xm, wm, b_md_, ym, strides, dil, pad_l, pad_r)
              : convolution_forward::desc(prop, alg, xm, wm, ym, strides, dil, pad_l, pad_r);
      return convolution_forward::primitive_desc(d, attr, cpu_engine());
    };
    // A plain side of a 1x1 kernel stays plain when the other side is too (a straight GEMM,
    // faster than blocked plus reorders); mixed plain/blocked may lack a fast implementation.
    const bool spatial = geom_.kernel_size > 1;
    auto pick = [&](const memory::desc& user, bool blocked, bool other_blocked) {
      return blocked || !(spatial || other_blocked) ? user : any_layout(user);
    };
    ThreadBudget budget(ctx.num_threads());
    std::optional<dnnl::convolution_forward::primitive_desc> pd;
    const dnnl::algorithm requested = requested_conv_algorithm(ctx.node());
    if (requested == dnnl::algorithm::convolution_winograd) {
      try {
        pd = make(pick(x_prim_md, x_blocked_, y_blocked_), pick(y_user_md_, y_blocked_, x_blocked_),
                  requested);
      } catch (const dnnl::error&) {
        // no Winograd kernel for this CPU or shape: direct below
      }
    }
    if (!pd) {
      try {
        pd = make(pick(x_prim_md, x_blocked_, y_blocked_),
                  pick(y_user_md_, y_blocked_, x_blocked_));
      } catch (const dnnl::error&) {
        pd = make(x_prim_md, y_user_md_);  // throws dnnl::error when oneDNN has nothing at all
      }
    }
    const dnnl::engine& eng = cpu_engine();
    x_md_ = pd->src_desc();
    w_md_ = pd->weights_desc();
    y_md_ = pd->dst_desc();
    pad_md_ = pd->scratchpad_desc();
    ScratchPlan plan;
    x_reorder_.reset();
    w_reorder_.reset();
    y_reorder_.reset();
    z_reorder_.reset();
    w_packed_.reset();
    if (x_md_ != x_user_md_) {
      x_reorder_ = Reorder(x_user_md_, x_md_);
      x_off_ = plan.add(x_md_.get_size());
    }
    if (w_md_ != w_user_md_)
      w_reorder_ = Reorder(w_user_md_, w_md_);
    stream_ = dnnl::stream(eng);
    if (ctx.input_is_constant(1) && w.data) {
      // Inference weights never change: pack them once for the whole plan.
      w_packed_ = memory(w_md_, eng);
      memory w_user(w_user_md_, eng, w.data);
      if (w_reorder_)
        w_reorder_->execute(*stream_, w_user, *w_packed_);
      else
        std::memcpy(w_packed_->get_data_handle(), w.data, w_md_.get_size());
      stream_->wait();
    } else if (w_reorder_) {
      w_off_ = plan.add(w_md_.get_size());
    }
    if (y_md_ != y_user_md_) {
      y_reorder_ = Reorder(y_md_, y_user_md_);
      y_off_ = plan.add(y_md_.get_size());
    }
    if (has_z_ && z_user_md_ != y_md_)
      z_reorder_ = Reorder(z_user_md_, y_md_);
    pad_off_ = plan.add(pad_md_.get_size());
    scratch_bytes_ = plan.total();
    prim_ = dnnl::primitive(*pd);
  }

  static void copy_parallel(KernelContext& ctx, const void* from, void* to, size_t bytes) {
    constexpr int64_t kChunk = int64_t{1} << 16;
    const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
    ctx.parallel_for(chunks, 16, [&](int64_t begin, int64_t end) {
      const size_t lo = static_cast<size_t>(begin * kChunk);
      const size_t hi = std::min(bytes, static_cast<size_t>(end * kChunk));
      std::memcpy(static_cast<std::byte*>(to) + lo, static_cast<const std::byte*>(from) + lo,
                  hi - lo);
    });
  }

  std::string where_;
  bool relu_, x_blocked_, y_blocked_, z_blocked_;
  bool has_bias_ = false, has_z_ = false;
  // The activations' (x, y, z), the weight's and bias's, and the primitive's dtypes.
  memory::data_type act_ = memory::data_type::f32, wt_ = memory::data_type::f32,
                    compute_ = memory::data_type::f32;
  int64_t group_ = 1;
  WindowGeom geom_;
  std::vector<int64_t> x_dims_, w_dims_, y_dims_;
  memory::desc x_user_md_, w_user_md_, y_user_md_, z_user_md_, b_md_;
  memory::desc x_md_, w_md_, y_md_, pad_md_;
  std::optional<Reorder> x_reorder_, w_reorder_, y_reorder_, z_reorder_;
  std::optional<memory> w_packed_;
  std::optional<dnnl::primitive> prim_;
  std::optional<dnnl::stream> stream_;
  size_t x_off_ = 0, w_off_ = 0, y_off_ = 0, pad_off_ = 0, scratch_bytes_ = 0;
};

}  // namespace

ONNXTRAIN_REGISTER_OP(nn_fused_conv) {
  OpSchema s;
  s.domain = kOnnxtrainDomain;
  s.op_type = "FusedConv";
  s.infer = infer_fused_conv;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<FusedConvKernel>(n); };
  return s;
}

}  // namespace onnxtrain::ops::nn
