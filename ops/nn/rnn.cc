// LSTM, GRU and RNN (opsets 7, 14) and their gradients, ai.onnxtrain LSTMGrad / GRUGrad /
// RNNGrad, with the default activations only. LSTM gates i, o, f, c as ONNX writes W / R / B;
// its forward also takes peepholes, clip and input_forget, which the gradient refuses (torch
// exports none of the three). GRU gates z, r, h; its gradient needs linear_before_reset = 1, as
// torch exports it. Clip only in the forwards. sequence_lens must be absent or all equal the
// sequence length. A gradient recomputes the forward's gates (no extra outputs on the forward
// node), then runs backpropagation through time. Matrix products: oneDNN's sgemm for float32, a
// plain loop for float64 (gradient checks).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "ops/elementwise/dtypes.h"
#include "ops/nn/nn_util.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"

namespace onnxtrain::ops::nn {
namespace {

struct LstmAttrs {
  int64_t hidden = 0;
  int dirs = 1;
  bool reverse = false;  // direction "reverse" (one direction running backwards in time)
  bool layout1 = false;  // layout 1: batch first
  double clip = 0;       // 0: none
  bool input_forget = false;
};

// `gates`: 4 (LSTM: activations Sigmoid, Tanh, Tanh), 3 (GRU: Sigmoid, Tanh) or 1 (RNN: Tanh).
LstmAttrs rnn_attrs(const graph::Node& node, const std::string& where, int gates) {
  LstmAttrs a;
  a.hidden = node.attr_int("hidden_size", 0);
  OT_CHECK(a.hidden > 0, where, ": attribute hidden_size is required (> 0)");
  const std::string dir = node.attr_string("direction", "forward");
  OT_CHECK(dir == "forward" || dir == "reverse" || dir == "bidirectional", where,
           ": direction must be forward, reverse or bidirectional, got '", dir, "'");
  a.dirs = dir == "bidirectional" ? 2 : 1;
  a.reverse = dir == "reverse";
  a.layout1 = node.attr_int("layout", 0) != 0;
  a.clip = node.attr_float("clip", 0.0f);
  a.input_forget = node.attr_int("input_forget", 0) != 0;
  if (const graph::Attribute* acts = node.find_attr("activations")) {
    const std::vector<std::string> defaults =
        gates == 4   ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
        : gates == 3 ? std::vector<std::string>{"Sigmoid", "Tanh"}
                     : std::vector<std::string>{"Tanh"};
    std::string names;
    for (const std::string& d : defaults) names += (names.empty() ? "" : ", ") + d;
    for (size_t k = 0; k < acts->strings().size(); ++k)
      OT_CHECK(acts->strings()[k] == defaults[k % defaults.size()], where, ": activation '",
               acts->strings()[k], "' is not supported (only the defaults, ", names, ")");
  }
  return a;
}

LstmAttrs lstm_attrs(const graph::Node& node, const std::string& where) {
  return rnn_attrs(node, where, 4);
}

// C[m, n] (+)= sum_k A[m, k] B[n, k] (B transposed), or with `a_t` A[k, m]; row-major, C
// overwritten when !accumulate.
template <typename T>
void gemm(bool a_t, int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate,
          const KernelContext& ctx) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    ThreadBudget budget(ctx.num_threads());
    OT_CHECK(dnnl_sgemm(a_t ? 'T' : 'N', 'T', m, n, k, 1.0f, a, a_t ? m : k, b, k,
                        accumulate ? 1.0f : 0.0f, c, n) == dnnl_success,
             "LSTM: oneDNN sgemm failed");
  } else {
    ctx.parallel_for(m, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        for (int64_t j = 0; j < n; ++j) {
          T acc = accumulate ? c[i * n + j] : T{0};
          for (int64_t q = 0; q < k; ++q) acc += (a_t ? a[q * m + i] : a[i * k + q]) * b[j * k + q];
          c[i * n + j] = acc;
        }
    });
  }
}

// C[m, n] (+)= A[m, k] B[k, n] (B not transposed).
template <typename T>
void gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate,
             const KernelContext& ctx) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    ThreadBudget budget(ctx.num_threads());
    OT_CHECK(dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, k, b, n, accumulate ? 1.0f : 0.0f, c, n) ==
                 dnnl_success,
             "LSTM: oneDNN sgemm failed");
  } else {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T acc = accumulate ? c[i * n + j] : T{0};
        for (int64_t q = 0; q < k; ++q) acc += a[i * k + q] * b[q * n + j];
        c[i * n + j] = acc;
      }
  }
}

template <typename T>
T sigmoid(T x) {
  return T{1} / (T{1} + std::exp(-x));
}

// The shapes every LSTM kernel checks: X (T, N, I) or (N, T, I), W (D, 4H, I), R (D, 4H, H),
// B (D, 8H), initial_h / initial_c (D, N, H) or (N, D, H), P (D, 3H).
struct LstmShape {
  int64_t steps = 0, batch = 0, input = 0;
};

