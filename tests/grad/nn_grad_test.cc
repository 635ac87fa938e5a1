// Finite-difference checks of the nn family's gradient rules through autodiff: Conv and
// ConvTranspose (1-D/2-D/3-D, groups and depthwise, strides, dilations, pads, auto_pad, bias),
// MaxPool / AveragePool (ceil_mode, count_include_pad, dilations), the global pools, and
// BatchNormalization in training and inference mode (the running statistics are never checked:
// they get no gradient).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "passes/passes.h"
#include "tests/grad/gradcheck.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;
using testing::GradCase;
using testing::GradInput;

constexpr DataType kF64 = DataType::kDouble;
constexpr DataType kF32 = DataType::kFloat;

using testing::rnd;

// Distinct values spaced 2/numel apart in random order: a max-pool window never holds two
// values closer than the finite-difference step (1e-3 in float32), so no argmax flips.
Tensor distinct(std::vector<int64_t> dims, uint64_t seed, DataType dt = kF64) {
  Tensor t = testing::random_tensor(kF64, dims, seed);
  const int64_t n = t.numel();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  const double* r = t.data_as<double>();
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return r[a] < r[b]; });
  Tensor out(dt, std::move(dims));
  for (int64_t k = 0; k < n; ++k) {
    const double v = -1.0 + 2.0 * static_cast<double>(k) / static_cast<double>(n);
    if (dt == kF64)
      out.mutable_data_as<double>()[order[k]] = v;
    else
      out.mutable_data_as<float>()[order[k]] = static_cast<float>(v);
  }
  return out;
}

void run(const GradCase& c) {
  SCOPED_TRACE(c.label);
  testing::GradReport r = testing::check_gradient(c);
  EXPECT_GT(r.elements_checked, 0) << c.label;
}

struct ConvSpec {
  std::vector<int64_t> x, w;  // w: (M, C/g, K...) for Conv, (C, M/g, K...) for ConvTranspose
  std::vector<Attribute> attrs;
  bool bias;
  const char* label;
};

GradCase window_case(const char* op, const ConvSpec& s, uint64_t seed, DataType dt = kF64) {
  GradCase c;
  c.op_type = op;
  c.label = std::string(op) + " " + s.label + (dt == kF32 ? " f32" : "");
  c.attributes = s.attrs;
  c.inputs = {GradInput{rnd(s.x, seed, -1, 1, dt)}, GradInput{rnd(s.w, seed + 1, -1, 1, dt)}};
  if (s.bias) {
    int64_t m = s.w[0];
    if (std::string(op) == "ConvTranspose") {
      int64_t group = 1;
      for (const Attribute& a : s.attrs)
        if (a.name == "group") group = a.i();
      m = s.w[1] * group;
    }
    c.inputs.push_back(GradInput{rnd({m}, seed + 2, -1, 1, dt)});
  }
  return c;
}

Attribute ints(const char* name, std::vector<int64_t> v) {
  return Attribute::make_ints(name, std::move(v));
}

TEST(NnGrad, Conv) {
  const std::vector<ConvSpec> specs{
      {{2, 3, 7}, {4, 3, 3}, {}, true, "1-D 3x7 k3 bias"},
      {{2, 4, 9},
       {6, 2, 3},
       {Attribute::make_int("group", 2), ints("strides", {2}), ints("dilations", {2}),
        ints("pads", {1, 2})},
       false,
       "1-D group 2 stride 2 dilation 2 pads (1,2)"},
      {{2, 3, 5, 5}, {4, 3, 3, 3}, {ints("pads", {1, 1, 1, 1})}, true, "2-D 3x3 pad 1 bias"},
      {{2, 4, 6, 5},
       {4, 1, 3, 3},
       {Attribute::make_int("group", 4), ints("strides", {2, 2}),
        Attribute::make_string("auto_pad", "SAME_UPPER")},
       true,
       "2-D depthwise stride 2 SAME_UPPER bias"},
      {{1, 2, 6, 7},
       {4, 2, 2, 3},
       {ints("strides", {2, 1}), ints("dilations", {1, 2}),
        Attribute::make_string("auto_pad", "SAME_LOWER")},
       false,
       "2-D strides (2,1) dilations (1,2) SAME_LOWER"},
      {{1, 2, 5, 5},
       {3, 2, 3, 3},
       {Attribute::make_string("auto_pad", "VALID")},
       true,
       "2-D VALID"},
      {{1, 2, 4, 4, 4},
       {2, 1, 2, 3, 2},
       {Attribute::make_int("group", 2), ints("pads", {1, 0, 1, 0, 1, 0})},
       true,
       "3-D group 2 asymmetric pads"},
  };
  uint64_t seed = 1;
  for (const ConvSpec& s : specs) {
    run(window_case("Conv", s, seed));
    seed += 3;
  }
  run(window_case("Conv", specs[2], 100, kF32));
  run(window_case("Conv", specs[3], 103, kF32));
}

