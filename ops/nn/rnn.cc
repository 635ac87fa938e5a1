// LSTM, GRU and RNN (opsets 7, 14) and their gradients, ai.onnxtrain LSTMGrad / GRUGrad /
// RNNGrad, with the default activations only. LSTM gates i, o, f, c as ONNX writes W / R / B;
// its forward also takes peepholes, clip and input_forget, which the gradient refuses (torch
// exports none of the three). GRU gates z, r, h; its gradient needs linear_before_reset = 1, as
// torch exports it. Clip only in the forwards. sequence_lens must be absent or all equal the
// sequence length. A gradient recomputes the forward's gates (no extra outputs on the forward
// node) -- except LSTMGrad after passes::keep_lstm_traces, which reads them from the forward's
// ai.onnxtrain LSTMTraining node (an LSTM that also writes its trace) -- then runs
// backpropagation through time, where only dH_prev = dA R is sequential: dX,
// dW, dR and dB are one product (or sum) each over every step's dA afterwards. Matrix products:
// oneDNN's sgemm for float32, a plain loop for float64 (gradient checks); the per-element cell
// loops vectorized (OT_SIMD_CLONES, vec_math's sigmoid and tanh) and parallel over batch rows.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "ops/elementwise/dtypes.h"
#include "ops/nn/lstm_trace.h"
#include "ops/nn/nn_util.h"
#include "ops/shape/copy.h"
#include "ops/shape_util.h"
#include "ops/simd_clones.h"
#include "ops/vec_math.h"

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

// A gradient's optional input Y (the forward's output 0) must be shaped as the forward wrote it.
void check_y(const TensorView* y, const LstmAttrs& a, const LstmShape& s, DataType dtype,
             const std::string& where) {
  if (!y) return;
  const int64_t T_ = s.steps, D = a.dirs, N = s.batch, H = a.hidden;
  const std::vector<int64_t> dims =
      a.layout1 ? std::vector<int64_t>{N, T_, D, H} : std::vector<int64_t>{T_, D, N, H};
  OT_CHECK(y->dims == dims && y->dtype == dtype, where, ": Y must be ",
           graph::dtype_short_name(dtype), " (", join_dims(dims), "), got ",
           graph::dtype_short_name(y->dtype), " (", join_dims(y->dims), ")");
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

// ---- one direction's forward, kept for the gradient

// One array of a Trace: its own vector, or (adopt) n elements of a caller's buffer, which
// resize / assign then fill in place: LSTMTraining's forward writes its trace straight into its
// output, and LSTMGrad reads it there (read only; the const_cast in load_trace).
template <typename T>
class TraceArray {
 public:
  TraceArray() = default;
  TraceArray(TraceArray&&) noexcept = default;  // a moved vector keeps its buffer: p_ stays valid
  TraceArray& operator=(TraceArray&&) noexcept = default;
  TraceArray(const TraceArray&) = delete;
  void adopt(T* p, size_t n) {
    p_ = p;
    n_ = n;
    adopted_ = true;
  }
  void resize(size_t n) {
    if (adopted_) {
      OT_CHECK(n == n_, "rnn trace: ", n, " elements wanted in an adopted buffer of ", n_);
      return;
    }
    own_.resize(n);
    p_ = own_.data();
    n_ = n;
  }
  void assign(size_t n, T v) {
    resize(n);
    std::fill_n(p_, n, v);
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  std::vector<T> own_;
  T* p_ = nullptr;
  size_t n_ = 0;
  bool adopted_ = false;
};

// A direction's forward over all steps. h and c hold the state before the first run step and
// after every step: the state before time step t is slot prev(t), the one after it slot next(t),
// so the T slots from prev_all() are each step's H_prev in time order (the rows dR sums over).
template <typename T>
struct Trace {
  int64_t steps = 0, slot = 0;  // slot: N * H elements
  bool backwards = false;
  TraceArray<T> gates;  // (T, N, G): X W^T + biases, then each step's gates after activation
  TraceArray<T> h, c;   // (T + 1, N, H); c for LSTM only
  TraceArray<T> hr;     // GRU with linear_before_reset: (T, N, H) H_prev Rh^T + Rbh
  int64_t prev(int64_t t) const { return backwards ? t + 1 : t; }
  int64_t next(int64_t t) const { return backwards ? t : t + 1; }
  int64_t initial() const { return backwards ? steps : 0; }
  int64_t last() const { return steps - initial(); }
  T* h_at(int64_t k) { return h.data() + k * slot; }
  T* c_at(int64_t k) { return c.data() + k * slot; }
  const T* h_at(int64_t k) const { return h.data() + k * slot; }
  const T* c_at(int64_t k) const { return c.data() + k * slot; }
  const T* prev_all() const { return h.data() + (backwards ? slot : 0); }
};

// LSTMTraining's output 3, the trace of every direction (D, lstm_trace_size): direction d's
// gates after activation (T, N, 4H), then its h and its c slots (T + 1, N, H) each, in the
// Trace's slot order. LSTMGrad reads it (input 10) instead of recomputing the forward.
int64_t lstm_trace_size(int64_t steps, int64_t batch, int64_t hidden) {
  return steps * batch * 4 * hidden + 2 * (steps + 1) * batch * hidden;
}

// Points tr's gates, h and c at one direction's part of a trace buffer.
template <typename T>
void adopt_trace(Trace<T>& tr, T* buf, int64_t steps, int64_t batch, int64_t hidden) {
  const int64_t gates = steps * batch * 4 * hidden, slots = (steps + 1) * batch * hidden;
  tr.gates.adopt(buf, static_cast<size_t>(gates));
  tr.h.adopt(buf + gates, static_cast<size_t>(slots));
  tr.c.adopt(buf + gates + slots, static_cast<size_t>(slots));
}

// LSTMGrad's view of the forward's trace (read only).
template <typename T>
Trace<T> load_trace(const T* in, int64_t steps, int64_t batch, int64_t hidden, bool backwards) {
  Trace<T> tr;
  tr.steps = steps;
  tr.slot = batch * hidden;
  tr.backwards = backwards;
  adopt_trace(tr, const_cast<T*>(in), steps, batch, hidden);
  return tr;
}

// A trace with gates = X W^T + Wb + Rb (Rb on the first `rb_cols` gate columns: GRU adds its
// Rbh inside the reset product; no gates when x is null) and the initial states (absent: zeros)
// in their slots. With the forward's Y (ys: (T, D, N, H), this is direction d of D) the states
// after every step are filled in from it, so that a gradient recomputes the gates with one
// product over all steps instead of one per step.
template <typename T>
Trace<T> start_trace(const LstmShape& s, int64_t H, int64_t G, bool backwards, const T* x,
                     const T* w, const T* b, int64_t rb_cols, const T* h0, const T* c0, bool with_c,
                     const T* ys, int d, int dirs, const KernelContext& ctx, T* storage = nullptr) {
  Trace<T> tr;
  tr.steps = s.steps;
  tr.slot = s.batch * H;
  tr.backwards = backwards;
  if (storage) adopt_trace(tr, storage, s.steps, s.batch, H);  // LSTM only (G == 4H)
  const int64_t rows = s.steps * s.batch;
  if (x) {
    tr.gates.resize(static_cast<size_t>(rows * G));
    gemm<T>(false, rows, G, s.input, x, w, tr.gates.data(), false, ctx);
  }
  if (x && b) {
    std::vector<T> bias(b, b + G);
    for (int64_t j = 0; j < rb_cols; ++j) bias[j] += b[G + j];
    for (int64_t row = 0; row < rows; ++row) {
      T* g = tr.gates.data() + row * G;
      for (int64_t j = 0; j < G; ++j) g[j] += bias[j];
    }
  }
  tr.h.assign(static_cast<size_t>((s.steps + 1) * tr.slot), T{0});
  if (h0) std::copy_n(h0, tr.slot, tr.h_at(tr.initial()));
  if (with_c) {
    tr.c.assign(tr.h.size(), T{0});
    if (c0) std::copy_n(c0, tr.slot, tr.c_at(tr.initial()));
  }
  if (ys)
    for (int64_t t = 0; t < s.steps; ++t)
      std::copy_n(ys + (t * dirs + d) * tr.slot, tr.slot, tr.h_at(tr.next(t)));
  return tr;
}

// Runs fn(n) for every batch row n, in parallel chunks of about 4096 elements.
template <typename F>
void for_rows(const KernelContext& ctx, int64_t rows, int64_t row_size, F&& fn) {
  ctx.parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, row_size)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t n = begin; n < end; ++n) fn(n);
                   });
}