LstmShape rnn_shape(const LstmAttrs& a, int gates, const TensorView& x, const TensorView& w,
                    const TensorView& r, const TensorView* b, const TensorView* h0,
                    const TensorView* c0, const TensorView* p, const TensorView* lens,
                    const std::string& where) {
  OT_CHECK(x.rank() == 3, where, ": X must have rank 3, got ", x.rank());
  LstmShape s;
  s.steps = a.layout1 ? x.dims[1] : x.dims[0];
  s.batch = a.layout1 ? x.dims[0] : x.dims[1];
  s.input = x.dims[2];
  const int64_t h = a.hidden, d = a.dirs;
  auto expect = [&](const TensorView* t, std::vector<int64_t> dims, const char* name) {
    if (!t) return;
    OT_CHECK(t->dims == dims && t->dtype == x.dtype, where, ": ", name, " must be ",
             graph::dtype_short_name(x.dtype), " (", join_dims(dims), "), got ",
             graph::dtype_short_name(t->dtype), " (", join_dims(t->dims), ")");
  };
  expect(&w, {d, gates * h, s.input}, "W");
  expect(&r, {d, gates * h, h}, "R");
  expect(b, {d, 2 * gates * h}, "B");
  const std::vector<int64_t> state =
      a.layout1 ? std::vector<int64_t>{s.batch, d, h} : std::vector<int64_t>{d, s.batch, h};
  expect(h0, state, "initial_h");
  expect(c0, state, "initial_c");
  expect(p, {d, 3 * h}, "P");
  if (lens) {
    const std::vector<int64_t> v = shape::view_ints(*lens, where);
    OT_CHECK(static_cast<int64_t>(v.size()) == s.batch &&
                 std::all_of(v.begin(), v.end(), [&](int64_t n) { return n == s.steps; }),
             where, ": sequence_lens other than the full length ", s.steps,
             " for every sequence are not supported");
  }
  return s;
}

// X and the initial states in layout 0 (a copy from layout 1).
template <typename T>
std::vector<T> time_major(const TensorView* t, int64_t outer, int64_t inner, int64_t row,
                          bool layout1) {
  std::vector<T> out(static_cast<size_t>(outer * inner * row), T{0});
  if (!t) return out;
  const T* src = t->as<T>();
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t b = 0; b < inner; ++b)
      std::copy_n(src + (layout1 ? (b * outer + a) : (a * inner + b)) * row, row,
                  out.data() + (a * inner + b) * row);
  return out;
}

// Y (T, D, N, H) computed in layout 0 -> output 0 in the node's layout.
template <typename T>
void write_y(KernelContext& ctx, const LstmAttrs& a, const LstmShape& s, const std::vector<T>& y) {
  if (ctx.num_outputs() == 0 || !ctx.has_output(0)) return;
  const int64_t T_ = s.steps, D = a.dirs, N = s.batch, H = a.hidden;
  T* o = ctx.output(0, a.layout1 ? std::vector<int64_t>{N, T_, D, H}
                                 : std::vector<int64_t>{T_, D, N, H})
             .template as<T>();
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t n = 0; n < N; ++n)
        std::copy_n(y.data() + ((t * D + d) * N + n) * H, H,
                    o + (a.layout1 ? ((n * T_ + t) * D + d) : ((t * D + d) * N + n)) * H);
}

// dY in the node's layout (absent: zeros) -> (T, D, N, H).
template <typename T>
std::vector<T> read_y(const TensorView* dy, const LstmAttrs& a, const LstmShape& s) {
  const int64_t T_ = s.steps, D = a.dirs, N = s.batch, H = a.hidden;
  std::vector<T> out(static_cast<size_t>(T_ * D * N * H), T{0});
  if (!dy) return out;
  const T* src = dy->as<T>();
  for (int64_t t = 0; t < T_; ++t)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t n = 0; n < N; ++n)
        std::copy_n(src + (a.layout1 ? ((n * T_ + t) * D + d) : ((t * D + d) * N + n)) * H, H,
                    out.data() + ((t * D + d) * N + n) * H);
  return out;
}

// A state (D, N, H) -> output i in the node's layout.
template <typename T>
void write_state(KernelContext& ctx, int i, const LstmAttrs& a, const LstmShape& s,
                 const std::vector<T>& v) {
  if (ctx.num_outputs() <= i || !ctx.has_output(i)) return;
  const int64_t D = a.dirs, N = s.batch, H = a.hidden;
  T* o = ctx.output(i, a.layout1 ? std::vector<int64_t>{N, D, H} : std::vector<int64_t>{D, N, H})
             .template as<T>();
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n)
      std::copy_n(v.data() + (d * N + n) * H, H, o + (a.layout1 ? n * D + d : d * N + n) * H);
}

// dX (T, N, I) -> output 0 in X's layout.
template <typename T>
void write_dx(KernelContext& ctx, const LstmAttrs& a, const LstmShape& s,
              const std::vector<int64_t>& x_dims, const std::vector<T>& dx) {
  if (ctx.num_outputs() == 0 || !ctx.has_output(0)) return;
  T* o = ctx.output(0, x_dims).template as<T>();
  for (int64_t t = 0; t < s.steps; ++t)
    for (int64_t n = 0; n < s.batch; ++n)
      std::copy_n(dx.data() + (t * s.batch + n) * s.input, s.input,
                  o + (a.layout1 ? n * s.steps + t : t * s.batch + n) * s.input);
}

// out[g, q] += sum_n a[n, g] v[n, q]: (G x Q) += A^T V for A (N x G), V (N x Q).
template <typename T>
void accumulate_outer(int64_t g, int64_t q, int64_t n, const T* a, const T* v, T* out,
                      const KernelContext& ctx) {
  if constexpr (std::is_same_v<T, float>) {
    ThreadBudget budget(ctx.num_threads());
    OT_CHECK(dnnl_sgemm('T', 'N', g, q, n, 1.0f, a, g, v, q, 1.0f, out, q) == dnnl_success,
             "RNN: oneDNN sgemm failed");
  } else {
    for (int64_t i = 0; i < g; ++i)
      for (int64_t j = 0; j < q; ++j) {
        T acc = out[i * q + j];
        for (int64_t k = 0; k < n; ++k) acc += a[k * g + i] * v[k * q + j];
        out[i * q + j] = acc;
      }
  }
}

