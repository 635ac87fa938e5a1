// ai.onnx.preview.training optimizers (opset 1): Adam, Momentum (standard / Nesterov), Adagrad,
// and ai.onnxtrain.AdamW (decoupled weight decay) in the same multi-tensor layout. Each takes
// (R, T, X_1..X_n, G_1..G_n, S1_1..S1_n, ...) and returns (X_new_1..n, S1_new_1..n, ...): one
// elementwise rule applied to every parameter group, computed in the tensor's own type (float
// tensors in float, vectorized, as PyTorch does; double in double). Outputs may share the
// buffers of X and the states (OpSchema::inplace): the runtime updates training state in place.
// Adam, Momentum and Adagrad are also registered in ai.onnxtrain, where every optimizer takes an
// optional trailing bool scalar `apply` (ops/optim/guard.h): false skips the step, and may write
// each new parameter's bf16 copy too (copy_dtype, ops/optim/copy.h).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/bf16_rows.h"
#include "ops/optim/copy.h"
#include "ops/optim/guard.h"
#include "ops/precision.h"
#include "ops/reduce/reduce_engine.h"
#include "ops/shape_util.h"
#include "ops/simd_clones.h"

namespace onnxtrain::ops::optim {

bool writes_copies(const graph::Node& node) {
  const graph::Attribute* a = node.find_attr(kCopyDtypeAttr);
  if (!a) return false;
  OT_CHECK(a->type == graph::AttrType::kInt &&
               a->i() == static_cast<int64_t>(DataType::kBFloat16),
           node.describe(), ": attribute ", kCopyDtypeAttr, " must be ",
           static_cast<int64_t>(DataType::kBFloat16), " (bfloat16)");
  OT_CHECK(node.domain == kOnnxtrainDomain, node.describe(), ": attribute ", kCopyDtypeAttr,
           " needs the ", kOnnxtrainDomain, " form of the op");
  return true;
}

bool reads_bf16_gradient(const graph::Node& node, DataType x, DataType g, const char* what) {
  if (g == x || g == DataType::kUndefined || x == DataType::kUndefined) return false;
  OT_CHECK(g == DataType::kBFloat16 && x == DataType::kFloat && node.domain == kOnnxtrainDomain,
           node.describe(), ": ", what, " is ", graph::dtype_short_name(g), " but X is ",
           graph::dtype_short_name(x), node.domain == kOnnxtrainDomain
               ? " (G must have X's dtype, or be bfloat16 for a float32 X)"
               : " (G must have X's dtype; the ai.onnxtrain form also reads a bfloat16 G)");
  return true;
}

namespace {

float required_float(const graph::Node& node, const char* name) {
  const graph::Attribute* a = node.find_attr(name);
  OT_CHECK(a && a->type == graph::AttrType::kFloat, node.describe(), ": attribute '", name,
           "' (float) is required");
  return a->f();
}

// Step values shared by every element: the learning rate R and the iteration count T.
struct Step {
  double r = 0;
  int64_t t = 0;
};

// g_reg = norm_coefficient * x + g; v = alpha v + (1 - alpha) g_reg;
// h = beta h + (1 - beta) g_reg^2; x -= r_adj v / (sqrt(h) + eps); x *= 1 - norm_coefficient_post
// with r_adj = r sqrt(1 - beta^T) / (1 - alpha^T) for T > 0, r otherwise.
struct AdamRule {
  static constexpr int kStates = 2;
  double alpha, beta, eps, norm, norm_post, r_adj;
  AdamRule(const graph::Node& node, Step s)
      : alpha(node.attr_float("alpha", 0.9f)),
        beta(node.attr_float("beta", 0.999f)),
        eps(node.attr_float("epsilon", 1e-6f)),
        norm(node.attr_float("norm_coefficient", 0.0f)),
        norm_post(node.attr_float("norm_coefficient_post", 0.0f)),
        r_adj(s.t > 0 ? s.r * std::sqrt(1 - std::pow(beta, static_cast<double>(s.t))) /
                            (1 - std::pow(alpha, static_cast<double>(s.t)))
                      : s.r) {}
  template <typename C>
  void apply(C x, C g, C v, C h, C& x_new, C& v_new, C& h_new) const {
    const C gr = C(norm) * x + g;
    v_new = C(alpha) * v + C(1 - alpha) * gr;
    h_new = C(beta) * h + C(1 - beta) * gr * gr;
    x_new = C(1 - norm_post) * (x - C(r_adj) * (v_new / (std::sqrt(h_new) + C(eps))));
  }
};

// g_reg = norm_coefficient * x + g; v = alpha v + beta_adj g_reg (beta_adj = 1 at T = 0);
// standard: x -= r v; nesterov: x -= r (g_reg + alpha v).
struct MomentumRule {
  static constexpr int kStates = 1;
  double alpha, beta_adj, norm, r;
  bool nesterov;
  MomentumRule(const graph::Node& node, Step s)
      : alpha(required_float(node, "alpha")),
        beta_adj(s.t > 0 ? required_float(node, "beta") : 1.0),
        norm(required_float(node, "norm_coefficient")),
        r(s.r),
        nesterov(mode(node)) {}
  static bool mode(const graph::Node& node) {
    const std::string m = node.attr_string("mode", "");
    OT_CHECK(m == "standard" || m == "nesterov", node.describe(),
             ": mode must be 'standard' or 'nesterov', got '", m, "'");
    return m == "nesterov";
  }
  template <typename C>
  void apply(C x, C g, C v, C& x_new, C& v_new) const {
    const C gr = C(norm) * x + g;
    v_new = C(alpha) * v + C(beta_adj) * gr;
    x_new = x - C(r) * (nesterov ? gr + C(alpha) * v_new : v_new);
  }
};

// r' = r / (1 + T decay_factor); g_reg = norm_coefficient * x + g; h += g_reg^2;
// x -= r' g_reg / (sqrt(h) + eps).
struct AdagradRule {
  static constexpr int kStates = 1;
  double eps, norm, r_adj;
  AdagradRule(const graph::Node& node, Step s)
      : eps(node.attr_float("epsilon", 1e-6f)),
        norm(node.attr_float("norm_coefficient", 0.0f)),
        r_adj(s.r / (1 + static_cast<double>(s.t) * node.attr_float("decay_factor", 0.0f))) {}
  template <typename C>
  void apply(C x, C g, C h, C& x_new, C& h_new) const {
    const C gr = C(norm) * x + g;
    h_new = h + gr * gr;
    x_new = x - C(r_adj) * gr / (std::sqrt(h_new) + C(eps));
  }
};

// ai.onnxtrain.AdamW (Loshchilov & Hutter): the gradient is not regularized; the decay is
// applied to the weight directly, scaled by the learning rate (not by the adaptive step):
// m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// x -= r weight_decay x + r_adj m / (sqrt(v) + eps), r_adj as in AdamRule (T = 1-based step).
// With weight_decay = 0 it equals preview Adam with norm_coefficient = 0 (the same epsilon-hat
// form Keras uses), so Adam and AdamW differ only in where the decay enters.
struct AdamWRule {
  static constexpr int kStates = 2;
  double beta1, beta2, eps, decay, r, r_adj;
  AdamWRule(const graph::Node& node, Step s)
      : beta1(node.attr_float("beta1", 0.9f)),
        beta2(node.attr_float("beta2", 0.999f)),
        eps(node.attr_float("epsilon", 1e-7f)),
        decay(node.attr_float("weight_decay", 0.0f)),
        r(s.r),
        r_adj(s.t > 0 ? s.r * std::sqrt(1 - std::pow(beta2, static_cast<double>(s.t))) /
                            (1 - std::pow(beta1, static_cast<double>(s.t)))
                      : s.r) {}
  template <typename C>
  void apply(C x, C g, C m, C v, C& x_new, C& m_new, C& v_new) const {
    m_new = C(beta1) * m + C(1 - beta1) * g;
    v_new = C(beta2) * v + C(1 - beta2) * g * g;
    x_new = x - C(r * decay) * x - C(r_adj) * (m_new / (std::sqrt(v_new) + C(eps)));
  }
};

// Inputs are R, T, then (2 + kStates) blocks of n tensors; an ai.onnxtrain node may add one
// trailing guard `apply`, recognised by the count: (num_inputs - 2) % (2 + kStates) == 1.
struct Layout {
  int64_t n = 0;        // parameter groups
  int guard_slot = -1;  // input index of `apply`, or -1
  bool copies = false;  // outputs (1 + states) * n + i: group i's new X as bf16 (copy_dtype)
};

Layout layout_of(const graph::Node& node, size_t num_inputs, size_t num_outputs, int states) {
  const auto blocks = static_cast<size_t>(2 + states);
  const bool guarded =
      node.domain == kOnnxtrainDomain && num_inputs > 2 && (num_inputs - 2) % blocks == 1;
  const size_t tensors = num_inputs - (guarded ? 1 : 0);
  OT_CHECK(tensors > 2 && (tensors - 2) % blocks == 0, node.describe(), ": expected 2 + ", blocks,
           " * n inputs (R, T, X, G, states",
           node.domain == kOnnxtrainDomain ? ", optionally a trailing guard 'apply'" : "",
           "), got ", num_inputs);
  const size_t n = (tensors - 2) / blocks;
  const bool copies = writes_copies(node);
  const size_t most = static_cast<size_t>(1 + states + (copies ? 1 : 0)) * n;
  OT_CHECK(num_outputs <= most, node.describe(), ": expected at most ", most, " outputs, got ",
           num_outputs);
  return {static_cast<int64_t>(n), guarded ? static_cast<int>(tensors) : -1, copies};
}

// Input slot of block b (0 = X, 1 = G, 2.. = states) of group i; output block b' (0 = X_new,
// 1.. = new states) of group i reads the type of input block (b' == 0 ? 0 : b' + 1).
size_t input_slot(int64_t n, int block, int64_t i) {
  return static_cast<size_t>(2 + block * n + i);
}
int input_block_of_output(int out_block) {
  return out_block == 0 ? 0 : out_block + 1;
}

template <typename Rule>
void infer_optimizer(InferenceContext& ctx) {
  const size_t outs = ctx.node.outputs().size();
  const Layout l = layout_of(ctx.node, ctx.node.inputs().size(), outs, Rule::kStates);
  const int64_t n = l.n;
  if (l.guard_slot >= 0 && ctx.input_type(static_cast<size_t>(l.guard_slot)))
    check_guard_type(tensor_input(ctx, static_cast<size_t>(l.guard_slot)), ctx.where());
  for (int64_t i = 0; i < n; ++i)
    reads_bf16_gradient(ctx.node, tensor_input(ctx, input_slot(n, 0, i)).dtype,
                        tensor_input(ctx, input_slot(n, 1, i)).dtype, "G");
  for (size_t o = 0; o < outs; ++o) {
    const int out_block = static_cast<int>(static_cast<int64_t>(o) / n);
    const bool copy = out_block == 1 + Rule::kStates;  // copy_dtype's bf16 X_new
    const int block = copy ? 0 : input_block_of_output(out_block);
    const ValueType& t = tensor_input(ctx, input_slot(n, block, static_cast<int64_t>(o) % n));
    if (copy)
      OT_CHECK(t.dtype == DataType::kFloat || t.dtype == DataType::kUndefined, ctx.where(),
               ": ", kCopyDtypeAttr, " needs float32 parameters, X is ",
               graph::dtype_short_name(t.dtype));
    set_output(ctx, o, copy ? DataType::kBFloat16 : t.dtype, t.shape);
  }
}

double scalar_of(const TensorView& v, const std::string& where) {
  OT_CHECK(v.numel() == 1, where, ": R and T must be scalars");
  switch (v.dtype) {
    case DataType::kFloat:
      return *v.as<float>();
    case DataType::kDouble:
      return *v.as<double>();
    case DataType::kInt64:
      return static_cast<double>(*v.as<int64_t>());
    default:
      fail(where, ": R must be float/double and T int64, got ", graph::dtype_short_name(v.dtype));
  }
}

// R: (), T: (), X_i, G_i, S_ji: same dims each -> X_new_i, S_new_ji: dims of X_i
template <typename Rule>
class OptimizerKernel final : public Kernel {
 public:
  explicit OptimizerKernel(const graph::Node& node) : node_(node) {}
  void run(KernelContext& ctx) override {
    constexpr int kS = Rule::kStates;
    const std::string where = node_.describe();
    const Layout l = layout_of(node_, static_cast<size_t>(ctx.num_inputs()),
                               static_cast<size_t>(ctx.num_outputs()), kS);
    const int64_t n = l.n;
    OT_CHECK(ctx.input(0) && ctx.input(1), where, ": R and T are required");
    Step step{scalar_of(*ctx.input(0), where),
              static_cast<int64_t>(scalar_of(*ctx.input(1), where))};
    const Rule rule(node_, step);
    const bool apply = guard_allows(l.guard_slot >= 0 ? ctx.input(l.guard_slot) : nullptr, where);
    for (int64_t i = 0; i < n; ++i) {
      const TensorView* in[2 + kS];
      for (int b = 0; b < 2 + kS; ++b)
        in[b] = ctx.input(static_cast<int>(input_slot(n, b, i)));
      OT_CHECK(in[0] && in[1], where, ": X and G of group ", i, " are required");
      // A bf16 G of a float32 X is widened row by row as the update reads it.
      const bool g16 = reads_bf16_gradient(node_, in[0]->dtype, in[1]->dtype, "G");
      for (int b = 0; b < 2 + kS; ++b)
        OT_CHECK(in[b] && in[b]->dims == in[0]->dims &&
                     (in[b]->dtype == in[0]->dtype || (b == 1 && g16)),
                 where, ": X, G and state tensors of group ", i, " must have one shape and type");
      TensorView* out[1 + kS];
      for (int b = 0; b < 1 + kS; ++b) {
        const int slot = static_cast<int>(b * n + i);
        out[b] = ctx.has_output(slot) ? &ctx.output(slot, in[0]->dims) : nullptr;
      }
      const int copy_slot = static_cast<int>((1 + kS) * n + i);
      uint16_t* copy = nullptr;
      if (l.copies && copy_slot < ctx.num_outputs() && ctx.has_output(copy_slot)) {
        OT_CHECK(in[0]->dtype == DataType::kFloat, where, ": ", kCopyDtypeAttr,
                 " needs float32 parameters, X is ", graph::dtype_short_name(in[0]->dtype));
        copy = static_cast<uint16_t*>(ctx.output(copy_slot, in[0]->dims).data);
      }
      if (!apply) {
        for (int b = 0; b < 1 + kS; ++b) copy_through(*in[input_block_of_output(b)], out[b], ctx);
        if (copy)
          round_to_bf16(static_cast<const float*>(in[0]->data), copy, in[0]->numel(), ctx);
        continue;
      }
      reduce::dispatch<reduce::FloatTypes>(in[0]->dtype, where, [&]<typename T>() {
        update<T>(rule, in, out, g16 ? static_cast<const uint16_t*>(in[1]->data) : nullptr, copy,
                  in[0]->numel(), ctx);
      });
    }
  }

