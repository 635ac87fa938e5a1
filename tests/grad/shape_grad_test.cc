// Finite-difference checks of the shape ops' gradient rules (Reshape, Flatten, Squeeze,
// Unsqueeze, Transpose, DepthToSpace, SpaceToDepth, Concat, Split, Slice, Gather, GatherND,
// GatherElements, ScatterND, ScatterElements, Expand, Pad, Tile) over random shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "graph/tensor.h"
#include "tests/grad/gradcheck.h"

namespace onnxtrain::testing {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;


int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t k = 0; k < dims.size(); ++k) s += (k ? "," : "") + std::to_string(dims[k]);
  return s + ")";
}

GradCase one_input(const char* op, Tensor x, int64_t opset, std::string label) {
  GradCase c;
  c.op_type = op;
  c.opset = opset;
  c.inputs = {checked(std::move(x))};
  c.label = std::string(op) + " " + std::move(label);
  return c;
}

TEST(ShapeGrad, Reshape) {
  for (uint64_t s = 0; s < 4; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    const auto dims = random_dims(rng, static_cast<int>(pick(rng, 1, 4)));
    const int64_t n = std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
    GradCase c = one_input("Reshape", random_tensor(DataType::kDouble, dims, s), 14,
                           dims_str(dims) + " -> (-1, 1)");
    c.inputs.push_back(ints({n == 1 ? 1 : -1, 1}));
    check_gradient(c);
  }
}

TEST(ShapeGrad, Flatten) {
  for (uint64_t s = 10; s < 14; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    const int rank = static_cast<int>(pick(rng, 1, 4));
    const auto dims = random_dims(rng, rank);
    const int64_t axis = pick(rng, -rank, rank);
    GradCase c = one_input("Flatten", random_tensor(DataType::kDouble, dims, s), 13,
                           dims_str(dims) + " axis " + std::to_string(axis));
    c.attributes = {Attribute::make_int("axis", axis)};
    check_gradient(c);
  }
}

TEST(ShapeGrad, SqueezeUnsqueeze) {
  // Squeeze opset 13 (axes input) and 11 (attribute) of the size-1 dims.
  for (int64_t opset : {11, 13}) {
    GradCase c = one_input("Squeeze", random_tensor(DataType::kDouble, {2, 1, 3, 1}, 20), opset,
                           "(2,1,3,1) axes (1,-1)");
    if (opset >= 13)
      c.inputs.push_back(ints({1, -1}));
    else
      c.attributes = {Attribute::make_ints("axes", {1, -1})};
    check_gradient(c);
    GradCase u = one_input("Unsqueeze", random_tensor(DataType::kDouble, {3, 2}, 21), opset,
                           "(3,2) axes (0,-1)");
    if (opset >= 13)
      u.inputs.push_back(ints({0, -1}));
    else
      u.attributes = {Attribute::make_ints("axes", {0, -1})};
    check_gradient(u);
  }
  check_gradient(one_input("Squeeze", random_tensor(DataType::kFloat, {1, 4, 1}, 22), 13,
                           "(1,4,1) all"));
}

TEST(ShapeGrad, Transpose) {
  for (uint64_t s = 30; s < 35; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    const int rank = static_cast<int>(pick(rng, 1, 5));
    const auto dims = random_dims(rng, rank);
    std::vector<int64_t> perm(static_cast<size_t>(rank));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    GradCase c = one_input("Transpose", random_tensor(DataType::kDouble, dims, s), 13,
                           dims_str(dims) + " perm " + dims_str(perm));
    c.attributes = {Attribute::make_ints("perm", perm)};
    check_gradient(c);
  }
  check_gradient(one_input("Transpose", random_tensor(DataType::kFloat, {2, 3, 4}, 36), 13,
                           "(2,3,4) reversed"));
}