TEST(NnGrad, ConvTranspose) {
  const std::vector<ConvSpec> specs{
      {{2, 3, 4}, {3, 2, 3}, {ints("strides", {2})}, true, "1-D stride 2 bias"},
      {{2, 4, 3, 3},
       {4, 2, 3, 3},
       {Attribute::make_int("group", 2), ints("strides", {2, 2}), ints("pads", {1, 0, 1, 1}),
        ints("output_padding", {1, 0})},
       true,
       "2-D group 2 stride 2 pads output_padding"},
      {{1, 3, 3, 4},
       {3, 1, 3, 2},
       {Attribute::make_int("group", 3), ints("dilations", {2, 1}), ints("strides", {1, 2})},
       false,
       "2-D depthwise dilations (2,1) strides (1,2)"},
      {{2, 2, 3, 3},
       {2, 2, 2, 2},
       {ints("strides", {2, 2}), ints("output_shape", {7, 6})},
       false,
       "2-D output_shape (7,6)"},
      {{1, 2, 3, 3},
       {2, 2, 3, 3},
       {ints("strides", {2, 2}), Attribute::make_string("auto_pad", "SAME_UPPER")},
       true,
       "2-D SAME_UPPER"},
      {{1, 2, 2, 3, 2}, {2, 2, 2, 2, 2}, {ints("strides", {2, 1, 2})}, true, "3-D"},
  };
  uint64_t seed = 200;
  for (const ConvSpec& s : specs) {
    run(window_case("ConvTranspose", s, seed));
    seed += 3;
  }
  run(window_case("ConvTranspose", specs[1], 300, kF32));
}

GradCase pool(const char* op, std::vector<int64_t> x, std::vector<Attribute> attrs,
              const std::string& label, uint64_t seed, DataType dt = kF64, int outputs = 1) {
  GradCase c;
  c.op_type = op;
  c.opset = 12;
  c.label = std::string(op) + " " + label + (dt == kF32 ? " f32" : "");
  c.attributes = std::move(attrs);
  c.inputs = {GradInput{std::string(op) == "MaxPool" ? distinct(std::move(x), seed, dt)
                                                     : rnd(std::move(x), seed, -1, 1, dt)}};
  c.num_outputs = outputs;
  c.loss_outputs = {0};
  return c;
}

