// The finite-difference harness of tests/grad (gradcheck.h), a library: the gradcheck binary
// (gradcheck_main.cc) and the plugin tests link it.
#include "tests/grad/gradcheck.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "graph/error.h"
#include "ops/elementwise/dtypes.h"
#include "ops/op_api.h"
#include "passes/passes.h"
#include "runtime/device/device.h"
#include "runtime/session.h"

namespace onnxtrain::testing {
namespace {

using graph::DataType;
using graph::Tensor;
using graph::Value;

std::set<std::string>& checked_rules() {
  static std::set<std::string> s;
  return s;
}

bool is_float(DataType dt) { return dt == DataType::kFloat || dt == DataType::kDouble; }

double get(const Tensor& t, int64_t i) {
  return t.dtype() == DataType::kDouble ? t.data_as<double>()[i] : t.data_as<float>()[i];
}
void set(Tensor& t, int64_t i, double v) {
  if (t.dtype() == DataType::kDouble)
    t.mutable_data_as<double>()[i] = v;
  else
    t.mutable_data_as<float>()[i] = static_cast<float>(v);
}

uint64_t hash_label(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The one-node model with its scalar loss L = sum_k ReduceSum(Y_k * R_k) (in float64).
struct Harness {
  std::unique_ptr<graph::Model> model;
  std::map<std::string, Tensor> feeds;   // graph inputs
  std::vector<std::string> checked;      // names of the inputs whose gradient is compared
};

Harness build(const GradCase& c) {
  Harness h;
  h.model = std::make_unique<graph::Model>();
  h.model->set_opset("", c.opset);
  h.model->set_opset(ops::kOnnxtrainDomain, 1);
  if (!c.domain.empty()) h.model->set_opset(c.domain, 1);
  graph::Graph& g = *h.model->graph;
  std::vector<Value*> ins;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    const GradInput& in = c.inputs[k];
    if (!in.value) {
      ins.push_back(nullptr);
      continue;
    }
    const std::string name = cat("x", k);
    if (in.constant) {
      ins.push_back(g.add_initializer(name, *in.value));
      continue;
    }
    ins.push_back(g.add_input(name, graph::ValueType::tensor(in.value->dtype(),
                                                             graph::make_shape(in.value->dims()))));
    h.feeds[name] = *in.value;
    if (in.check && is_float(in.value->dtype())) h.checked.push_back(name);
  }
  std::vector<std::string> outs;
  for (int k = 0; k < c.num_outputs; ++k)
    outs.push_back(std::count(c.absent_outputs.begin(), c.absent_outputs.end(), k) ? ""
                                                                                   : cat("y", k));
  graph::Node* n = g.add_node(c.op_type, ins, outs, "op", c.domain);
  for (const graph::Attribute& a : c.attributes) n->set_attr(a);
  passes::infer_shapes(*h.model);

  std::vector<int> loss_outputs = c.loss_outputs;
  if (loss_outputs.empty())
    for (int k = 0; k < c.num_outputs; ++k)
      if (n->output(k) && is_float(n->output(k)->dtype())) loss_outputs.push_back(k);
  OT_CHECK(!loss_outputs.empty(), c.label, ": no float output to build the loss on");
  std::mt19937_64 rng(hash_label(c.label));
  std::vector<Value*> terms;
  for (int k : loss_outputs) {
    Value* y = n->output(k);
    OT_CHECK(y->shape(), c.label, ": output ", k, " has no inferred shape");
    std::vector<int64_t> dims;
    for (const graph::Dim& d : *y->shape()) {
      OT_CHECK(d.is_known(), c.label, ": output ", k, " has an unknown dim");
      dims.push_back(d.value);
    }
    Value* r = g.add_initializer(cat("r", k), random_tensor(y->dtype(), dims, rng(), -1, 1));
    Value* prod = g.add_node("Mul", {y, r}, {cat("p", k)})->output(0);
    Value* sum = g.add_node("ReduceSum", {prod}, {cat("s", k)})->output(0);
    g.find_value(cat("s", k))->producer()->set_attr(graph::Attribute::make_int("keepdims", 0));
    if (y->dtype() != DataType::kDouble) {
      graph::Node* cast = g.add_node("Cast", {sum}, {cat("sd", k)});
      cast->set_attr(graph::Attribute::make_int("to", static_cast<int64_t>(DataType::kDouble)));
      sum = cast->output(0);
    }
    terms.push_back(sum);
  }
  Value* loss = terms.size() == 1 ? g.add_node("Identity", terms, {"loss"})->output(0)
                                  : g.add_node("Sum", terms, {"loss"})->output(0);
  passes::infer_shapes(*h.model);
  g.set_outputs({loss});
  return h;
}

double run_loss(runtime::InferenceSession& s, const std::map<std::string, Tensor>& feeds) {
  std::vector<Tensor> out = s.run(feeds);
  return out.at(0).data_as<double>()[0];
}

}  // namespace

std::string gradient_rule_key(const std::string& domain, const std::string& op_type) {
  return domain.empty() || domain == "ai.onnx" ? op_type : domain + "." + op_type;
}

const std::set<std::string>& checked_gradient_rules() { return checked_rules(); }

Tensor random_tensor(DataType dt, std::vector<int64_t> dims, uint64_t seed, double lo, double hi) {
  Tensor t(dt, std::move(dims));
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) set(t, i, u(gen));
  return t;
}