// One direction's forward over all steps. xw: (T*N, 4H) = X W^T + Wb + Rb (filled here); h, c:
// (N, H) initial states in, final states out. Per step (in run order) `record` receives the
// step's time index, gates (N, 4H: i, o, f, g after activation), c_prev and c_new.
template <typename T, typename Record>
void lstm_direction(const LstmAttrs& a, const LstmShape& s, const T* x, const T* w, const T* r,
                    const T* b, const T* p, bool backwards, std::vector<T>& h, std::vector<T>& c,
                    T* y, int64_t y_stride, const KernelContext& ctx, Record&& record) {
  const int64_t H = a.hidden, N = s.batch, G = 4 * H;
  std::vector<T> xw(static_cast<size_t>(s.steps * N * G));
  gemm<T>(false, s.steps * N, G, s.input, x, w, xw.data(), false, ctx);
  if (b)
    for (int64_t row = 0; row < s.steps * N; ++row)
      for (int64_t j = 0; j < G; ++j) xw[row * G + j] += b[j] + b[G + j];
  std::vector<T> gates(static_cast<size_t>(N * G)), c_prev(c.size());
  const T clip = static_cast<T>(a.clip);
  auto clipped = [&](T v) { return clip > 0 ? std::clamp(v, -clip, clip) : v; };
  for (int64_t k = 0; k < s.steps; ++k) {
    const int64_t t = backwards ? s.steps - 1 - k : k;
    std::copy_n(xw.data() + t * N * G, N * G, gates.data());
    gemm<T>(false, N, G, H, h.data(), r, gates.data(), true, ctx);
    c_prev = c;
    for (int64_t n = 0; n < N; ++n) {
      T* g = gates.data() + n * G;
      for (int64_t j = 0; j < H; ++j) {
        const T cp = c_prev[n * H + j];
        const T i = sigmoid(clipped(g[j] + (p ? p[j] * cp : T{0})));
        const T f = a.input_forget
                        ? T{1} - i
                        : sigmoid(clipped(g[2 * H + j] + (p ? p[2 * H + j] * cp : T{0})));
        const T cand = std::tanh(clipped(g[3 * H + j]));
        const T cn = f * cp + i * cand;
        const T o = sigmoid(clipped(g[H + j] + (p ? p[H + j] * cn : T{0})));
        g[j] = i;
        g[H + j] = o;
        g[2 * H + j] = f;
        g[3 * H + j] = cand;
        c[n * H + j] = cn;
        h[n * H + j] = o * std::tanh(cn);
      }
    }
    if (y)
      for (int64_t n = 0; n < N; ++n) std::copy_n(h.data() + n * H, H, y + t * y_stride + n * H);
    record(t, gates, c_prev, c);
  }
}

// X, W, R, [B, sequence_lens, initial_h, initial_c, P] -> [Y, Y_h, Y_c]
class LstmKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const LstmAttrs a = lstm_attrs(ctx.node(), where);
    const TensorView& x = *ctx.input(0);
    OT_CHECK(ctx.input(1) && ctx.input(2), where, ": inputs W and R are required");
    const TensorView *b = ctx.input(3), *h0 = ctx.input(5), *c0 = ctx.input(6), *p = ctx.input(7);
    const LstmShape s =
        rnn_shape(a, 4, x, *ctx.input(1), *ctx.input(2), b, h0, c0, p, ctx.input(4), where);
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps;
    ew::dispatch(ew::FloatTypes{}, x.dtype, where, [&]<typename T>(ew::Tag<T>) {
      const std::vector<T> xs = time_major<T>(&x, T_, N, s.input, a.layout1);
      const std::vector<T> hs = time_major<T>(h0, D, N, H, a.layout1);
      const std::vector<T> cs = time_major<T>(c0, D, N, H, a.layout1);
      std::vector<T> y(static_cast<size_t>(T_ * D * N * H)), yh(hs.size()), yc(cs.size());
      for (int d = 0; d < D; ++d) {
        std::vector<T> h(hs.begin() + d * N * H, hs.begin() + (d + 1) * N * H);
        std::vector<T> c(cs.begin() + d * N * H, cs.begin() + (d + 1) * N * H);
        const int64_t G = 4 * H;
        lstm_direction<T>(a, s, xs.data(), ctx.input(1)->as<T>() + d * G * s.input,
                          ctx.input(2)->as<T>() + d * G * H, b ? b->as<T>() + d * 2 * G : nullptr,
                          p ? p->as<T>() + d * 3 * H : nullptr, a.reverse || d == 1, h, c,
                          y.data() + d * N * H, D * N * H, ctx,
                          [](int64_t, const auto&, const auto&, const auto&) {});
        std::copy(h.begin(), h.end(), yh.begin() + d * N * H);
        std::copy(c.begin(), c.end(), yc.begin() + d * N * H);
      }
      write_y<T>(ctx, a, s, y);
      write_state<T>(ctx, 1, a, s, yh);
      write_state<T>(ctx, 2, a, s, yc);
    });
  }
};

// X (T, N, I) or (N, T, I) -> Y (T, D, N, H) or (N, T, D, H), then the states (D, N, H) or
// (N, D, H). `gates`: 4 (LSTM) or 3 (GRU).
template <int gates>
void infer_rnn(InferenceContext& ctx) {
  const ValueType& x = tensor_input(ctx, 0);
  const LstmAttrs a = rnn_attrs(ctx.node, ctx.where(), gates);
  std::optional<Shape> y, state;
  if (x.shape && x.shape->size() == 3) {
    const Dim t = (*x.shape)[a.layout1 ? 1 : 0], n = (*x.shape)[a.layout1 ? 0 : 1];
    const Dim d = Dim::known(a.dirs), h = Dim::known(a.hidden);
    y = a.layout1 ? Shape{n, t, d, h} : Shape{t, d, n, h};
    state = a.layout1 ? Shape{n, d, h} : Shape{d, n, h};
  }
  for (size_t i = 0; i < ctx.node.outputs().size(); ++i)
    set_output(ctx, i, x.dtype, i == 0 ? y : state);
}