TEST(NnGrad, MaxPool) {
  run(pool("MaxPool", {2, 3, 6, 6}, {ints("kernel_shape", {2, 2}), ints("strides", {2, 2})},
           "2x2 stride 2", 1));
  run(pool("MaxPool", {2, 2, 7, 7},
           {ints("kernel_shape", {3, 3}), ints("strides", {2, 2}), ints("pads", {1, 1, 1, 1})},
           "3x3 stride 2 pad 1 (ResNet stem)", 2, kF64, 2));
  run(pool("MaxPool", {1, 2, 8},
           {ints("kernel_shape", {2}), ints("strides", {2}), ints("dilations", {2}),
            Attribute::make_int("ceil_mode", 1)},
           "1-D dilation 2 ceil_mode", 3));
  run(pool("MaxPool", {1, 2, 5, 6},
           {ints("kernel_shape", {3, 2}), ints("strides", {2, 2}),
            Attribute::make_string("auto_pad", "SAME_LOWER")},
           "SAME_LOWER", 4));
  run(pool("MaxPool", {1, 2, 4, 4, 5},
           {ints("kernel_shape", {2, 2, 3}), ints("strides", {2, 2, 2}),
            Attribute::make_int("ceil_mode", 1)},
           "3-D ceil_mode", 5));
  run(pool("MaxPool", {2, 3, 6, 6}, {ints("kernel_shape", {2, 2}), ints("strides", {2, 2})},
           "2x2 stride 2", 6, kF32));
}

TEST(NnGrad, AveragePool) {
  run(pool("AveragePool", {2, 3, 6, 6}, {ints("kernel_shape", {2, 2}), ints("strides", {2, 2})},
           "2x2 stride 2", 11));
  run(pool("AveragePool", {2, 2, 5, 5},
           {ints("kernel_shape", {3, 3}), ints("strides", {2, 2}), ints("pads", {1, 1, 1, 1}),
            Attribute::make_int("count_include_pad", 1)},
           "3x3 pad 1 count_include_pad", 12));
  run(pool("AveragePool", {2, 2, 5, 5},
           {ints("kernel_shape", {3, 3}), ints("strides", {2, 2}), ints("pads", {1, 1, 1, 1})},
           "3x3 pad 1 excluding pads", 13));
  run(pool("AveragePool", {1, 2, 6, 6},
           {ints("kernel_shape", {3, 3}), ints("strides", {2, 2}), ints("pads", {1, 0, 1, 0}),
            Attribute::make_int("ceil_mode", 1), Attribute::make_int("count_include_pad", 1)},
           "ceil_mode count_include_pad", 14));
  run(pool("AveragePool", {1, 2, 7},
           {ints("kernel_shape", {3}), ints("strides", {2}),
            Attribute::make_string("auto_pad", "SAME_UPPER")},
           "1-D SAME_UPPER", 15));
  run(pool("AveragePool", {1, 2, 4, 4, 4}, {ints("kernel_shape", {2, 2, 2})}, "3-D", 16));
  run(pool("AveragePool", {2, 3, 6, 6}, {ints("kernel_shape", {3, 3}), ints("strides", {1, 1})},
           "3x3", 17, kF32));
}

TEST(NnGrad, GlobalPools) {
  uint64_t seed = 40;
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    for (const std::vector<int64_t>& x :
         {std::vector<int64_t>{2, 3, 5}, std::vector<int64_t>{2, 3, 4, 4},
          std::vector<int64_t>{1, 2, 2, 3, 2}}) {
      GradCase c;
      c.op_type = op;
      c.label = std::string(op) + " rank " + std::to_string(x.size());
      c.inputs = {GradInput{distinct(x, seed++)}};
      run(c);
    }
    GradCase c;
    c.op_type = op;
    c.label = std::string(op) + " f32";
    c.inputs = {GradInput{distinct({2, 4, 3, 3}, seed++, kF32)}};
    run(c);
  }
}

// inputs: X, scale, B, mean, var; the statistics inputs are never differentiated.
GradCase batch_norm(std::vector<int64_t> x, int64_t opset, bool training, uint64_t seed,
                    DataType dt = kF64) {
  GradCase c;
  c.op_type = "BatchNormalization";
  c.opset = opset;
  c.label = "BatchNormalization rank " + std::to_string(x.size()) + " opset " +
            std::to_string(opset) + (training ? " training" : " inference") +
            (dt == kF32 ? " f32" : "");
  const std::vector<int64_t> p{x[1]};
  c.inputs = {GradInput{rnd(x, seed, -1, 2, dt)}, GradInput{rnd(p, seed + 1, 0.5, 1.5, dt)},
              GradInput{rnd(p, seed + 2, -1, 1, dt)}, GradInput{rnd(p, seed + 3, -1, 1, dt), false},
              GradInput{rnd(p, seed + 4, 0.5, 1.5, dt), false}};
  c.attributes = {Attribute::make_float("epsilon", 1e-3f)};
  if (opset >= 14) {
    c.attributes.push_back(Attribute::make_int("training_mode", training ? 1 : 0));
    c.num_outputs = training ? 3 : 1;
  } else {
    c.num_outputs = training ? 5 : 1;
  }
  c.loss_outputs = {0};  // the statistics outputs carry no gradient
  return c;
}