Tensor int64_tensor(std::vector<int64_t> dims, std::vector<int64_t> values) {
  return Tensor::from_vector(DataType::kInt64, std::move(dims), values);
}

std::shared_ptr<runtime::Device> test_device() {
  static const std::shared_ptr<runtime::Device> device = [] {
    const char* spec = std::getenv("ONNXTRAIN_TEST_DEVICE");
    // Finite differences need full float32 products: TF32 rounds the inputs to 10 mantissa
    // bits, far coarser than the step (on an H200 f32 MatMul/Gemm checks were 20 % off).
    runtime::set_cuda_tf32(false);
    return runtime::make_device(spec && *spec ? spec : "cpu");
  }();
  return device;
}

GradReport check_gradient(const GradCase& c) {
  GradReport report;
  Harness h = build(c);
  OT_CHECK(!h.checked.empty(), c.label, ": no float input to check");
  runtime::SessionOptions so;
  so.threads = c.threads;
  so.device = test_device();
  runtime::InferenceSession forward(h.model->clone(), so);

  std::unique_ptr<graph::Model> train = h.model->clone();
  passes::GradientInfo gi = passes::autodiff(*train, "loss", h.checked);
  passes::infer_shapes(*train);
  if (c.after_autodiff) {
    c.after_autodiff(*train);
    passes::infer_shapes(*train);
  }
  std::vector<Value*> outs{train->graph->find_value("loss")};
  for (const std::string& name : h.checked) outs.push_back(train->graph->find_value(gi.grads.at(name)));
  train->graph->set_outputs(outs);
  passes::dce(*train);
  runtime::InferenceSession backward(std::move(train), so);
  std::vector<Tensor> analytic = backward.run(h.feeds);
  checked_rules().insert(gradient_rule_key(c.domain, c.op_type));

  for (size_t k = 0; k < h.checked.size(); ++k) {
    const std::string& name = h.checked[k];
    const Tensor& a = analytic.at(k + 1);
    Tensor x = h.feeds.at(name);
    const bool dbl = x.dtype() == DataType::kDouble;
    const double eps = c.eps > 0 ? c.eps : (dbl ? 1e-6 : 1e-3);
    const double rtol = c.rtol > 0 ? c.rtol : (dbl ? 1e-5 : 2e-2);
    const double atol = c.atol > 0 ? c.atol : (dbl ? 1e-7 : 2e-3);
    EXPECT_EQ(a.dims(), x.dims()) << c.label << ": gradient of input " << name << " has other dims";
    if (a.dims() != x.dims()) continue;
    // Every element for small inputs, a fixed random sample of 64 for big ones.
    std::vector<int64_t> idx;
    if (x.numel() <= 256) {
      for (int64_t i = 0; i < x.numel(); ++i) idx.push_back(i);
    } else {
      std::mt19937_64 rng(hash_label(c.label) + k);
      for (int i = 0; i < 64; ++i) idx.push_back(static_cast<int64_t>(rng() % x.numel()));
    }
    std::map<std::string, Tensor> feeds = h.feeds;
    double worst = -1;
    std::string worst_msg;
    for (int64_t i : idx) {
      Tensor xp = x;  // copy-on-write: set() detaches it from x
      const double x0 = get(x, i);
      set(xp, i, x0 + eps);
      feeds[name] = xp;
      const double lp = run_loss(forward, feeds);
      Tensor xm = x;
      set(xm, i, x0 - eps);
      feeds[name] = xm;
      const double lm = run_loss(forward, feeds);
      // The step actually taken (float32 rounds x0 +- eps).
      const double step = get(xp, i) - get(xm, i);
      const double numeric = (lp - lm) / step;
      const double analytic_v = get(a, i);
      const double err = std::abs(analytic_v - numeric);
      const double allowed = atol + rtol * std::abs(numeric);
      ++report.elements_checked;
      report.max_abs_err = std::max(report.max_abs_err, err);
      if (std::abs(numeric) > 0) report.max_rel_err = std::max(report.max_rel_err, err / std::abs(numeric));
      if (err > allowed && err - allowed > worst) {
        worst = err - allowed;
        worst_msg = cat(c.label, ": d loss / d ", name, "[", i, "]: analytic ", analytic_v,
                        ", numeric ", numeric, " (|diff| ", err, " > ", allowed, ")");
      }
    }
    feeds[name] = x;
    if (worst >= 0) ADD_FAILURE() << worst_msg;
  }
  return report;
}