// DepthToSpace (PixelShuffle exports as mode CRD) and SpaceToDepth are permutations: their
// gradients (ai.onnxtrain ...Grad) permute dY back.
TEST(ShapeGrad, DepthToSpaceSpaceToDepth) {
  for (const char* mode : {"DCR", "CRD"}) {
    GradCase c = one_input("DepthToSpace", random_tensor(DataType::kDouble, {2, 8, 2, 3}, 40), 13,
                           std::string("(2,8,2,3) blocksize 2 ") + mode);
    c.attributes = {Attribute::make_int("blocksize", 2), Attribute::make_string("mode", mode)};
    check_gradient(c);
  }
  GradCase s2d = one_input("SpaceToDepth", random_tensor(DataType::kDouble, {2, 3, 6, 3}, 41), 13,
                           "(2,3,6,3) blocksize 3");
  s2d.attributes = {Attribute::make_int("blocksize", 3)};
  check_gradient(s2d);
  GradCase f32 = one_input("DepthToSpace", random_tensor(DataType::kFloat, {1, 9, 2, 2}, 42), 13,
                           "f32 (1,9,2,2) blocksize 3 CRD");
  f32.attributes = {Attribute::make_int("blocksize", 3), Attribute::make_string("mode", "CRD")};
  check_gradient(f32);
}

TEST(ShapeGrad, Concat) {
  for (uint64_t s = 40; s < 45; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    const int rank = static_cast<int>(pick(rng, 1, 3));
    const auto base = random_dims(rng, rank);
    const int64_t axis = pick(rng, -rank, rank - 1);
    const auto a = static_cast<size_t>(axis < 0 ? axis + rank : axis);
    GradCase c;
    c.op_type = "Concat";
    c.opset = s % 2 ? 13 : 11;
    c.attributes = {Attribute::make_int("axis", axis)};
    c.label = "Concat " + dims_str(base) + " axis " + std::to_string(axis);
    for (int i = 0; i < 3; ++i) {
      auto dims = base;
      dims[a] = pick(rng, 1, 3);
      c.inputs.push_back(checked(random_tensor(DataType::kDouble, dims, s * 10 + i)));
    }
    check_gradient(c);
  }
}

TEST(ShapeGrad, Split) {
  // Opset 13 with the split input; outputs 0 and 2 enter the loss, so output 1's gradient is
  // missing and the rule fills zeros.
  GradCase c = one_input("Split", random_tensor(DataType::kDouble, {2, 6, 3}, 50), 13,
                         "(2,6,3) axis 1 split (1,3,2) outputs 0,2");
  c.inputs.push_back(ints({1, 3, 2}));
  c.attributes = {Attribute::make_int("axis", 1)};
  c.num_outputs = 3;
  c.loss_outputs = {0, 2};
  check_gradient(c);
  GradCase e = one_input("Split", random_tensor(DataType::kFloat, {4, 3}, 51), 11,
                         "(4,3) axis -2 equal halves");
  e.attributes = {Attribute::make_int("axis", -2)};
  e.num_outputs = 2;
  check_gradient(e);
}

TEST(ShapeGrad, Slice) {
  for (uint64_t s = 60; s < 66; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    const int rank = static_cast<int>(pick(rng, 1, 3));
    const auto dims = random_dims(rng, rank, 2, 5);
    std::vector<int64_t> starts, ends, axes, steps;
    for (int k = 0; k < rank; ++k) {
      if (rng() % 3 == 0) continue;  // leave some axes whole
      const int64_t d = dims[static_cast<size_t>(k)];
      const int64_t step = (rng() % 2 ? 1 : -1) * pick(rng, 1, 2);
      if (step > 0) {
        starts.push_back(pick(rng, -d, d - 1));
        ends.push_back(rng() % 4 == 0 ? INT64_MAX : pick(rng, 0, d));
      } else {
        starts.push_back(pick(rng, 0, d - 1) + (rng() % 2 ? 0 : d));  // clamped when >= d
        ends.push_back(rng() % 4 == 0 ? INT64_MIN : pick(rng, -d - 1, d - 1));
      }
      axes.push_back(rng() % 2 ? k : k - rank);
      steps.push_back(step);
    }
    if (axes.empty()) {
      starts = {1};
      ends = {dims[0]};
      axes = {0};
      steps = {1};
    }
    GradCase c = one_input("Slice", random_tensor(DataType::kDouble, dims, s), 13,
                           dims_str(dims) + " starts " + dims_str(starts) + " ends " +
                               dims_str(ends) + " axes " + dims_str(axes) + " steps " +
                               dims_str(steps));
    c.inputs.push_back(ints(starts));
    c.inputs.push_back(ints(ends));
    c.inputs.push_back(ints(axes));
    c.inputs.push_back(ints(steps));
    check_gradient(c);
  }
  // Opset 9: starts/ends/axes as attributes.
  GradCase old = one_input("Slice", random_tensor(DataType::kFloat, {3, 4}, 67), 9,
                           "(3,4) opset 9 [1:3, 0:-1]");
  old.attributes = {Attribute::make_ints("starts", {1, 0}), Attribute::make_ints("ends", {3, -1})};
  check_gradient(old);
}