// Resize is linear in X for every mode, so central differences are exact up to rounding:
// dX (ai.onnxtrain.ResizeGrad, the transpose of the interpolation) for linear / nearest / cubic,
// up- and downsampling, scales and sizes, the coordinate transformations, antialias with axes
// (opset 18), a resized leading axis (no identity prefix to split the scatter over), the crop's
// extrapolated region (no gradient), and Upsample-9.
TEST(NnGrad, Resize) {
  auto f64s = [](std::vector<double> v) {
    const auto n = static_cast<int64_t>(v.size());
    return GradInput{Tensor::from_vector(kF64, {n}, v), false, true};
  };
  auto sizes = [](std::vector<int64_t> v) {
    const auto n = static_cast<int64_t>(v.size());
    return GradInput{Tensor::from_vector(DataType::kInt64, {n}, v), false, true};
  };
  const GradInput none{std::nullopt, false, false};
  struct Spec {
    std::vector<int64_t> x;
    std::vector<Attribute> attrs;
    GradInput roi, scales, size;
    int64_t opset;
    const char* label;
  };
  auto str = [](const char* k, const char* v) { return Attribute::make_string(k, v); };
  const std::vector<Spec> specs = {
      {{2, 2, 3, 3},
       {str("mode", "linear")},
       none,
       f64s({1, 1, 2, 2}),
       none,
       13,
       "linear half_pixel x2"},
      {{1, 2, 3, 4},
       {str("mode", "linear"), str("coordinate_transformation_mode", "align_corners")},
       none,
       none,
       sizes({1, 2, 5, 3}),
       13,
       "linear align_corners sizes"},
      {{1, 2, 4, 6},
       {str("mode", "nearest"), str("coordinate_transformation_mode", "asymmetric"),
        str("nearest_mode", "floor")},
       none,
       f64s({1, 1, 0.5, 0.5}),
       none,
       13,
       "nearest asymmetric /2"},
      {{1, 1, 4, 4}, {str("mode", "nearest")}, none, f64s({1, 1, 2, 3}), none, 13, "nearest x2 x3"},
      {{1, 2, 3, 3},
       {str("mode", "cubic"), Attribute::make_int("exclude_outside", 1)},
       none,
       f64s({1, 1, 1.5, 1.5}),
       none,
       13,
       "cubic exclude_outside x1.5"},
      {{1, 2, 6, 5},
       {str("mode", "linear"), Attribute::make_int("antialias", 1),
        Attribute::make_ints("axes", {2, 3})},
       none,
       f64s({0.5, 0.6}),
       none,
       18,
       "linear antialias axes /2"},
      {{3, 2, 2},
       {str("mode", "linear")},
       none,
       f64s({2, 1, 1.5}),
       none,
       13,
       "linear resized leading axis"},
      {{1, 1, 4, 4},
       {str("mode", "linear"), str("coordinate_transformation_mode", "tf_crop_and_resize"),
        Attribute::make_float("extrapolation_value", 0.25f)},
       f64s({0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3}),
       none,
       sizes({1, 1, 3, 5}),
       13,
       "tf_crop_and_resize extrapolated"},
  };
  uint64_t seed = 900;
  for (const Spec& sp : specs) {
    GradCase c;
    c.op_type = "Resize";
    c.opset = sp.opset;
    c.label = std::string("Resize ") + sp.label;
    c.attributes = sp.attrs;
    c.inputs = {GradInput{rnd(sp.x, seed++, -1, 1, kF64)}, sp.roi, sp.scales, sp.size};
    run(c);
  }
  GradCase up;
  up.op_type = "Upsample";
  up.opset = 9;
  up.label = "Upsample-9 linear x2";
  up.attributes = {str("mode", "linear")};
  up.inputs = {GradInput{rnd({1, 2, 3, 3}, seed++, -1, 1, kF64)}, f64s({1, 1, 2, 2})};
  run(up);
  GradCase f32;
  f32.op_type = "Resize";
  f32.label = "Resize linear x2 f32";
  f32.attributes = {str("mode", "linear")};
  f32.inputs = {
      GradInput{rnd({1, 3, 4, 4}, seed++, -1, 1, kF32)}, none,
      GradInput{Tensor::from_vector(kF32, {4}, std::vector<float>{1, 1, 2, 2}), false, true}, none};
  run(f32);
}