// A gradient op's outputs are shaped like its inputs from `first` on (X, W, R, B, states); an
// output whose input is absent is never written (X's dtype, no shape).
template <size_t first>
void infer_rnn_grad(InferenceContext& ctx) {
  for (size_t i = 0; i < ctx.node.outputs().size(); ++i) {
    if (ctx.input_type(i + first))
      propagate_type(ctx, i, i + first);
    else
      set_output(ctx, i, tensor_input(ctx, first).dtype, std::nullopt);
  }
}

// ---- gradient

// dY, dY_h, dY_c (each optional), X, W, R, [B, initial_h, initial_c] with the forward's
// attributes -> dX, dW, dR, dB, d initial_h, d initial_c.
class LstmGradKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const LstmAttrs a = lstm_attrs(ctx.node(), where);
    OT_CHECK(a.clip == 0 && !a.input_forget, where,
             ": the LSTM gradient does not support clip or input_forget");
    const TensorView *dy = ctx.input(0), *dyh = ctx.input(1), *dyc = ctx.input(2);
    const TensorView& x = *ctx.input(3);
    const TensorView& w = *ctx.input(4);
    const TensorView& r = *ctx.input(5);
    const TensorView *b = ctx.input(6), *h0 = ctx.input(7), *c0 = ctx.input(8);
    const LstmShape s = rnn_shape(a, 4, x, w, r, b, h0, c0, nullptr, nullptr, where);
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps, G = 4 * H, I = s.input;
    ew::dispatch(ew::FloatTypes{}, x.dtype, where, [&]<typename T>(ew::Tag<T>) {
      const std::vector<T> xs = time_major<T>(&x, T_, N, I, a.layout1);
      const std::vector<T> hs = time_major<T>(h0, D, N, H, a.layout1);
      const std::vector<T> cs = time_major<T>(c0, D, N, H, a.layout1);
      const std::vector<T> gy = read_y<T>(dy, a, s);
      const std::vector<T> gh = time_major<T>(dyh, D, N, H, a.layout1);
      const std::vector<T> gc = time_major<T>(dyc, D, N, H, a.layout1);
      std::vector<T> dx(xs.size(), T{0}), dw(static_cast<size_t>(w.numel()), T{0}),
          dr(static_cast<size_t>(r.numel()), T{0}), db(static_cast<size_t>(D * 2 * G), T{0}),
          dh0(hs.size()), dc0(cs.size());
      for (int d = 0; d < D; ++d) {
        const T* wd = w.as<T>() + d * G * I;
        const T* rd = r.as<T>() + d * G * H;
        const bool backwards = a.reverse || d == 1;
        // Forward again, keeping each step's gates, c_prev, c and h_prev (by time index).
        std::vector<T> gates(static_cast<size_t>(T_ * N * G)),
            cprev(static_cast<size_t>(T_ * N * H)), cnew(cprev.size()), hprev(cprev.size());
        std::vector<T> h(hs.begin() + d * N * H, hs.begin() + (d + 1) * N * H);
        std::vector<T> c(cs.begin() + d * N * H, cs.begin() + (d + 1) * N * H);
        std::vector<T> h_before = h;
        lstm_direction<T>(a, s, xs.data(), wd, rd, b ? b->as<T>() + d * 2 * G : nullptr, nullptr,
                          backwards, h, c, nullptr, 0, ctx,
                          [&](int64_t t, const std::vector<T>& g, const std::vector<T>& cp,
                              const std::vector<T>& cn) {
                            std::copy(g.begin(), g.end(), gates.begin() + t * N * G);
                            std::copy(cp.begin(), cp.end(), cprev.begin() + t * N * H);
                            std::copy(cn.begin(), cn.end(), cnew.begin() + t * N * H);
                            std::copy(h_before.begin(), h_before.end(), hprev.begin() + t * N * H);
                            // h after this step is the next step's h_prev.
                            for (int64_t e = 0; e < N * H; ++e) {
                              const int64_t j = e % H, n = e / H;
                              h_before[e] = g[n * G + H + j] * std::tanh(cn[e]);
                            }
                          });
        // Backpropagation through time, last run step first.
        std::vector<T> dh(gh.begin() + d * N * H, gh.begin() + (d + 1) * N * H);
        std::vector<T> dc(gc.begin() + d * N * H, gc.begin() + (d + 1) * N * H);
        std::vector<T> da(static_cast<size_t>(N * G)), dh_prev(static_cast<size_t>(N * H));
        T* dwd = dw.data() + d * G * I;
        T* drd = dr.data() + d * G * H;
        for (int64_t k = T_ - 1; k >= 0; --k) {
          const int64_t t = backwards ? T_ - 1 - k : k;
          const T* g = gates.data() + t * N * G;
          for (int64_t n = 0; n < N; ++n)
            for (int64_t j = 0; j < H; ++j) {
              const int64_t e = n * H + j;
              const T i = g[n * G + j], o = g[n * G + H + j], f = g[n * G + 2 * H + j],
                      cand = g[n * G + 3 * H + j];
              const T cn = cnew[t * N * H + e], cp = cprev[t * N * H + e];
              const T hgrad = dh[e] + gy[((t * D + d) * N + n) * H + j];
              const T tc = std::tanh(cn);
              const T dcn = dc[e] + hgrad * o * (T{1} - tc * tc);
              T* dag = da.data() + n * G;
              dag[j] = dcn * cand * i * (T{1} - i);
              dag[H + j] = hgrad * tc * o * (T{1} - o);
              dag[2 * H + j] = dcn * cp * f * (T{1} - f);
              dag[3 * H + j] = dcn * i * (T{1} - cand * cand);
              dc[e] = dcn * f;
            }
          // dX_t = dA W, dW += dA^T X_t, dR += dA^T h_prev, dB, dh_prev = dA R.
          gemm_nn<T>(N, I, G, da.data(), wd, dx.data() + t * N * I, true, ctx);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t q = 0; q < G; ++q) {
              const T v = da[n * G + q];
              db[d * 2 * G + q] += v;
              db[d * 2 * G + G + q] += v;
            }
          gemm_nn<T>(N, H, G, da.data(), rd, dh_prev.data(), false, ctx);
          accumulate_outer<T>(G, I, N, da.data(), xs.data() + t * N * I, dwd, ctx);
          accumulate_outer<T>(G, H, N, da.data(), hprev.data() + t * N * H, drd, ctx);
          dh = dh_prev;
        }
        std::copy(dh.begin(), dh.end(), dh0.begin() + d * N * H);
        std::copy(dc.begin(), dc.end(), dc0.begin() + d * N * H);
      }
      auto put = [&](int i, const std::vector<T>& v, std::vector<int64_t> dims) {
        if (ctx.num_outputs() <= i || !ctx.has_output(i)) return;
        std::copy(v.begin(), v.end(), ctx.output(i, dims).template as<T>());
      };
      write_dx<T>(ctx, a, s, x.dims, dx);
      put(1, dw, w.dims);
      put(2, dr, r.dims);
      if (b) put(3, db, b->dims);
      if (h0) write_state<T>(ctx, 4, a, s, dh0);
      if (c0) write_state<T>(ctx, 5, a, s, dc0);
    });
  }
};