TEST(ShapeGrad, Gather) {
  for (uint64_t s = 70; s < 75; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    const int rank = static_cast<int>(pick(rng, 1, 3));
    const auto dims = random_dims(rng, rank, 2, 4);
    const int64_t axis = pick(rng, -rank, rank - 1);
    const int64_t d = dims[static_cast<size_t>(axis < 0 ? axis + rank : axis)];
    // Repeated and negative indices; a 2-D index tensor every other case.
    std::vector<int64_t> idx_dims = s % 2 ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{4};
    std::vector<int64_t> idx;
    const int64_t count = s % 2 ? 6 : 4;
    for (int64_t k = 0; k < count; ++k) idx.push_back(pick(rng, -d, d - 1));
    idx[1] = idx[0];
    GradCase c = one_input("Gather", random_tensor(DataType::kDouble, dims, s), 13,
                           dims_str(dims) + " axis " + std::to_string(axis) + " indices " +
                               dims_str(idx));
    c.attributes = {Attribute::make_int("axis", axis)};
    c.inputs.push_back(constant(int64_tensor(idx_dims, idx)));
    check_gradient(c);
  }
  GradCase scalar = one_input("Gather", random_tensor(DataType::kFloat, {3, 2}, 76), 13,
                              "(3,2) scalar index");
  scalar.inputs.push_back(constant(int64_tensor({}, {2})));
  check_gradient(scalar);
}

TEST(ShapeGrad, GatherND) {
  // Full tuples (m = rank: single elements), partial tuples (m = 1: rows) with a repeated and a
  // negative index, and batch_dims 1 (GPT-2's last-token pick: logits[b, idx[b]]).
  GradCase elems = one_input("GatherND", random_tensor(DataType::kDouble, {3, 4}, 90), 13,
                             "(3,4) by (2,2) tuples, one repeated");
  elems.inputs.push_back(constant(int64_tensor({3, 2}, {0, 1, 2, 3, 0, 1})));
  check_gradient(elems);
  GradCase rows = one_input("GatherND", random_tensor(DataType::kDouble, {4, 3, 2}, 91), 13,
                            "(4,3,2) rows 1, -1, 1");
  rows.inputs.push_back(constant(int64_tensor({3, 1}, {1, -1, 1})));
  check_gradient(rows);
  GradCase batched = one_input("GatherND", random_tensor(DataType::kFloat, {2, 5, 3}, 92), 13,
                               "(2,5,3) batch_dims 1");
  batched.attributes = {Attribute::make_int("batch_dims", 1)};
  batched.inputs.push_back(constant(int64_tensor({2, 1}, {4, 2})));
  check_gradient(batched);
}

TEST(ShapeGrad, ScatterND) {
  // data and updates both checked: single elements of (3,4), then whole rows of (4,3,2) (Swin's
  // x[:, a:b] = v as torch exports it); a negative index.
  GradCase elems;
  elems.op_type = "ScatterND";
  elems.opset = 16;
  elems.label = "(3,4) <- 3 elements";
  elems.inputs = {checked(random_tensor(DataType::kDouble, {3, 4}, 95)),
                  constant(int64_tensor({3, 2}, {0, 1, 2, 3, -1, 0})),
                  checked(random_tensor(DataType::kDouble, {3}, 96))};
  check_gradient(elems);
  GradCase rows = elems;
  rows.label = "(4,3,2) <- rows 1, 3";
  rows.inputs = {checked(random_tensor(DataType::kFloat, {4, 3, 2}, 97)),
                 constant(int64_tensor({2, 1}, {1, 3})),
                 checked(random_tensor(DataType::kFloat, {2, 3, 2}, 98))};
  check_gradient(rows);
}

