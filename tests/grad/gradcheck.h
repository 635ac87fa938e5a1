// Finite-difference gradient checks for one op's gradient rule.
//
// check_gradient builds a one-node model (the op under test, its inputs as graph inputs or
// initializers), a scalar loss = sum_k ReduceSum(output_k * R_k) with fixed random R_k for
// every float output, runs passes::autodiff w.r.t. the checked inputs, executes the backward
// graph with the runtime and compares each analytic gradient element with the central
// difference (L(x + eps) - L(x - eps)) / 2eps of the forward graph. float64 inputs use
// eps 1e-6 and tight tolerances; float32 inputs eps 1e-3 and looser ones.
// Every rule checked is recorded; the gradcheck binary's main (gradcheck_main.cc) prints
// "gradcheck: N gradient rules checked" and fails when a registered gradient rule was never
// checked. Other test binaries (tests/plugin) link the harness as library onnxtrain_gradcheck.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "graph/tensor.h"
#include "runtime/device/device.h"

namespace onnxtrain::testing {

struct GradInput {
  std::optional<graph::Tensor> value;  // nullopt: an omitted optional input
  bool check = true;      // compare its gradient (float inputs only)
  bool constant = false;  // an initializer (shape/axes inputs) rather than a graph input
};

struct GradCase {
  std::string op_type;
  std::string domain;  // "" = ai.onnx
  int64_t opset = 17;
  std::vector<graph::Attribute> attributes;
  std::vector<GradInput> inputs;
  int num_outputs = 1;
  std::vector<int> loss_outputs;  // outputs that enter the loss; empty = every float output
  std::vector<int> absent_outputs;  // outputs the node does not write (empty names)
  double eps = 0;                 // 0: by dtype
  double rtol = 0, atol = 0;      // 0: by dtype
  std::string label;              // shown on failure, e.g. "Conv 3x3 stride 2 group 2"
  // Runs on the gradient graph after autodiff (and infer_shapes): a training pass whose rewrite
  // the check then covers (e.g. passes::keep_lstm_traces).
  std::function<void(graph::Model&)> after_autodiff;
  // Intra-op threads of the sessions that run the forward and the gradient (a kernel's
  // parallel split is then checked too).
  int threads = 1;
};

struct GradReport {
  int elements_checked = 0;
  double max_abs_err = 0, max_rel_err = 0;
};

// Runs the check; ADD_FAILURE()s (gtest) with the worst element on a mismatch and returns
// the report. Throws onnxtrain::Error when the graph cannot be built or run.
// The device the checks run on: ONNXTRAIN_TEST_DEVICE (cpu | sim | cuda[:N]; default cpu).
std::shared_ptr<runtime::Device> test_device();

GradReport check_gradient(const GradCase& c);

// Mixed precision's check (passes::autocast): the case's float32 inputs rounded to `low`
// (bf16 / f16), the op's analytic gradients with the op autocast to `low` against the float32
// graph's, every element within rtol x the largest float32 gradient (low precision's rounding
// of the inputs' copies, the output and its gradient; accumulation stays float32 in oneDNN).
GradReport check_low_precision(const GradCase& c, graph::DataType low, double rtol);

// "Op" for ai.onnx, "domain.Op" otherwise: how checked rules are keyed.
std::string gradient_rule_key(const std::string& domain, const std::string& op_type);
// Keys of the rules check_gradient has run in this process.
const std::set<std::string>& checked_gradient_rules();

// Random tensors for cases (deterministic per seed).
graph::Tensor random_tensor(graph::DataType dt, std::vector<int64_t> dims, uint64_t seed,
                            double lo = -1.0, double hi = 1.0);
graph::Tensor int64_tensor(std::vector<int64_t> dims, std::vector<int64_t> values);

// random_tensor with the cases' defaults: uniform in [lo, hi), float64.
inline graph::Tensor rnd(std::vector<int64_t> dims, uint64_t seed, double lo = -1.0,
                         double hi = 1.0, graph::DataType dt = graph::DataType::kDouble) {
  return random_tensor(dt, std::move(dims), seed, lo, hi);
}

// Case inputs: a graph input whose gradient is compared, one that is fed but not compared, an
// initializer (shapes, axes), an omitted optional input, an int64 vector initializer.
inline GradInput checked(graph::Tensor t) { return GradInput{std::move(t), true, false}; }
inline GradInput unchecked(graph::Tensor t) { return GradInput{std::move(t), false, false}; }
inline GradInput constant(graph::Tensor t) { return GradInput{std::move(t), false, true}; }
inline GradInput omitted() { return GradInput{std::nullopt, false, false}; }
inline GradInput ints(std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return constant(int64_tensor({n}, std::move(v)));
}

// `rank` dims drawn uniformly from [lo, hi].
inline std::vector<int64_t> random_dims(std::mt19937& rng, int rank, int64_t lo = 1, int64_t hi = 4) {
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<int64_t> dims;
  for (int k = 0; k < rank; ++k) dims.push_back(d(rng));
  return dims;
}

}  // namespace onnxtrain::testing