void lstm_gradient(GradientBuilder& b) {
  const graph::Node& n = b.node();
  OT_CHECK(!n.input(4) || n.inputs().size() <= 4, n.describe(),
           ": the LSTM gradient does not support sequence_lens");
  OT_CHECK(n.inputs().size() <= 7 || !n.input(7), n.describe(),
           ": the LSTM gradient does not support peepholes (P)");
  const LstmAttrs a = lstm_attrs(n, n.describe());
  OT_CHECK(a.clip == 0 && !a.input_forget, n.describe(),
           ": the LSTM gradient does not support clip or input_forget");
  auto in = [&](int i) { return i < b.num_inputs() ? b.input(i) : nullptr; };
  auto og = [&](int i) { return i < b.num_outputs() ? b.output_grad(i) : nullptr; };
  std::vector<graph::Value*> inputs{og(0), og(1), og(2), in(0), in(1), in(2), in(3), in(5), in(6)};
  std::vector<graph::Value*> grads = b.emit("LSTMGrad", inputs, 6, n.attributes, kOnnxtrainDomain);
  const int forward_slot[6] = {0, 1, 2, 3, 5, 6};
  for (int k = 0; k < 6; ++k)
    if (in(forward_slot[k]) && b.needs_input_grad(forward_slot[k]))
      b.set_input_grad(forward_slot[k], grads[static_cast<size_t>(k)]);
}

// ---- GRU (opsets 7, 14): gates z, r, h. With linear_before_reset (torch's GRU):
//   h~ = tanh(X Wh^T + Wbh + r (.) (H_prev Rh^T + Rbh)), else tanh(X Wh^T + Wbh + (r (.) H_prev)
//   Rh^T + Rbh); H = (1 - z) (.) h~ + z (.) H_prev. The gradient takes linear_before_reset = 1.

// One direction's forward. Per run step, `record(t, gates, hr, h_prev)` gets the step's time
// index, its gates (N, 3H: z, r, h~ after activation), hr = H_prev Rh^T + Rbh (N, H; with
// linear_before_reset) and H_prev.
template <typename T, typename Record>
void gru_direction(const LstmAttrs& a, bool lbr, const LstmShape& s, const T* x, const T* w,
                   const T* r, const T* b, bool backwards, std::vector<T>& h, T* y,
                   int64_t y_stride, const KernelContext& ctx, Record&& record) {
  const int64_t H = a.hidden, N = s.batch, G = 3 * H;
  std::vector<T> xw(static_cast<size_t>(s.steps * N * G));
  gemm<T>(false, s.steps * N, G, s.input, x, w, xw.data(), false, ctx);
  if (b)
    for (int64_t row = 0; row < s.steps * N; ++row)
      for (int64_t j = 0; j < G; ++j) xw[row * G + j] += b[j] + (j < 2 * H ? b[G + j] : T{0});
  const T* rbh = b ? b + G + 2 * H : nullptr;
  std::vector<T> gates(static_cast<size_t>(N * G)), hr(static_cast<size_t>(N * H)),
      rh(static_cast<size_t>(N * H)), h_prev(h.size()), zr(static_cast<size_t>(N * 2 * H));
  const T clip = static_cast<T>(a.clip);
  auto clipped = [&](T v) { return clip > 0 ? std::clamp(v, -clip, clip) : v; };
  for (int64_t k = 0; k < s.steps; ++k) {
    const int64_t t = backwards ? s.steps - 1 - k : k;
    h_prev = h;
    std::copy_n(xw.data() + t * N * G, N * G, gates.data());
    // z and r: + H_prev [Rz; Rr]^T.
    gemm<T>(false, N, 2 * H, H, h_prev.data(), r, zr.data(), false, ctx);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < 2 * H; ++j) gates[n * G + j] += zr[n * 2 * H + j];
    for (int64_t e = 0; e < N * 2 * H; ++e) {
      const int64_t n = e / (2 * H), j = e % (2 * H);
      gates[n * G + j] = sigmoid(clipped(gates[n * G + j]));
    }
    if (lbr) {  // hr = H_prev Rh^T + Rbh; h~ = tanh(xw_h + r hr)
      gemm<T>(false, N, H, H, h_prev.data(), r + 2 * H * H, hr.data(), false, ctx);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < H; ++j) {
          const int64_t e = n * H + j;
          if (rbh) hr[e] += rbh[j];
          T& g = gates[n * G + 2 * H + j];
          g = std::tanh(clipped(g + gates[n * G + H + j] * hr[e]));
        }
    } else {  // h~ = tanh(xw_h + (r H_prev) Rh^T + Rbh)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < H; ++j) rh[n * H + j] = gates[n * G + H + j] * h_prev[n * H + j];
      gemm<T>(false, N, H, H, rh.data(), r + 2 * H * H, hr.data(), false, ctx);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < H; ++j) {
          T& g = gates[n * G + 2 * H + j];
          g = std::tanh(clipped(g + hr[n * H + j] + (rbh ? rbh[j] : T{0})));
        }
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < H; ++j) {
        const T z = gates[n * G + j], cand = gates[n * G + 2 * H + j];
        h[n * H + j] = (T{1} - z) * cand + z * h_prev[n * H + j];
      }
    if (y)
      for (int64_t n = 0; n < N; ++n) std::copy_n(h.data() + n * H, H, y + t * y_stride + n * H);
    record(t, gates, hr, h_prev);
  }
}