// What every gradient does after backpropagation through time, for all steps at once: dA
// (T*N, G) holds each step's gradient at the gate pre-activations through X (dax) and through
// H_prev (dah; the same for LSTM and RNN). dX (T*N, I) += dax W, dW += dax^T X, dR += dah^T
// H_prev, dB's halves += the column sums of dax and dah (summed in double).
template <typename T>
void weight_grads(int64_t rows, int64_t G, int64_t I, int64_t H, const T* dax, const T* dah,
                  const T* x, const T* hprev, const T* w, T* dx, T* dw, T* dr, T* db,
                  const KernelContext& ctx) {
  gemm_nn<T>(rows, I, G, dax, w, dx, true, ctx);
  accumulate_outer<T>(G, I, rows, dax, x, dw, ctx);
  accumulate_outer<T>(G, H, rows, dah, hprev, dr, ctx);
  std::vector<double> sx(static_cast<size_t>(G), 0.0), sh(sx.size(), 0.0);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t q = 0; q < G; ++q) {
      sx[q] += static_cast<double>(dax[row * G + q]);
      sh[q] += static_cast<double>(dah[row * G + q]);
    }
  for (int64_t q = 0; q < G; ++q) {
    db[q] += static_cast<T>(sx[q]);
    db[G + q] += static_cast<T>(sh[q]);
  }
}

template <typename T>
T clamp_abs(T v, T clip) {
  return clip > 0 ? std::min(std::max(v, -clip), clip) : v;
}