// An LSTM (gates 4, states h and c) or GRU (gates 3, state h) case: every input's gradient,
// Y and every state output in the loss.
struct RnnSpec {
  const char* direction;
  int64_t layout;
  bool bias_and_state;
  DataType dt;
  // false: the node writes no Y, so the gradient recomputes the states step by step (with Y:
  // one product over all steps from Y's states).
  bool y = true;
  int64_t batch = 2;
  int threads = 1;  // GradCase::threads
};

GradCase rnn_case(const char* op, int64_t gates, int states, const RnnSpec& sp, uint64_t seed,
                  std::vector<Attribute> extra) {
  const int64_t steps = 3, batch = sp.batch, input = 3, hidden = 2;
  const int64_t d = std::string(sp.direction) == "bidirectional" ? 2 : 1;
  GradCase c;
  c.threads = sp.threads;
  c.op_type = op;
  c.opset = 14;
  c.num_outputs = 1 + states;
  c.label = std::string(op) + " " + sp.direction + " layout " + std::to_string(sp.layout) +
            (sp.bias_and_state ? "" : " no B / initial state") + (sp.dt == kF32 ? " f32" : "") +
            (sp.y ? "" : " no Y") +
            (sp.threads > 1 ? " batch " + std::to_string(batch) + " on " +
                                  std::to_string(sp.threads) + " threads"
                            : "");
  if (!sp.y) c.absent_outputs = {0};
  c.attributes = {Attribute::make_int("hidden_size", hidden),
                  Attribute::make_string("direction", sp.direction),
                  Attribute::make_int("layout", sp.layout)};
  for (Attribute& a : extra) c.attributes.push_back(std::move(a));
  const std::vector<int64_t> x = sp.layout ? std::vector<int64_t>{batch, steps, input}
                                           : std::vector<int64_t>{steps, batch, input};
  const std::vector<int64_t> state =
      sp.layout ? std::vector<int64_t>{batch, d, hidden} : std::vector<int64_t>{d, batch, hidden};
  c.inputs = {GradInput{rnd(x, seed, -1, 1, sp.dt)},
              GradInput{rnd({d, gates * hidden, input}, seed + 1, -0.8, 0.8, sp.dt)},
              GradInput{rnd({d, gates * hidden, hidden}, seed + 2, -0.8, 0.8, sp.dt)}};
  if (sp.bias_and_state) {
    c.inputs.push_back(GradInput{rnd({d, 2 * gates * hidden}, seed + 3, -0.5, 0.5, sp.dt)});
    c.inputs.push_back(GradInput{std::nullopt, false, false});  // sequence_lens
    for (int k = 0; k < states; ++k)
      c.inputs.push_back(
          GradInput{rnd(state, seed + 4 + static_cast<uint64_t>(k), -0.5, 0.5, sp.dt)});
  }
  return c;
}