 private:
  // g16: G as bf16 bits (float32 X only; in[1] is then not read as T), or nullptr.
  // copy: X_new rounded to bf16 (float32 X only), or nullptr.
  template <typename T>
  static void update(const Rule& rule, const TensorView* const* in, TensorView* const* out,
                     const uint16_t* g16, uint16_t* copy, int64_t count,
                     const KernelContext& ctx) {
    constexpr int kS = Rule::kStates;
    // Raw pointers hoisted out of the loop: reloading TensorView::data on every element (a store
    // might alias it, as far as the compiler knows) kept the loop scalar. An output the graph
    // does not read goes to a scratch row, so the loop has no branch.
    const T* src[2 + kS];
    for (int b = 0; b < 2 + kS; ++b) src[b] = b == 1 && g16 ? nullptr : in[b]->as<T>();
    T* dst[1 + kS];
    for (int b = 0; b < 1 + kS; ++b) dst[b] = out[b] ? out[b]->as<T>() : nullptr;
    ctx.parallel_for(count, 4096, [&](int64_t begin, int64_t end) {
      constexpr int64_t kRow = 256;
      T sink[kRow];
      T wide[kRow];  // the row of a bf16 G, widened
      for (int64_t r = begin; r < end; r += kRow) {
        const int64_t n = std::min(kRow, end - r);
        T* o[1 + kS];
        for (int b = 0; b < 1 + kS; ++b) o[b] = dst[b] ? dst[b] + r : sink;
        const T* x = src[0] + r;
        const T* g = src[1] ? src[1] + r : wide;
        if constexpr (std::is_same_v<T, float>)
          if (g16) widen_row_from_bf16(g16 + r, wide, n);
        const T* st[kS];
        for (int j = 0; j < kS; ++j) st[j] = src[2 + j] + r;
        if constexpr (kS == 1) {
          update_row(rule, n, x, g, st[0], o[0], o[1]);
        } else {
          static_assert(kS == 2);
          update_row(rule, n, x, g, st[0], st[1], o[0], o[1], o[2]);
        }
        // The row of X_new is in L1: its bf16 copy costs the copy's bytes only.
        if constexpr (std::is_same_v<T, float>)
          if (copy) round_row_to_bf16(o[0], copy + r, n);
      }
    });
  }