TEST(ShapeGrad, GatherElements) {
  // Axis 0 and axis 1 of (3,4) with repeated and negative indices (their gradients add up), an
  // index tensor smaller than the data along the other axis too, and float32 with axis -1.
  GradCase rows = one_input("GatherElements", random_tensor(DataType::kDouble, {3, 4}, 110), 13,
                            "(3,4) axis 0 by (2,4), repeated and negative");
  rows.inputs.push_back(constant(int64_tensor({2, 4}, {0, -1, 2, 1, 0, 2, -3, 1})));
  check_gradient(rows);
  GradCase cols = one_input("GatherElements", random_tensor(DataType::kDouble, {3, 4}, 111), 11,
                            "(3,4) axis 1 by (2,5), repeated");
  cols.attributes = {Attribute::make_int("axis", 1)};
  cols.inputs.push_back(constant(int64_tensor({2, 5}, {3, 3, 0, -1, 1, 2, 0, 0, 2, -4})));
  check_gradient(cols);
  GradCase f32 = one_input("GatherElements", random_tensor(DataType::kFloat, {2, 3, 4}, 112), 13,
                           "f32 (2,3,4) axis -1 by (2,3,2)");
  f32.attributes = {Attribute::make_int("axis", -1)};
  f32.inputs.push_back(constant(int64_tensor({2, 3, 2}, {0, 3, 1, 1, 2, -1, 3, 0, 0, 0, -2, 1})));
  check_gradient(f32);
}

TEST(ShapeGrad, ScatterElements) {
  // reduction none with unique indices (axis 0, and axis 1 with a negative index), then add with
  // repeated indices (torch's scatter_add_); data and updates both checked.
  GradCase none;
  none.op_type = "ScatterElements";
  none.opset = 16;
  none.label = "(3,4) axis 0 <- (2,3) unique";
  none.inputs = {checked(random_tensor(DataType::kDouble, {3, 4}, 120)),
                 constant(int64_tensor({2, 3}, {1, 0, 2, 2, -1, 0})),
                 checked(random_tensor(DataType::kDouble, {2, 3}, 121))};
  check_gradient(none);
  GradCase cols = none;
  cols.opset = 13;
  cols.label = "(3,4) axis 1 <- (3,2) unique, negative";
  cols.attributes = {Attribute::make_int("axis", 1)};
  cols.inputs = {checked(random_tensor(DataType::kDouble, {3, 4}, 122)),
                 constant(int64_tensor({3, 2}, {0, 3, -1, 1, 2, 0})),
                 checked(random_tensor(DataType::kDouble, {3, 2}, 123))};
  check_gradient(cols);
  GradCase add = none;
  add.label = "add (2,4,3) axis -2 <- (2,3,3) repeated";
  add.attributes = {Attribute::make_int("axis", -2), Attribute::make_string("reduction", "add")};
  add.inputs = {checked(random_tensor(DataType::kDouble, {2, 4, 3}, 124)),
                constant(int64_tensor({2, 3, 3}, {0, 1, 1, 0, 1, 3, 0, -1, 2,  //
                                                  2, 2, 2, 3, 0, 2, 2, 0, 1})),
                checked(random_tensor(DataType::kDouble, {2, 3, 3}, 125))};
  check_gradient(add);
  GradCase f32 = add;
  f32.label = "f32 add (4,3) axis 0 <- (5,3) repeated";
  f32.attributes = {Attribute::make_string("reduction", "add")};
  f32.inputs = {checked(random_tensor(DataType::kFloat, {4, 3}, 126)),
                constant(int64_tensor({5, 3}, {0, 1, 2, 3, 3, 3, 0, 0, -1, 1, 2, 3, 0, 1, 2})),
                checked(random_tensor(DataType::kFloat, {5, 3}, 127))};
  check_gradient(f32);
  // mul / max / min have no rule: refused with the node named.
  GradCase mul = add;
  mul.attributes = {Attribute::make_string("reduction", "mul")};
  try {
    check_gradient(mul);
    ADD_FAILURE() << "reduction mul was differentiated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no gradient for ScatterElements reduction 'mul'"),
              std::string::npos)
        << e.what();
  }
}

TEST(ShapeGrad, Expand) {
  GradCase a = one_input("Expand", random_tensor(DataType::kDouble, {3, 1}, 80), 13,
                         "(3,1) -> (2,3,4)");
  a.inputs.push_back(ints({2, 3, 4}));
  check_gradient(a);
  GradCase b = one_input("Expand", random_tensor(DataType::kDouble, {1, 4}, 81), 13,
                         "(1,4) -> (3,1)");
  b.inputs.push_back(ints({3, 1}));
  check_gradient(b);
  GradCase f = one_input("Expand", random_tensor(DataType::kFloat, {2, 1, 3}, 82), 13,
                         "(2,1,3) -> (2,5,3)");
  f.inputs.push_back(ints({2, 5, 3}));
  check_gradient(f);
}