// ---- RNN (opsets 7, 14): H = tanh(X Wi^T + H_prev Ri^T + Wbi + Rbi).

// One direction's forward; `record(t, h_prev, h)` per run step.
template <typename T, typename Record>
void rnn_direction(const LstmAttrs& a, const LstmShape& s, const T* x, const T* w, const T* r,
                   const T* b, bool backwards, std::vector<T>& h, T* y, int64_t y_stride,
                   const KernelContext& ctx, Record&& record) {
  const int64_t H = a.hidden, N = s.batch;
  std::vector<T> xw(static_cast<size_t>(s.steps * N * H)), pre(static_cast<size_t>(N * H)),
      h_prev(h.size());
  gemm<T>(false, s.steps * N, H, s.input, x, w, xw.data(), false, ctx);
  if (b)
    for (int64_t row = 0; row < s.steps * N; ++row)
      for (int64_t j = 0; j < H; ++j) xw[row * H + j] += b[j] + b[H + j];
  const T clip = static_cast<T>(a.clip);
  for (int64_t k = 0; k < s.steps; ++k) {
    const int64_t t = backwards ? s.steps - 1 - k : k;
    h_prev = h;
    std::copy_n(xw.data() + t * N * H, N * H, pre.data());
    gemm<T>(false, N, H, H, h_prev.data(), r, pre.data(), true, ctx);
    for (int64_t e = 0; e < N * H; ++e)
      h[e] = std::tanh(clip > 0 ? std::clamp(pre[e], -clip, clip) : pre[e]);
    if (y)
      for (int64_t n = 0; n < N; ++n) std::copy_n(h.data() + n * H, H, y + t * y_stride + n * H);
    record(t, h_prev, h);
  }
}

// GRU's and RNN's cells for the kernels below: the forward of one direction, and the backward
// of one direction given its initial state h, the layout-0 dY (gy, direction d of D) and dh (in:
// dY_h, out: d initial_h), accumulating into dx (T, N, I) and the direction's dW, dR, dB.
struct GruCell {
  static constexpr int kGates = 3;

  template <typename T>
  static void forward(const LstmAttrs& a, const graph::Node& node, const LstmShape& s, const T* x,
                      const T* w, const T* r, const T* b, bool backwards, std::vector<T>& h, T* y,
                      int64_t y_stride, const KernelContext& ctx) {
    gru_direction<T>(a, node.attr_int("linear_before_reset", 0) != 0, s, x, w, r, b, backwards, h,
                     y, y_stride, ctx, [](int64_t, const auto&, const auto&, const auto&) {});
  }

  template <typename T>
  static void backward(const LstmAttrs& a, const graph::Node& node, const LstmShape& s, const T* xs,
                       const T* wd, const T* rd, const T* bd, bool backwards, std::vector<T> h,
                       const std::vector<T>& gy, int d, std::vector<T>& dh, std::vector<T>& dx,
                       T* dwd, T* drd, T* dbd, const KernelContext& ctx) {
    OT_CHECK(node.attr_int("linear_before_reset", 0) != 0, node.describe(),
             ": the GRU gradient needs linear_before_reset = 1 (torch's GRU)");
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps, G = 3 * H, I = s.input;
    std::vector<T> gates(static_cast<size_t>(T_ * N * G)), hrs(static_cast<size_t>(T_ * N * H)),
        hprev(hrs.size());
    gru_direction<T>(a, true, s, xs, wd, rd, bd, backwards, h, nullptr, 0, ctx,
                     [&](int64_t t, const std::vector<T>& g, const std::vector<T>& hr,
                         const std::vector<T>& hp) {
                       std::copy(g.begin(), g.end(), gates.begin() + t * N * G);
                       std::copy(hr.begin(), hr.end(), hrs.begin() + t * N * H);
                       std::copy(hp.begin(), hp.end(), hprev.begin() + t * N * H);
                     });
    std::vector<T> dax(static_cast<size_t>(N * G)), dah(static_cast<size_t>(N * G)),
        dh_prev(static_cast<size_t>(N * H));
    for (int64_t k = T_ - 1; k >= 0; --k) {
      const int64_t t = backwards ? T_ - 1 - k : k;
      const T* g = gates.data() + t * N * G;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < H; ++j) {
          const int64_t e = n * H + j;
          const T z = g[n * G + j], rg = g[n * G + H + j], cand = g[n * G + 2 * H + j];
          const T hp = hprev[t * N * H + e], hr = hrs[t * N * H + e];
          const T dht = dh[e] + gy[((t * D + d) * N + n) * H + j];
          const T dac = dht * (T{1} - z) * (T{1} - cand * cand);  // h~'s pre-activation
          const T daz = dht * (hp - cand) * z * (T{1} - z);
          const T dar = dac * hr * rg * (T{1} - rg);
          dax[n * G + j] = daz;
          dax[n * G + H + j] = dar;
          dax[n * G + 2 * H + j] = dac;
          dah[n * G + j] = daz;
          dah[n * G + H + j] = dar;
          dah[n * G + 2 * H + j] = dac * rg;  // through hr = H_prev Rh^T + Rbh
          dh_prev[e] = dht * z;
        }
      gemm_nn<T>(N, I, G, dax.data(), wd, dx.data() + t * N * I, true, ctx);
      accumulate_outer<T>(G, I, N, dax.data(), xs + t * N * I, dwd, ctx);
      accumulate_outer<T>(G, H, N, dah.data(), hprev.data() + t * N * H, drd, ctx);
      gemm_nn<T>(N, H, G, dah.data(), rd, dh_prev.data(), true, ctx);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t q = 0; q < G; ++q) {
          dbd[q] += dax[n * G + q];
          dbd[G + q] += dah[n * G + q];
        }
      dh = dh_prev;
    }
  }
};