// v[0, n) clamped to [-clip, clip] in place where clip > 0. The cell loops below clip in passes
// of their own: a select on clip or input_forget inside a loop keeps GCC from vectorizing the
// OT_SIMD_CLONES clones (measured: the LSTM cell 16 ms -> 2 ms per 524k elements).
template <typename T>
void clip_span(T* v, int64_t n, T clip) {
  if (clip > 0)
    for (int64_t j = 0; j < n; ++j) v[j] = std::min(std::max(v[j], -clip), clip);
}

// ---- LSTM: gates i, o, f, c.

// One batch row of a step: g (4H) holds the pre-activations (X W^T + H_prev R^T + biases) and
// gets the gates after activation; cp: C_prev; cn, h: the new states; p: peepholes or null.
template <typename T>
OT_SIMD_CLONES void lstm_row(int64_t H, T* g, const T* cp, T* cn, T* h, const T* p, T clip,
                             bool input_forget) {
  T *gi = g, *go = g + H, *gf = g + 2 * H, *gc = g + 3 * H;
  if (p)
    for (int64_t j = 0; j < H; ++j) {
      gi[j] += p[j] * cp[j];
      gf[j] += p[2 * H + j] * cp[j];
    }
  clip_span(gi, H, clip);
  clip_span(gf, 2 * H, clip);  // f and c
  for (int64_t j = 0; j < H; ++j) {
    gi[j] = vm::sigmoid(gi[j]);
    gf[j] = vm::sigmoid(gf[j]);
    gc[j] = vm::tanh(gc[j]);
  }
  if (input_forget)
    for (int64_t j = 0; j < H; ++j) gf[j] = T{1} - gi[j];
  for (int64_t j = 0; j < H; ++j) cn[j] = gf[j] * cp[j] + gi[j] * gc[j];
  if (p)
    for (int64_t j = 0; j < H; ++j) go[j] += p[H + j] * cn[j];
  clip_span(go, H, clip);
  for (int64_t j = 0; j < H; ++j) {
    const T o = vm::sigmoid(go[j]);
    go[j] = o;
    h[j] = o * vm::tanh(cn[j]);
  }
}

// One batch row of the gradient at a step: dh = dL/dH from the later steps, gy = dL/dY at this
// step, dc = dL/dC (in: from the later steps, out: to C_prev); da (4H): dL/d pre-activations.
template <typename T>
OT_SIMD_CLONES void lstm_grad_row(int64_t H, const T* g, const T* cp, const T* cn, const T* dh,
                                  const T* gy, T* __restrict dc, T* __restrict da) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = g[j], o = g[H + j], f = g[2 * H + j], cand = g[3 * H + j];
    const T hgrad = dh[j] + gy[j];
    const T tc = vm::tanh(cn[j]);
    const T dcn = dc[j] + hgrad * o * (T{1} - tc * tc);
    da[j] = dcn * cand * i * (T{1} - i);
    da[H + j] = hgrad * tc * o * (T{1} - o);
    da[2 * H + j] = dcn * cp[j] * f * (T{1} - f);
    da[3 * H + j] = dcn * i * (T{1} - cand * cand);
    dc[j] = dcn * f;
  }
}

// One direction's LSTM forward (x time-major, w / r / b / p this direction's; ys: see
// start_trace; storage: where the trace goes, lstm_trace_size elements, or null).
template <typename T>
Trace<T> lstm_forward(const LstmAttrs& a, const LstmShape& s, const T* x, const T* w, const T* r,
                      const T* b, const T* p, const T* h0, const T* c0, bool backwards, const T* ys,
                      int d, const KernelContext& ctx, T* storage = nullptr) {
  const int64_t H = a.hidden, N = s.batch, G = 4 * H;
  Trace<T> tr =
      start_trace<T>(s, H, G, backwards, x, w, b, G, h0, c0, true, ys, d, a.dirs, ctx, storage);
  if (ys) gemm<T>(false, s.steps * N, G, H, tr.prev_all(), r, tr.gates.data(), true, ctx);
  const T clip = static_cast<T>(a.clip);
  for (int64_t k = 0; k < s.steps; ++k) {
    const int64_t t = backwards ? s.steps - 1 - k : k;
    T* g = tr.gates.data() + t * N * G;
    const T *hp = tr.h_at(tr.prev(t)), *cp = tr.c_at(tr.prev(t));
    T *hn = tr.h_at(tr.next(t)), *cn = tr.c_at(tr.next(t));
    if (!ys) gemm<T>(false, N, G, H, hp, r, g, true, ctx);
    for_rows(ctx, N, G, [&](int64_t n) {
      lstm_row<T>(H, g + n * G, cp + n * H, cn + n * H, hn + n * H, p, clip, a.input_forget);
    });
  }
  return tr;
}

// Y (T, D, N, H) and the final state (D, N, H) of direction d from its trace's h (or c) slots.
template <typename T>
void collect(const Trace<T>& tr, const TraceArray<T>& slots, int d, int dirs, T* y,
             T* final_state) {
  const int64_t S = tr.slot;
  if (y)
    for (int64_t t = 0; t < tr.steps; ++t)
      std::copy_n(slots.data() + tr.next(t) * S, S, y + (t * dirs + d) * S);
  std::copy_n(slots.data() + tr.last() * S, S, final_state + d * S);
}