// LSTM, RNN and GRU through time (ai.onnxtrain LSTMGrad / RNNGrad / GRUGrad: the gates recomputed,
// then backpropagation through time): forward, reverse and bidirectional, batch-first layout,
// without bias and initial states, f32. GRU with linear_before_reset = 1 (torch's). The cases
// on 2 threads run the per-step products and row loops split between two threads.
TEST(NnGrad, LSTM) {
  uint64_t seed = 950;
  for (const RnnSpec& sp :
       {RnnSpec{"forward", 0, true, kF64}, RnnSpec{"reverse", 0, true, kF64},
        RnnSpec{"bidirectional", 0, true, kF64}, RnnSpec{"bidirectional", 1, true, kF64},
        RnnSpec{"forward", 0, false, kF64}, RnnSpec{"forward", 0, true, kF32},
        RnnSpec{"bidirectional", 0, true, kF64, false}, RnnSpec{"reverse", 1, true, kF32, false},
        // 5 rows split 2 + 3 by the row loops.
        RnnSpec{"bidirectional", 0, true, kF64, true, 5, 2},
        RnnSpec{"forward", 1, true, kF64, false, 5, 2},
        RnnSpec{"reverse", 0, true, kF32, true, 4, 2}}) {
    run(rnn_case("LSTM", 4, 2, sp, seed, {}));
    // The same with passes::keep_lstm_traces: the gradient reads the forward's trace.
    if (sp.y) {
      GradCase traced = rnn_case("LSTM", 4, 2, sp, seed, {});
      traced.label += " (trace kept)";
      traced.after_autodiff = [](graph::Model& m) {
        EXPECT_EQ(passes::keep_lstm_traces(m), 1);
        int traces = 0;
        for (const auto& n : m.graph->nodes()) traces += n->op_type == "LSTMTraining";
        EXPECT_EQ(traces, 1);
      };
      run(traced);
    }
    seed += 6;
  }
}

TEST(NnGrad, RNN) {
  uint64_t seed = 1020;
  for (const RnnSpec& sp :
       {RnnSpec{"forward", 0, true, kF64}, RnnSpec{"reverse", 1, true, kF64},
        RnnSpec{"bidirectional", 0, false, kF64}, RnnSpec{"bidirectional", 0, true, kF32},
        RnnSpec{"bidirectional", 1, true, kF64, false},
        RnnSpec{"bidirectional", 0, true, kF64, true, 5, 2},
        RnnSpec{"reverse", 1, true, kF64, false, 4, 2}}) {
    run(rnn_case("RNN", 1, 1, sp, seed, {}));
    seed += 5;
  }
}

TEST(NnGrad, GRU) {
  uint64_t seed = 990;
  for (const RnnSpec& sp :
       {RnnSpec{"forward", 0, true, kF64}, RnnSpec{"reverse", 0, true, kF64},
        RnnSpec{"bidirectional", 1, true, kF64}, RnnSpec{"forward", 0, false, kF64},
        RnnSpec{"bidirectional", 0, true, kF32}, RnnSpec{"bidirectional", 0, true, kF64, false},
        RnnSpec{"bidirectional", 0, true, kF64, true, 5, 2},
        RnnSpec{"forward", 1, true, kF64, false, 4, 2}}) {
    run(rnn_case("GRU", 3, 1, sp, seed, {Attribute::make_int("linear_before_reset", 1)}));
    seed += 5;
  }
}

TEST(NnGrad, BatchNormalization) {
  uint64_t seed = 60;
  for (const std::vector<int64_t>& x :
       {std::vector<int64_t>{4, 3}, std::vector<int64_t>{2, 3, 5}, std::vector<int64_t>{2, 2, 3, 3},
        std::vector<int64_t>{2, 2, 2, 2, 2}}) {
    run(batch_norm(x, 15, true, seed));
    run(batch_norm(x, 15, false, seed + 5));
    seed += 10;
  }
  run(batch_norm({2, 3, 2, 2}, 12, true, 100));
  run(batch_norm({2, 3, 2, 2}, 9, false, 105));
  run(batch_norm({4, 3, 3, 3}, 15, true, 110, kF32));
}

}  // namespace
}  // namespace onnxtrain