struct RnnCell {
  static constexpr int kGates = 1;

  template <typename T>
  static void forward(const LstmAttrs& a, const graph::Node&, const LstmShape& s, const T* x,
                      const T* w, const T* r, const T* b, bool backwards, std::vector<T>& h, T* y,
                      int64_t y_stride, const KernelContext& ctx) {
    rnn_direction<T>(a, s, x, w, r, b, backwards, h, y, y_stride, ctx,
                     [](int64_t, const auto&, const auto&) {});
  }

  template <typename T>
  static void backward(const LstmAttrs& a, const graph::Node&, const LstmShape& s, const T* xs,
                       const T* wd, const T* rd, const T* bd, bool backwards, std::vector<T> h,
                       const std::vector<T>& gy, int d, std::vector<T>& dh, std::vector<T>& dx,
                       T* dwd, T* drd, T* dbd, const KernelContext& ctx) {
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps, I = s.input;
    std::vector<T> hprev(static_cast<size_t>(T_ * N * H)), hnew(hprev.size());
    rnn_direction<T>(a, s, xs, wd, rd, bd, backwards, h, nullptr, 0, ctx,
                     [&](int64_t t, const std::vector<T>& hp, const std::vector<T>& hn) {
                       std::copy(hp.begin(), hp.end(), hprev.begin() + t * N * H);
                       std::copy(hn.begin(), hn.end(), hnew.begin() + t * N * H);
                     });
    std::vector<T> da(static_cast<size_t>(N * H));
    for (int64_t k = T_ - 1; k >= 0; --k) {
      const int64_t t = backwards ? T_ - 1 - k : k;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < H; ++j) {
          const int64_t e = n * H + j;
          const T hn = hnew[t * N * H + e];
          da[e] = (dh[e] + gy[((t * D + d) * N + n) * H + j]) * (T{1} - hn * hn);
        }
      gemm_nn<T>(N, I, H, da.data(), wd, dx.data() + t * N * I, true, ctx);
      accumulate_outer<T>(H, I, N, da.data(), xs + t * N * I, dwd, ctx);
      accumulate_outer<T>(H, H, N, da.data(), hprev.data() + t * N * H, drd, ctx);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < H; ++j) {
          dbd[j] += da[n * H + j];
          dbd[H + j] += da[n * H + j];
        }
      gemm_nn<T>(N, H, H, da.data(), rd, dh.data(), false, ctx);
    }
  }
};

// GRU / RNN: X, W, R, [B, sequence_lens, initial_h] -> [Y, Y_h]
template <typename Cell>
class HStateKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const LstmAttrs a = rnn_attrs(ctx.node(), where, Cell::kGates);
    const TensorView& x = *ctx.input(0);
    OT_CHECK(ctx.input(1) && ctx.input(2), where, ": inputs W and R are required");
    const TensorView *b = ctx.input(3), *h0 = ctx.input(5);
    const LstmShape s = rnn_shape(a, Cell::kGates, x, *ctx.input(1), *ctx.input(2), b, h0, nullptr,
                                  nullptr, ctx.input(4), where);
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, G = Cell::kGates * H;
    ew::dispatch(ew::FloatTypes{}, x.dtype, where, [&]<typename T>(ew::Tag<T>) {
      const std::vector<T> xs = time_major<T>(&x, s.steps, N, s.input, a.layout1);
      const std::vector<T> hs = time_major<T>(h0, D, N, H, a.layout1);
      std::vector<T> y(static_cast<size_t>(s.steps * D * N * H)), yh(hs.size());
      for (int d = 0; d < D; ++d) {
        std::vector<T> h(hs.begin() + d * N * H, hs.begin() + (d + 1) * N * H);
        Cell::template forward<T>(
            a, ctx.node(), s, xs.data(), ctx.input(1)->as<T>() + d * G * s.input,
            ctx.input(2)->as<T>() + d * G * H, b ? b->as<T>() + d * 2 * G : nullptr,
            a.reverse || d == 1, h, y.data() + d * N * H, D * N * H, ctx);
        std::copy(h.begin(), h.end(), yh.begin() + d * N * H);
      }
      write_y<T>(ctx, a, s, y);
      write_state<T>(ctx, 1, a, s, yh);
    });
  }
};