// X, W, R, [B, sequence_lens, initial_h, initial_c, P] -> [Y, Y_h, Y_c]; ai.onnxtrain
// LSTMTraining also -> trace (see lstm_trace_size).
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
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps, G = 4 * H;
    ew::dispatch(ew::FloatTypes{}, x.dtype, where, [&]<typename T>(ew::Tag<T>) {
      const std::vector<T> xs = time_major<T>(&x, T_, N, s.input, a.layout1);
      const std::vector<T> hs = time_major<T>(h0, D, N, H, a.layout1);
      const std::vector<T> cs = time_major<T>(c0, D, N, H, a.layout1);
      std::vector<T> y(static_cast<size_t>(T_ * D * N * H)), yh(hs.size()), yc(cs.size());
      const int64_t per = lstm_trace_size(T_, N, H);
      T* trace = ctx.num_outputs() > kLstmTraceOutput && ctx.has_output(kLstmTraceOutput)
                     ? ctx.output(kLstmTraceOutput, std::vector<int64_t>{D, per}).template as<T>()
                     : nullptr;
      for (int d = 0; d < D; ++d) {
        const Trace<T> tr = lstm_forward<T>(
            a, s, xs.data(), ctx.input(1)->as<T>() + d * G * s.input,
            ctx.input(2)->as<T>() + d * G * H, b ? b->as<T>() + d * 2 * G : nullptr,
            p ? p->as<T>() + d * 3 * H : nullptr, hs.data() + d * N * H, cs.data() + d * N * H,
            a.reverse || d == 1, nullptr, d, ctx, trace ? trace + d * per : nullptr);
        collect(tr, tr.h, d, D, y.data(), yh.data());
        collect(tr, tr.c, d, D, static_cast<T*>(nullptr), yc.data());
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
  std::optional<Shape> y, state, trace;
  if (x.shape && x.shape->size() == 3) {
    const Dim t = (*x.shape)[a.layout1 ? 1 : 0], n = (*x.shape)[a.layout1 ? 0 : 1];
    const Dim d = Dim::known(a.dirs), h = Dim::known(a.hidden);
    y = a.layout1 ? Shape{n, t, d, h} : Shape{t, d, n, h};
    state = a.layout1 ? Shape{n, d, h} : Shape{d, n, h};
    if (t.is_known() && n.is_known())
      trace = Shape{d, Dim::known(lstm_trace_size(t.value, n.value, a.hidden))};
  }
  // Outputs 0-2 as ONNX's; LSTMTraining's output 3 is its trace.
  for (size_t i = 0; i < ctx.node.outputs().size(); ++i)
    set_output(ctx, i, x.dtype, i == 0 ? y : i < 3 ? state : trace);
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

// dY, dY_h, dY_c (each optional), X, W, R, [B, initial_h, initial_c, Y, trace] with the
// forward's attributes -> dX, dW, dR, dB, d initial_h, d initial_c. With the trace
// (LSTMTraining's output 3) nothing of the forward is recomputed.
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
    const TensorView *b = ctx.input(6), *h0 = ctx.input(7), *c0 = ctx.input(8),
                     *y = ctx.num_inputs() > kLstmGradY ? ctx.input(kLstmGradY) : nullptr,
                     *trace =
                         ctx.num_inputs() > kLstmGradTrace ? ctx.input(kLstmGradTrace) : nullptr;
    const LstmShape s = rnn_shape(a, 4, x, w, r, b, h0, c0, nullptr, nullptr, where);
    check_y(y, a, s, x.dtype, where);
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps, G = 4 * H, I = s.input;
    const int64_t per = lstm_trace_size(T_, N, H);
    OT_CHECK(!trace || (trace->dtype == x.dtype && trace->dims == std::vector<int64_t>{D, per}),
             where, ": input ", kLstmGradTrace, " (the forward's trace) is ",
             trace ? join_dims(trace->dims) : "", ", expected ", D, "x", per, " of X's dtype");
    ew::dispatch(ew::FloatTypes{}, x.dtype, where, [&]<typename T>(ew::Tag<T>) {
      const std::vector<T> xs = time_major<T>(&x, T_, N, I, a.layout1);
      const std::vector<T> hs = time_major<T>(h0, D, N, H, a.layout1);
      const std::vector<T> cs = time_major<T>(c0, D, N, H, a.layout1);
      const std::vector<T> gy = read_y<T>(dy, a, s);
      const std::vector<T> ys = y && !trace ? read_y<T>(y, a, s) : std::vector<T>{};
      std::vector<T> dh = time_major<T>(dyh, D, N, H, a.layout1);  // becomes d initial_h
      std::vector<T> dc = time_major<T>(dyc, D, N, H, a.layout1);  // becomes d initial_c
      std::vector<T> dx(xs.size(), T{0}), dw(static_cast<size_t>(w.numel()), T{0}),
          dr(static_cast<size_t>(r.numel()), T{0}), db(static_cast<size_t>(D * 2 * G), T{0}),
          da(static_cast<size_t>(T_ * N * G));
      for (int d = 0; d < D; ++d) {
        const T* wd = w.as<T>() + d * G * I;
        const T* rd = r.as<T>() + d * G * H;
        const bool backwards = a.reverse || d == 1;
        const Trace<T> tr =
            trace ? load_trace<T>(trace->as<T>() + d * per, T_, N, H, backwards)
                  : lstm_forward<T>(a, s, xs.data(), wd, rd, b ? b->as<T>() + d * 2 * G : nullptr,
                                    nullptr, hs.data() + d * N * H, cs.data() + d * N * H,
                                    backwards, ys.empty() ? nullptr : ys.data(), d, ctx);
        // Backpropagation through time, last run step first: each step's dA, and dH_prev = dA R.
        T *dhd = dh.data() + d * N * H, *dcd = dc.data() + d * N * H;
        for (int64_t k = T_ - 1; k >= 0; --k) {
          const int64_t t = tr.backwards ? T_ - 1 - k : k;
          const T *g = tr.gates.data() + t * N * G, *cp = tr.c_at(tr.prev(t)),
                  *cn = tr.c_at(tr.next(t)), *gyt = gy.data() + (t * D + d) * N * H;
          T* dat = da.data() + t * N * G;
          for_rows(ctx, N, G, [&](int64_t n) {
            const int64_t e = n * H;
            lstm_grad_row<T>(H, g + n * G, cp + e, cn + e, dhd + e, gyt + e, dcd + e, dat + n * G);
          });
          gemm_nn<T>(N, H, G, dat, rd, dhd, false, ctx);
        }
        weight_grads<T>(T_ * N, G, I, H, da.data(), da.data(), xs.data(), tr.prev_all(), wd,
                        dx.data(), dw.data() + d * G * I, dr.data() + d * G * H,
                        db.data() + d * 2 * G, ctx);
      }
      auto put = [&](int i, const std::vector<T>& v, std::vector<int64_t> dims) {
        if (ctx.num_outputs() <= i || !ctx.has_output(i)) return;
        std::copy(v.begin(), v.end(), ctx.output(i, dims).template as<T>());
      };
      write_dx<T>(ctx, a, s, x.dims, dx);
      put(1, dw, w.dims);
      put(2, dr, r.dims);
      if (b) put(3, db, b->dims);
      if (h0) write_state<T>(ctx, 4, a, s, dh);
      if (c0) write_state<T>(ctx, 5, a, s, dc);
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
  // The forward's Y (when it writes one) lets the gradient recompute the gates with one product
  // over all steps.
  std::vector<graph::Value*> inputs{og(0), og(1), og(2), in(0), in(1), in(2),
                                    in(3), in(5), in(6), b.output(0)};
  OT_CHECK(inputs.size() == kLstmGradY + 1, "LSTMGrad's Y slot moved: update ops/nn/lstm_trace.h");
  std::vector<graph::Value*> grads = b.emit("LSTMGrad", inputs, 6, n.attributes, kOnnxtrainDomain);
  const int forward_slot[6] = {0, 1, 2, 3, 5, 6};
  for (int k = 0; k < 6; ++k)
    if (in(forward_slot[k]) && b.needs_input_grad(forward_slot[k]))
      b.set_input_grad(forward_slot[k], grads[static_cast<size_t>(k)]);
}

// ---- GRU (opsets 7, 14): gates z, r, h. With linear_before_reset (torch's GRU):
//   h~ = tanh(X Wh^T + Wbh + r (.) (H_prev Rh^T + Rbh)), else tanh(X Wh^T + Wbh + (r (.) H_prev)
//   Rh^T + Rbh); H = (1 - z) (.) h~ + z (.) H_prev. The gradient takes linear_before_reset = 1.

// One batch row of a linear_before_reset step: g (3H) holds X W^T + Wb (+ Rb for z and r) and
// gets the gates after activation; pre (3H) = [g's z and r, Rbh] + H_prev R^T; hr (out) =
// H_prev Rh^T + Rbh; hp: H_prev; h: the new state.
template <typename T>
OT_SIMD_CLONES void gru_row(int64_t H, T* g, const T* pre, const T* hp, T* hr, T* h, T clip) {
  std::copy_n(pre, 2 * H, g);
  std::copy_n(pre + 2 * H, H, hr);
  clip_span(g, 2 * H, clip);
  for (int64_t j = 0; j < 2 * H; ++j) g[j] = vm::sigmoid(g[j]);
  T* gh = g + 2 * H;
  for (int64_t j = 0; j < H; ++j) gh[j] += g[H + j] * hr[j];
  clip_span(gh, H, clip);
  for (int64_t j = 0; j < H; ++j) {
    const T z = g[j], cand = vm::tanh(gh[j]);
    gh[j] = cand;
    h[j] = (T{1} - z) * cand + z * hp[j];
  }
}

// One batch row of the gradient at a step: dax / dah (3H) the gradient at the pre-activations
// through X and through H_prev (they differ in h~: r (.) hr), dhn = dL/dH_prev's direct part.
template <typename T>
OT_SIMD_CLONES void gru_grad_row(int64_t H, const T* g, const T* hp, const T* hr, const T* dh,
                                 const T* gy, T* __restrict dax, T* __restrict dah,
                                 T* __restrict dhn) {
  for (int64_t j = 0; j < H; ++j) {
    const T z = g[j], rg = g[H + j], cand = g[2 * H + j];
    const T dht = dh[j] + gy[j];
    const T dac = dht * (T{1} - z) * (T{1} - cand * cand);  // h~'s pre-activation
    const T daz = dht * (hp[j] - cand) * z * (T{1} - z);
    const T dar = dac * hr[j] * rg * (T{1} - rg);
    dax[j] = daz;
    dax[H + j] = dar;
    dax[2 * H + j] = dac;
    dah[j] = daz;
    dah[H + j] = dar;
    dah[2 * H + j] = dac * rg;  // through hr = H_prev Rh^T + Rbh
    dhn[j] = dht * z;
  }
}

// One direction's GRU forward; with linear_before_reset the trace keeps each step's hr. ys (only
// with linear_before_reset): see start_trace.
template <typename T>
Trace<T> gru_forward(const LstmAttrs& a, bool lbr, const LstmShape& s, const T* x, const T* w,
                     const T* r, const T* b, const T* h0, bool backwards, const T* ys, int d,
                     const KernelContext& ctx) {
  const int64_t H = a.hidden, N = s.batch, G = 3 * H;
  Trace<T> tr =
      start_trace<T>(s, H, G, backwards, x, w, b, 2 * H, h0, nullptr, false, ys, d, a.dirs, ctx);
  if (lbr) tr.hr.resize(static_cast<size_t>(s.steps * N * H));
  const T* rbh = b ? b + G + 2 * H : nullptr;
  const T clip = static_cast<T>(a.clip);
  // pre (N, 3H) per step, or (T, N, 3H) for all steps at once: [z r | Rbh] + H_prev R^T.
  std::vector<T> pre(static_cast<size_t>((ys ? s.steps : 1) * N * G)),
      rh(static_cast<size_t>(N * H)), hr(static_cast<size_t>(N * H));
  auto fill = [&](int64_t t, T* dst) {
    for (int64_t n = 0; n < N; ++n) {
      std::copy_n(tr.gates.data() + (t * N + n) * G, 2 * H, dst + n * G);
      for (int64_t j = 0; j < H; ++j) dst[n * G + 2 * H + j] = rbh ? rbh[j] : T{0};
    }
  };
  if (ys) {
    OT_CHECK(lbr, "GRU: a recomputation from Y needs linear_before_reset");
    for (int64_t t = 0; t < s.steps; ++t) fill(t, pre.data() + t * N * G);
    gemm<T>(false, s.steps * N, G, H, tr.prev_all(), r, pre.data(), true, ctx);
  }
  for (int64_t k = 0; k < s.steps; ++k) {
    const int64_t t = backwards ? s.steps - 1 - k : k;
    T* g = tr.gates.data() + t * N * G;
    const T* hp = tr.h_at(tr.prev(t));
    T* hn = tr.h_at(tr.next(t));
    T* pt = pre.data() + (ys ? t * N * G : 0);
    if (!ys) fill(t, pt);
    if (lbr) {  // one product for all three gates: [z r | hr] += H_prev R^T
      if (!ys) gemm<T>(false, N, G, H, hp, r, pt, true, ctx);
      T* hrt = tr.hr.data() + t * N * H;
      for_rows(ctx, N, G, [&](int64_t n) {
        gru_row<T>(H, g + n * G, pt + n * G, hp + n * H, hrt + n * H, hn + n * H, clip);
      });
      continue;
    }
    // h~ = tanh(xw_h + (r H_prev) Rh^T + Rbh): z and r first (forward only, not torch's).
    gemm<T>(false, N, 2 * H, H, hp, r, pre.data(), true, ctx, G);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < 2 * H; ++j)
        g[n * G + j] = vm::sigmoid(clamp_abs(pre[n * G + j], clip));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < H; ++j) rh[n * H + j] = g[n * G + H + j] * hp[n * H + j];
    gemm<T>(false, N, H, H, rh.data(), r + 2 * H * H, hr.data(), false, ctx);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < H; ++j) {
        T& c = g[n * G + 2 * H + j];
        c = vm::tanh(clamp_abs(c + hr[n * H + j] + pre[n * G + 2 * H + j], clip));
        const T z = g[n * G + j];
        hn[n * H + j] = (T{1} - z) * c + z * hp[n * H + j];
      }
  }
  return tr;
}

// ---- RNN (opsets 7, 14): H = tanh(X Wi^T + H_prev Ri^T + Wbi + Rbi).

template <typename T>
OT_SIMD_CLONES void rnn_row(int64_t H, T* pre, T* h, T clip) {
  clip_span(pre, H, clip);
  for (int64_t j = 0; j < H; ++j) h[j] = vm::tanh(pre[j]);
}

template <typename T>
OT_SIMD_CLONES void rnn_grad_row(int64_t H, const T* h, const T* dh, const T* gy,
                                 T* __restrict da) {
  for (int64_t j = 0; j < H; ++j) da[j] = (dh[j] + gy[j]) * (T{1} - h[j] * h[j]);
}

// One direction's RNN forward; the trace's gates keep the pre-activations.
template <typename T>
Trace<T> rnn_forward(const LstmAttrs& a, const LstmShape& s, const T* x, const T* w, const T* r,
                     const T* b, const T* h0, bool backwards, const KernelContext& ctx) {
  const int64_t H = a.hidden, N = s.batch;
  Trace<T> tr =
      start_trace<T>(s, H, H, backwards, x, w, b, H, h0, nullptr, false, nullptr, 0, 1, ctx);
  const T clip = static_cast<T>(a.clip);
  for (int64_t k = 0; k < s.steps; ++k) {
    const int64_t t = backwards ? s.steps - 1 - k : k;
    T* pre = tr.gates.data() + t * N * H;
    T* hn = tr.h_at(tr.next(t));
    gemm<T>(false, N, H, H, tr.h_at(tr.prev(t)), r, pre, true, ctx);
    for_rows(ctx, N, H, [&](int64_t n) { rnn_row<T>(H, pre + n * H, hn + n * H, clip); });
  }
  return tr;
}

// GRU's and RNN's cells for the kernels below: the forward of one direction, and the backward
// of one direction from its initial state h0, the layout-0 dY (gy, direction d of D), the
// forward's layout-0 Y (ys; null: the states are recomputed step by step) and dh (in: dY_h,
// out: d initial_h), accumulating into dx (T, N, I) and the direction's dW, dR, dB.
struct GruCell {
  static constexpr int kGates = 3;

  template <typename T>
  static Trace<T> forward(const LstmAttrs& a, const graph::Node& node, const LstmShape& s,
                          const T* x, const T* w, const T* r, const T* b, const T* h0,
                          bool backwards, const KernelContext& ctx) {
    return gru_forward<T>(a, node.attr_int("linear_before_reset", 0) != 0, s, x, w, r, b, h0,
                          backwards, nullptr, 0, ctx);
  }

  template <typename T>
  static void backward(const LstmAttrs& a, const graph::Node& node, const LstmShape& s, const T* xs,
                       const T* wd, const T* rd, const T* bd, bool backwards, const T* h0,
                       const std::vector<T>& gy, const T* ys, int d, T* dh, std::vector<T>& dx,
                       T* dwd, T* drd,
                       T* dbd, const KernelContext& ctx) {
    OT_CHECK(node.attr_int("linear_before_reset", 0) != 0, node.describe(),
             ": the GRU gradient needs linear_before_reset = 1 (torch's GRU)");
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps, G = 3 * H;
    const Trace<T> tr = gru_forward<T>(a, true, s, xs, wd, rd, bd, h0, backwards, ys, d, ctx);
    std::vector<T> dax(static_cast<size_t>(T_ * N * G)), dah(dax.size()),
        dhn(static_cast<size_t>(N * H));
    for (int64_t k = T_ - 1; k >= 0; --k) {
      const int64_t t = tr.backwards ? T_ - 1 - k : k;
      const T *g = tr.gates.data() + t * N * G, *hp = tr.h_at(tr.prev(t)),
              *hr = tr.hr.data() + t * N * H, *gyt = gy.data() + (t * D + d) * N * H;
      T *daxt = dax.data() + t * N * G, *daht = dah.data() + t * N * G;
      for_rows(ctx, N, G, [&](int64_t n) {
        const int64_t e = n * H;
        gru_grad_row<T>(H, g + n * G, hp + e, hr + e, dh + e, gyt + e, daxt + n * G, daht + n * G,
                        dhn.data() + e);
      });
      gemm_nn<T>(N, H, G, daht, rd, dhn.data(), true, ctx);
      std::copy(dhn.begin(), dhn.end(), dh);
    }
    weight_grads<T>(T_ * N, G, s.input, H, dax.data(), dah.data(), xs, tr.prev_all(), wd, dx.data(),
                    dwd, drd, dbd, ctx);
  }
};

struct RnnCell {
  static constexpr int kGates = 1;

  template <typename T>
  static Trace<T> forward(const LstmAttrs& a, const graph::Node&, const LstmShape& s, const T* x,
                          const T* w, const T* r, const T* b, const T* h0, bool backwards,
                          const KernelContext& ctx) {
    return rnn_forward<T>(a, s, x, w, r, b, h0, backwards, ctx);
  }

  template <typename T>
  static void backward(const LstmAttrs& a, const graph::Node&, const LstmShape& s, const T* xs,
                       const T* wd, const T* rd, const T* bd, bool backwards, const T* h0,
                       const std::vector<T>& gy, const T* ys, int d, T* dh, std::vector<T>& dx,
                       T* dwd, T* drd,
                       T* dbd, const KernelContext& ctx) {
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, T_ = s.steps;
    // With Y the states are all there is to know: no recomputation.
    const Trace<T> tr =
        ys ? start_trace<T>(s, H, H, backwards, nullptr, wd, bd, H, h0, nullptr, false, ys, d,
                            a.dirs, ctx)
           : rnn_forward<T>(a, s, xs, wd, rd, bd, h0, backwards, ctx);
    std::vector<T> da(static_cast<size_t>(T_ * N * H));
    for (int64_t k = T_ - 1; k >= 0; --k) {
      const int64_t t = tr.backwards ? T_ - 1 - k : k;
      const T *hn = tr.h_at(tr.next(t)), *gyt = gy.data() + (t * D + d) * N * H;
      T* dat = da.data() + t * N * H;
      for_rows(ctx, N, H, [&](int64_t n) {
        rnn_grad_row<T>(H, hn + n * H, dh + n * H, gyt + n * H, dat + n * H);
      });
      gemm_nn<T>(N, H, H, dat, rd, dh, false, ctx);
    }
    weight_grads<T>(T_ * N, H, s.input, H, da.data(), da.data(), xs, tr.prev_all(), wd, dx.data(),
                    dwd, drd, dbd, ctx);
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
        const Trace<T> tr = Cell::template forward<T>(
            a, ctx.node(), s, xs.data(), ctx.input(1)->as<T>() + d * G * s.input,
            ctx.input(2)->as<T>() + d * G * H, b ? b->as<T>() + d * 2 * G : nullptr,
            hs.data() + d * N * H, a.reverse || d == 1, ctx);
        collect(tr, tr.h, d, D, y.data(), yh.data());
      }
      write_y<T>(ctx, a, s, y);
      write_state<T>(ctx, 1, a, s, yh);
    });
  }
};