namespace {

// Every float32 input of `c` rounded to `low` (nearest even), so the low-precision copies the
// autocast graph makes hold exactly the values the float32 graph reads.
GradCase representable(GradCase c, DataType low) {
  for (GradInput& in : c.inputs) {
    if (!in.value || in.value->dtype() != DataType::kFloat) continue;
    Tensor t = *in.value;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const auto f = static_cast<float>(get(t, i));
      float r = f;
      if (low == DataType::kBFloat16) {
        uint32_t u = std::bit_cast<uint32_t>(f);
        u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
        r = std::bit_cast<float>(u);
      } else {
        r = static_cast<float>(ops::ew::Half(f));
      }
      set(t, i, r);
    }
    in.value = std::move(t);
  }
  return c;
}

// The analytic gradients of `h` (float32 or autocast), loss first.
std::vector<Tensor> analytic_gradients(const Harness& h, std::unique_ptr<graph::Model> m) {
  runtime::SessionOptions so;
  so.threads = 1;
  so.device = test_device();
  passes::GradientInfo gi = passes::autodiff(*m, "loss", h.checked);
  passes::infer_shapes(*m);
  std::vector<Value*> outs{m->graph->find_value("loss")};
  for (const std::string& name : h.checked) outs.push_back(m->graph->find_value(gi.grads.at(name)));
  m->graph->set_outputs(outs);
  passes::dce(*m);
  runtime::InferenceSession s(std::move(m), so);
  return s.run(h.feeds);
}

}  // namespace

GradReport check_low_precision(const GradCase& c, DataType low, double rtol) {
  GradReport report;
  const GradCase rc = representable(c, low);
  Harness h = build(rc);
  OT_CHECK(!h.checked.empty(), c.label, ": no float input to check");
  for (const auto& [name, t] : h.feeds)
    OT_CHECK(t.dtype() == DataType::kFloat, c.label, ": low-precision checks take float32 inputs");
  std::unique_ptr<graph::Model> cast = h.model->clone();
  const passes::AutocastInfo info = passes::autocast(*cast, low, {});
  passes::infer_shapes(*cast);
  EXPECT_EQ(info.low_nodes, 1) << c.label << ": autocast left the op in float32";
  const std::vector<Tensor> ref = analytic_gradients(h, h.model->clone());
  const std::vector<Tensor> got = analytic_gradients(h, std::move(cast));
  for (size_t k = 1; k < ref.size(); ++k) {
    const Tensor& a = got.at(k);
    const Tensor& r = ref.at(k);
    EXPECT_EQ(a.dtype(), DataType::kFloat) << c.label << ": the gradient of " << h.checked[k - 1]
                                           << " must come back as float32";
    EXPECT_EQ(a.dims(), r.dims()) << c.label;
    if (a.dims() != r.dims()) continue;
    double scale = 0;
    for (int64_t i = 0; i < r.numel(); ++i) scale = std::max(scale, std::abs(get(r, i)));
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      const double err = std::abs(get(a, i) - get(r, i));
      if (err > worst) worst = err, at = i;
      ++report.elements_checked;
    }
    report.max_abs_err = std::max(report.max_abs_err, worst);
    if (scale > 0) report.max_rel_err = std::max(report.max_rel_err, worst / scale);
    EXPECT_LE(worst, rtol * scale) << c.label << ": d loss / d " << h.checked[k - 1] << "[" << at
                                   << "]: " << graph::dtype_short_name(low) << " " << get(a, at)
                                   << ", float32 " << get(r, at) << " (largest |grad| " << scale
                                   << ")";
  }
  return report;
}

}  // namespace onnxtrain::testing