TEST(ShapeGrad, Tile) {
  for (uint64_t s = 90; s < 94; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    const int rank = static_cast<int>(pick(rng, 1, 3));
    const auto dims = random_dims(rng, rank, 1, 3);
    const auto repeats = random_dims(rng, rank, 1, 3);
    GradCase c = one_input("Tile", random_tensor(DataType::kDouble, dims, s), s % 2 ? 13 : 11,
                           dims_str(dims) + " repeats " + dims_str(repeats));
    c.inputs.push_back(ints(repeats));
    check_gradient(c);
  }
}

TEST(ShapeGrad, Pad) {
  // Positive pads, negative pads (crop) and mixed; pads as an input (13) and attribute (10).
  GradCase a = one_input("Pad", random_tensor(DataType::kDouble, {2, 3}, 100), 13,
                         "(2,3) pads (1,0,2,1)");
  a.inputs.push_back(ints({1, 0, 2, 1}));
  check_gradient(a);
  GradCase b = one_input("Pad", random_tensor(DataType::kDouble, {3, 4, 2}, 101), 13,
                         "(3,4,2) pads (-1,1,0,0,-2,1) value 0.5");
  b.inputs.push_back(ints({-1, 1, 0, 0, -2, 1}));
  b.inputs.push_back(constant(Tensor::from_vector(DataType::kDouble, {}, std::vector<double>{0.5})));
  check_gradient(b);
  GradCase c = one_input("Pad", random_tensor(DataType::kFloat, {2, 2}, 102), 10,
                         "(2,2) opset 10 pads (0,1,1,0)");
  c.attributes = {Attribute::make_ints("pads", {0, 1, 1, 0})};
  check_gradient(c);
  GradCase d = one_input("Pad", random_tensor(DataType::kDouble, {2, 3, 2}, 103), 18,
                         "(2,3,2) opset 18 axes (-2) pads (2,1)");
  d.inputs.push_back(ints({2, 1}));
  d.inputs.push_back(GradInput{std::nullopt, false, false});
  d.inputs.push_back(ints({-2}));
  check_gradient(d);
}

// Edge, reflect and wrap (ai.onnxtrain.PadGrad): every padded element's gradient goes back to
// the element it copies; pads wider than the axis (reflect's period 2 (c - 1), wrap's c), a
// one-element axis (reflect pads it like edge), crops next to pads, axes (18), attribute (10).
TEST(ShapeGrad, PadEdgeReflectWrap) {
  uint64_t seed = 110;
  for (const char* mode : {"edge", "reflect", "wrap"}) {
    GradCase a = one_input("Pad", random_tensor(DataType::kDouble, {2, 3, 4}, seed++), 13,
                           std::string(mode) + " (2,3,4) pads (0,2,1,1,4,3)");
    a.attributes = {Attribute::make_string("mode", mode)};
    a.inputs.push_back(ints({0, 2, 1, 1, 4, 3}));
    check_gradient(a);
    GradCase b = one_input("Pad", random_tensor(DataType::kDouble, {3, 5}, seed++), 13,
                           std::string(mode) + " (3,5) pads (1,-1,2,-2) crop and pad");
    b.attributes = {Attribute::make_string("mode", mode)};
    b.inputs.push_back(ints({1, -1, 2, -2}));
    check_gradient(b);
    GradCase c = one_input("Pad", random_tensor(DataType::kFloat, {2, 1, 3}, seed++), 10,
                           std::string(mode) + " (2,1,3) opset 10 one-element axis");
    c.attributes = {Attribute::make_string("mode", mode),
                    Attribute::make_ints("pads", {0, 2, 1, 0, 1, 2})};
    check_gradient(c);
    GradCase d = one_input("Pad", random_tensor(DataType::kDouble, {2, 3, 3}, seed++), 18,
                           std::string(mode) + " (2,3,3) opset 18 axes (-1, 1) pads (5,1,0,2)");
    d.attributes = {Attribute::make_string("mode", mode)};
    d.inputs.push_back(ints({5, 1, 0, 2}));
    d.inputs.push_back(GradInput{std::nullopt, false, false});
    d.inputs.push_back(ints({-1, 1}));
    check_gradient(d);
  }
}

}  // namespace
}  // namespace onnxtrain::testing