// GRU / RNN gradient: dY, dY_h (optional), X, W, R, [B, initial_h, Y] with the forward's
// attributes -> dX, dW, dR, dB, d initial_h. No clip.
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
    const TensorView *b = ctx.input(5), *h0 = ctx.input(6),
                     *y = ctx.num_inputs() > 7 ? ctx.input(7) : nullptr;
    const LstmShape s =
        rnn_shape(a, Cell::kGates, x, w, r, b, h0, nullptr, nullptr, nullptr, where);
    check_y(y, a, s, x.dtype, where);
    const int64_t H = a.hidden, N = s.batch, D = a.dirs, G = Cell::kGates * H, I = s.input;
    ew::dispatch(ew::FloatTypes{}, x.dtype, where, [&]<typename T>(ew::Tag<T>) {
      const std::vector<T> xs = time_major<T>(&x, s.steps, N, I, a.layout1);
      const std::vector<T> hs = time_major<T>(h0, D, N, H, a.layout1);
      const std::vector<T> gy = read_y<T>(dy, a, s);
      const std::vector<T> ys = y ? read_y<T>(y, a, s) : std::vector<T>{};
      std::vector<T> dh = time_major<T>(dyh, D, N, H, a.layout1);  // becomes d initial_h
      std::vector<T> dx(xs.size(), T{0}), dw(static_cast<size_t>(w.numel()), T{0}),
          dr(static_cast<size_t>(r.numel()), T{0}), db(static_cast<size_t>(D * 2 * G), T{0});
      for (int d = 0; d < D; ++d)
        Cell::template backward<T>(a, ctx.node(), s, xs.data(), w.as<T>() + d * G * I,
                                   r.as<T>() + d * G * H, b ? b->as<T>() + d * 2 * G : nullptr,
                                   a.reverse || d == 1, hs.data() + d * N * H, gy,
                                   ys.empty() ? nullptr : ys.data(), d,
                                   dh.data() + d * N * H, dx, dw.data() + d * G * I,
                                   dr.data() + d * G * H, db.data() + d * 2 * G, ctx);
      write_dx<T>(ctx, a, s, x.dims, dx);
      auto put = [&](int i, const std::vector<T>& v, const std::vector<int64_t>& dims) {
        if (ctx.num_outputs() <= i || !ctx.has_output(i)) return;
        std::copy(v.begin(), v.end(), ctx.output(i, dims).template as<T>());
      };
      put(1, dw, w.dims);
      put(2, dr, r.dims);
      if (b) put(3, db, b->dims);
      if (h0) write_state<T>(ctx, 4, a, s, dh);
    });
  }
};

// GRU's and RNN's gradient rule: (dY, dY_h, X, W, R, B, initial_h, Y) -> their gradients.
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
      b.emit(std::string(op) + "Grad", {og(0), og(1), in(0), in(1), in(2), in(3), in(5), b.output(0)}, 5,
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
// passes::keep_lstm_traces' forward: an LSTM that also writes its trace for LSTMGrad.
ONNXTRAIN_REGISTER_OP(lstm_training) {
  return rnn_schema(kOnnxtrainDomain, kLstmTrainingOp, infer_rnn<4>, factory<LstmKernel>, {});
}
ONNXTRAIN_REGISTER_OP(lstm_grad) {
  return rnn_schema(kOnnxtrainDomain, "LSTMGrad", infer_rnn_grad<3>, factory<LstmGradKernel>, {});
}

}  // namespace onnxtrain::ops::nn