  // One row of the update, in the CPU's widest vectors (ops/simd_clones.h). Every input element
  // is read before the outputs at the same index are written, so an output may be the buffer of
  // X or of its state (in-place update); that exact overlap is also safe for SIMD, which `omp
  // simd` asserts (GCC's own overlap check would fall back to scalar code).
  template <typename T>
  OT_SIMD_CLONES static void update_row(const Rule& rule, int64_t n, const T* x, const T* g,
                                        const T* s0, T* o0, T* o1) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      T x_new, s0_new;
      rule.apply(x[k], g[k], s0[k], x_new, s0_new);
      o0[k] = x_new;
      o1[k] = s0_new;
    }
  }
  template <typename T>
  OT_SIMD_CLONES static void update_row(const Rule& rule, int64_t n, const T* x, const T* g,
                                        const T* s0, const T* s1, T* o0, T* o1, T* o2) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) {
      T x_new, s0_new, s1_new;
      rule.apply(x[k], g[k], s0[k], s1[k], x_new, s0_new, s1_new);
      o0[k] = x_new;
      o1[k] = s0_new;
      o2[k] = s1_new;
    }
  }
  const graph::Node& node_;
};

template <typename Rule>
OpSchema optimizer_schema(const char* op_type, const char* domain = kPreviewTrainingDomain) {
  OpSchema s;
  s.domain = domain;
  s.op_type = op_type;
  s.since_version = 1;
  s.infer = infer_optimizer<Rule>;
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<OptimizerKernel<Rule>>(n); };
  // Parameters and states are often initializers the trainer rebinds every step: never fold.
  s.foldable = false;
  // Output block b (X_new, S1_new, ...) of group i may overwrite input block (0, 2, 3, ...).
  // A copy (copy_dtype) has no input to overwrite.
  s.inplace = [](const graph::Node& node, int output) {
    const int64_t n = layout_of(node, node.inputs().size(), node.outputs().size(), Rule::kStates).n;
    const int out_block = static_cast<int>(output / n);
    if (out_block > Rule::kStates) return -1;
    const int block = input_block_of_output(out_block);
    return static_cast<int>(input_slot(n, block, output % n));
  };
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(adam) {
  return optimizer_schema<AdamRule>("Adam");
}
ONNXTRAIN_REGISTER_OP(momentum) {
  return optimizer_schema<MomentumRule>("Momentum");
}
ONNXTRAIN_REGISTER_OP(adagrad) {
  return optimizer_schema<AdagradRule>("Adagrad");
}
// The same rules in ai.onnxtrain, where they also take the guard input.
ONNXTRAIN_REGISTER_OP(onnxtrain_adam) {
  return optimizer_schema<AdamRule>("Adam", kOnnxtrainDomain);
}
ONNXTRAIN_REGISTER_OP(onnxtrain_momentum) {
  return optimizer_schema<MomentumRule>("Momentum", kOnnxtrainDomain);
}
ONNXTRAIN_REGISTER_OP(onnxtrain_adagrad) {
  return optimizer_schema<AdagradRule>("Adagrad", kOnnxtrainDomain);
}
ONNXTRAIN_REGISTER_OP(adamw) {
  return optimizer_schema<AdamWRule>("AdamW", kOnnxtrainDomain);
}

}  // namespace onnxtrain::ops::optim