// GRU / RNN gradient: dY, dY_h (optional), X, W, R, [B, initial_h] with the forward's attributes
// -> dX, dW, dR, dB, d initial_h. No clip.
template <typename Cell>
class HStateGradKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const std::string where = ctx.node().describe();
    const LstmAttrs a = rnn_attrs(ctx.node(), where, Cell::kGates);
    OT_CHECK(a.clip == 0, where, ": the gradient does not support clip");
    const TensorView *dy = ctx.input(0), *dyh = ctx.input(1);
    const TensorView& x = *ctx.input(2);
    const TensorView& w = *ctx.input(3);
    const TensorView& r = *ctx.input(4);
    const TensorView *b = ctx.input(5), *h0 = ctx.input(6);
    const LstmShape s =
        rnn_shape(a, Cell::kGates, x, w, r, b, h0, nullptr, nullptr, nullptr, where);
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, G = Cell::kGates * H, I = s.input;
    ew::dispatch(ew::FloatTypes{}, x.dtype, where, [&]<typename T>(ew::Tag<T>) {
      const std::vector<T> xs = time_major<T>(&x, s.steps, N, I, a.layout1);
      const std::vector<T> hs = time_major<T>(h0, D, N, H, a.layout1);
      const std::vector<T> gy = read_y<T>(dy, a, s);
      const std::vector<T> gh = time_major<T>(dyh, D, N, H, a.layout1);
      std::vector<T> dx(xs.size(), T{0}), dw(static_cast<size_t>(w.numel()), T{0}),
          dr(static_cast<size_t>(r.numel()), T{0}), db(static_cast<size_t>(D * 2 * G), T{0}),
          dh0(hs.size());
      for (int d = 0; d < D; ++d) {
        std::vector<T> dh(gh.begin() + d * N * H, gh.begin() + (d + 1) * N * H);
        Cell::template backward<T>(
            a, ctx.node(), s, xs.data(), w.as<T>() + d * G * I, r.as<T>() + d * G * H,
            b ? b->as<T>() + d * 2 * G : nullptr, a.reverse || d == 1,
            std::vector<T>(hs.begin() + d * N * H, hs.begin() + (d + 1) * N * H), gy, d, dh, dx,
            dw.data() + d * G * I, dr.data() + d * G * H, db.data() + d * 2 * G, ctx);
        std::copy(dh.begin(), dh.end(), dh0.begin() + d * N * H);
      }
      write_dx<T>(ctx, a, s, x.dims, dx);
      auto put = [&](int i, const std::vector<T>& v, const std::vector<int64_t>& dims) {
        if (ctx.num_outputs() <= i || !ctx.has_output(i)) return;
        std::copy(v.begin(), v.end(), ctx.output(i, dims).template as<T>());
      };
      put(1, dw, w.dims);
      put(2, dr, r.dims);
      if (b) put(3, db, b->dims);
      if (h0) write_state<T>(ctx, 4, a, s, dh0);
    });
  }
};

// GRU's and RNN's gradient rule: (dY, dY_h, X, W, R, B, initial_h) -> their gradients.
template <int gates>
void h_only_gradient(GradientBuilder& b) {
  const graph::Node& n = b.node();
  const char* op = gates == 3 ? "GRU" : "RNN";
  OT_CHECK(n.inputs().size() <= 4 || !n.input(4), n.describe(), ": the ", op,
           " gradient does not support sequence_lens");
  OT_CHECK(gates != 3 || n.attr_int("linear_before_reset", 0) != 0, n.describe(),
           ": the GRU gradient needs linear_before_reset = 1 (torch's GRU)");
  OT_CHECK(rnn_attrs(n, n.describe(), gates).clip == 0, n.describe(), ": the ", op,
           " gradient does not support clip");
  auto in = [&](int i) { return i < b.num_inputs() ? b.input(i) : nullptr; };
  auto og = [&](int i) { return i < b.num_outputs() ? b.output_grad(i) : nullptr; };
  std::vector<graph::Value*> grads =
      b.emit(std::string(op) + "Grad", {og(0), og(1), in(0), in(1), in(2), in(3), in(5)}, 5,
             n.attributes, kOnnxtrainDomain);
  const int forward_slot[5] = {0, 1, 2, 3, 5};
  for (int k = 0; k < 5; ++k)
    if (in(forward_slot[k]) && b.needs_input_grad(forward_slot[k]))
      b.set_input_grad(forward_slot[k], grads[static_cast<size_t>(k)]);
}

template <typename K>
std::unique_ptr<Kernel> factory(const graph::Node&) {
  return std::make_unique<K>();
}

// The forward ops since opset 7 (14 adds layout), the gradient ops in ai.onnxtrain.
OpSchema rnn_schema(const char* domain, const char* op_type, InferFn infer, KernelFactory kernel,
                    GradientFn gradient) {
  OpSchema s;
  s.domain = domain;
  s.op_type = op_type;
  if (s.domain.empty()) s.since_version = 7;
  s.infer = std::move(infer);
  s.cpu_kernel = std::move(kernel);
  s.gradient = std::move(gradient);
  return s;
}

}  // namespace

ONNXTRAIN_REGISTER_OP(gru) {
  return rnn_schema("", "GRU", infer_rnn<3>, factory<HStateKernel<GruCell>>, h_only_gradient<3>);
}
ONNXTRAIN_REGISTER_OP(gru_grad) {
  return rnn_schema(kOnnxtrainDomain, "GRUGrad", infer_rnn_grad<2>,
                    factory<HStateGradKernel<GruCell>>, {});
}
ONNXTRAIN_REGISTER_OP(rnn) {
  return rnn_schema("", "RNN", infer_rnn<1>, factory<HStateKernel<RnnCell>>, h_only_gradient<1>);
}
ONNXTRAIN_REGISTER_OP(rnn_grad) {
  return rnn_schema(kOnnxtrainDomain, "RNNGrad", infer_rnn_grad<2>,
                    factory<HStateGradKernel<RnnCell>>, {});
}
ONNXTRAIN_REGISTER_OP(lstm) {
  return rnn_schema("", "LSTM", infer_rnn<4>, factory<LstmKernel>, lstm_gradient);
}
ONNXTRAIN_REGISTER_OP(lstm_grad) {
  return rnn_schema(kOnnxtrainDomain, "LSTMGrad", infer_rnn_grad<3>, factory<LstmGradKernel>, {});
}

}  // namespace onnxtrain::ops::nn
