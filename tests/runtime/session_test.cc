// The executor on test-local ops (domain "test"): plan caching per shape signature, constant
// folding, buffer reuse by liveness, run-time shapes, input checks, unsupported-op reporting,
// outputs written over inputs (training state in place) and deferred (asynchronous) kernels.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <thread>

#include "graph/error.h"
#include "ops/op_api.h"
#include "ops/shape_util.h"
#include "runtime/comm/in_process.h"
#include "runtime/session.h"

namespace onnxtrain::runtime {
namespace {

using graph::DataType;
using graph::Tensor;
using graph::ValueType;

// Kernels of sessions running in several threads (the AllReduce test) log here: under a lock.
std::atomic<int> g_scale_runs = 0;
std::mutex g_log_mutex;
std::vector<std::string> g_log;  // kernel events in execution order

void log_event(std::string event) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log.push_back(std::move(event));
}

// test.Scale<k>(x) = k * x, float32, same shape.
class ScaleKernel : public ops::Kernel {
 public:
  explicit ScaleKernel(const graph::Node& n) : k_(n.attr_float("k", 1.f)) {}
  void run(ops::KernelContext& ctx) override {
    ++g_scale_runs;
    log_event("scale " + ctx.node().name);
    const ops::TensorView& x = *ctx.input(0);
    ops::TensorView& y = ctx.output(0);
    ctx.parallel_for(x.numel(), 1024, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y.as<float>()[i] = k_ * x.as<float>()[i];
    });
  }

 private:
  float k_;
};

ONNXTRAIN_REGISTER_OP(test_scale) {
  ops::OpSchema s;
  s.domain = "test";
  s.op_type = "Scale";
  s.infer = [](ops::InferenceContext& c) { ops::propagate_type(c); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ScaleKernel>(n); };
  return s;
}

// test.ScaleInPlace: Scale whose output may share the input's buffer (OpSchema::inplace).
ONNXTRAIN_REGISTER_OP(test_scale_in_place) {
  ops::OpSchema s;
  s.domain = "test";
  s.op_type = "ScaleInPlace";
  s.infer = [](ops::InferenceContext& c) { ops::propagate_type(c); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ScaleKernel>(n); };
  s.inplace = [](const graph::Node&, int output) { return output == 0 ? 0 : -1; };
  return s;
}

// test.AddOneLater(x) = x + 1, written only when the executor completes it (KernelContext::defer_completion),
// as an asynchronous collective would.
class AddOneLaterKernel : public ops::Kernel {
 public:
  void run(ops::KernelContext& ctx) override {
    log_event("start " + ctx.node().name);
    const ops::TensorView& x = *ctx.input(0);
    std::vector<float> v(x.as<float>(), x.as<float>() + x.numel());
    float* y = ctx.output(0).as<float>();
    ctx.defer_completion([v, y, name = ctx.node().name] {
      log_event("finish " + name);
      for (size_t i = 0; i < v.size(); ++i) y[i] = v[i] + 1;
    });
  }
};

ONNXTRAIN_REGISTER_OP(test_add_one_later) {
  ops::OpSchema s;
  s.domain = "test";
  s.op_type = "AddOneLater";
  s.infer = [](ops::InferenceContext& c) { ops::propagate_type(c); };
  s.cpu_kernel = [](const graph::Node&) { return std::make_unique<AddOneLaterKernel>(); };
  s.foldable = false;
  return s;
}

// test.Head(x): the first ceil(n/2) elements of a 1-D tensor; dims computed by the kernel only
// (stands in for data-dependent ops like NonZero).
class HeadKernel : public ops::Kernel {
 public:
  void run(ops::KernelContext& ctx) override {
    const ops::TensorView& x = *ctx.input(0);
    int64_t n = (x.numel() + 1) / 2;
    int64_t dims[] = {n};
    ops::TensorView& y = ctx.output(0, dims);
    for (int64_t i = 0; i < n; ++i) y.as<float>()[i] = x.as<float>()[i];
  }
};

ONNXTRAIN_REGISTER_OP(test_head) {
  ops::OpSchema s;
  s.domain = "test";
  s.op_type = "Head";
  s.infer = [](ops::InferenceContext& c) {
    ops::set_output(c, 0, DataType::kFloat, graph::Shape{graph::Dim{}});
  };
  s.cpu_kernel = [](const graph::Node&) { return std::make_unique<HeadKernel>(); };
  return s;
}

// test.Scratch<bytes, persistent>(x) = x: asks for `bytes` of scratch in prepare() and run()
// (KernelContext::persistent_scratch when `persistent`), fills it and records where it was.
std::vector<std::byte*> g_scratch;
class ScratchKernel : public ops::Kernel {
 public:
  explicit ScratchKernel(const graph::Node& n)
      : bytes_(static_cast<size_t>(n.attr_int("bytes", 0))),
        persistent_(n.attr_int("persistent", 0) != 0) {}
  void prepare(ops::KernelContext& ctx) override { get(ctx); }
  void run(ops::KernelContext& ctx) override {
    auto* p = get(ctx);
    std::memset(p, 0x5a, bytes_);
    g_scratch.push_back(p);
    const ops::TensorView& x = *ctx.input(0);
    std::memcpy(ctx.output(0).data, x.data, x.nbytes());
  }

 private:
  std::byte* get(ops::KernelContext& ctx) {
    return static_cast<std::byte*>(persistent_ ? ctx.persistent_scratch(bytes_)
                                               : ctx.scratch(bytes_));
  }
  size_t bytes_;
  bool persistent_;
};

ONNXTRAIN_REGISTER_OP(test_scratch) {
  ops::OpSchema s;
  s.domain = "test";
  s.op_type = "Scratch";
  s.infer = [](ops::InferenceContext& c) { ops::propagate_type(c); };
  s.cpu_kernel = [](const graph::Node& n) { return std::make_unique<ScratchKernel>(n); };
  return s;
}

// test.PackedDouble(x0, x1, ...) = (2 x0, 2 x1, ...), asking for its inputs as one block
// (OpSchema::packed_inputs). It records whether each input sat at its packed offset from the
// first and each output over its input.
std::vector<bool> g_packed_seen;
class PackedDoubleKernel : public ops::Kernel {
 public:
  void run(ops::KernelContext& ctx) override {
    const auto* base = static_cast<const std::byte*>(ctx.input(0)->data);
    size_t offset = 0;
    bool packed = true;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const ops::TensorView& x = *ctx.input(i);
      ops::TensorView& y = ctx.output(i, x.dims);
      packed = packed && x.data == base + offset && y.data == x.data;
      offset += ops::packed_input_bytes(x.nbytes());
      std::vector<float> v(x.as<float>(), x.as<float>() + x.numel());
      for (int64_t j = 0; j < x.numel(); ++j) y.as<float>()[j] = 2 * v[static_cast<size_t>(j)];
    }
    g_packed_seen.push_back(packed);
  }
};

ONNXTRAIN_REGISTER_OP(test_packed_double) {
  ops::OpSchema s;
  s.domain = "test";
  s.op_type = "PackedDouble";
  s.infer = [](ops::InferenceContext& c) {
    for (size_t i = 0; i < c.node.inputs().size(); ++i) ops::propagate_type(c, i, i);
  };
  s.cpu_kernel = [](const graph::Node&) { return std::make_unique<PackedDoubleKernel>(); };
  s.packed_inputs = [](const graph::Node&) { return true; };
  return s;
}

// x -> Scratch(bytes[0]) -> Scratch(bytes[1]) -> ... (persistent where `persistent` says).
std::unique_ptr<graph::Model> scratch_model(const std::vector<int64_t>& bytes,
                                            const std::vector<int>& persistent) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  m->set_opset("test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* v = g.add_input("x", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::symbol("N")}));
  for (size_t i = 0; i < bytes.size(); ++i) {
    graph::Node* n = g.add_node("Scratch", {v}, {cat("t", i)}, cat("scratch", i), "test");
    n->set_attr(graph::Attribute::make_int("bytes", bytes[i]));
    n->set_attr(graph::Attribute::make_int("persistent", persistent[i]));
    v = n->output(0);
  }
  g.add_output(v);
  return m;
}

std::unique_ptr<graph::Model> chain_model(int length) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  m->set_opset("test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* v = g.add_input("x", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::symbol("N")}));
  for (int i = 0; i < length; ++i) {
    graph::Node* n = g.add_node("Scale", {v}, {cat("s", i)}, cat("scale", i), "test");
    n->set_attr(graph::Attribute::make_float("k", 2.f));
    v = n->output(0);
  }
  g.add_output(v);
  return m;
}

Tensor vec(std::vector<float> v) {
  return Tensor::from_vector<float>(DataType::kFloat, {static_cast<int64_t>(v.size())}, v);
}

TEST(Session, RunsAChainAndReusesBuffers) {
  InferenceSession s(chain_model(6));
  auto out = s.run({{"x", vec({1, 2, 3})}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{3}));
  EXPECT_FLOAT_EQ(out[0].data_as<float>()[2], 3.f * 64);
  const PlanStats& st = s.last_plan_stats();
  EXPECT_EQ(st.kernel_nodes, 6);
  // A chain needs two live buffers at a time, not six.
  EXPECT_EQ(st.unshared_bytes, 6 * 64);
  EXPECT_EQ(st.arena_bytes, 2 * 64);
}

TEST(Session, CachesOnePlanPerShapeSignature) {
  InferenceSession s(chain_model(2));
  s.run({{"x", vec({1, 2})}});
  s.run({{"x", vec({3, 4})}});
  EXPECT_EQ(s.cached_plans(), 1u);
  auto out = s.run({{"x", vec({1, 2, 3, 4, 5})}});
  EXPECT_EQ(s.cached_plans(), 2u);
  EXPECT_FLOAT_EQ(out[0].data_as<float>()[4], 20.f);
}

// Issue #18: the host kernels' scratch is one workspace per plan, as large as the largest
// request (not the sum, which per-node scratch took: 1.1 GB of ResNet-50's training step);
// persistent scratch stays per node.
TEST(Session, HostKernelsShareOneWorkspaceSizedByTheLargestRequest) {
  InferenceSession s(scratch_model({1000, 5000, 3000, 700, 900}, {0, 0, 0, 1, 1}));
  g_scratch.clear();
  auto out = s.run({{"x", vec({1, 2, 3})}});
  EXPECT_FLOAT_EQ(out[0].data_as<float>()[2], 3.f);
  const PlanStats& st = s.last_plan_stats();
  EXPECT_EQ(st.workspace_bytes, 5000);
  EXPECT_EQ(st.persistent_scratch_bytes, 700 + 900);
  ASSERT_EQ(g_scratch.size(), 5u);
  EXPECT_EQ(g_scratch[0], g_scratch[1]);
  EXPECT_EQ(g_scratch[1], g_scratch[2]);
  EXPECT_NE(g_scratch[3], g_scratch[4]);
  EXPECT_NE(g_scratch[3], g_scratch[0]);
  // A second run moves nothing: the workspace was sized in prepare(), before the first run.
  s.run({{"x", vec({4, 5, 6})}});
  ASSERT_EQ(g_scratch.size(), 10u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(g_scratch[i], g_scratch[i + 5]) << i;
}

// InferenceSession::prepare builds the plan run() uses (kernels prepared, workspace sized)
// without running a kernel; the run that follows builds nothing.
TEST(Session, PrepareBuildsThePlanTheFirstRunUses) {
  InferenceSession s(scratch_model({4096, 100}, {0, 0}));
  g_scratch.clear();
  s.prepare({{"x", vec({0, 0, 0, 0})}});
  EXPECT_EQ(s.cached_plans(), 1u);
  EXPECT_TRUE(g_scratch.empty());  // no kernel ran
  EXPECT_EQ(s.last_plan_stats().workspace_bytes, 4096);
  EXPECT_EQ(s.last_plan_stats().arena_bytes, 2 * 64);  // t0 and t1, each 64-byte aligned
  auto out = s.run({{"x", vec({1, 2, 3, 4})}});
  EXPECT_EQ(s.cached_plans(), 1u);
  EXPECT_FLOAT_EQ(out[0].data_as<float>()[3], 4.f);
  // Other dims: another plan, as run() would build.
  s.prepare({{"x", vec({1, 2})}});
  EXPECT_EQ(s.cached_plans(), 2u);
}

// Plans of one session never run at once, so they share one host arena and workspace: a second
// input shape (a partial last batch) takes no second arena. Alternating shapes stays correct.
TEST(Session, PlansOfOneSessionShareTheArena) {
  InferenceSession s(chain_model(4));
  std::vector<float> big(1000, 1.f), small(10, 3.f);
  auto out = s.run({{"x", vec(big)}});
  EXPECT_EQ(s.last_plan_stats().arena_bytes, 2 * 4032);  // 4000 rounded up to 64
  EXPECT_EQ(s.shared_host_bytes(), 2 * 4032);
  out = s.run({{"x", vec(small)}});
  EXPECT_EQ(s.cached_plans(), 2u);
  EXPECT_EQ(s.last_plan_stats().arena_bytes, 2 * 64);
  EXPECT_EQ(s.shared_host_bytes(), 2 * 4032);  // not 2 * 4032 + 2 * 64
  EXPECT_FLOAT_EQ(out[0].data_as<float>()[9], 3.f * 16);
  // A larger third shape grows the one arena; the earlier plans then run in the new one.
  std::vector<float> bigger(3000, 2.f);
  out = s.run({{"x", vec(bigger)}});
  EXPECT_EQ(s.shared_host_bytes(), 2 * 12032);  // 12000 rounded up to 64
  for (int round = 0; round < 2; ++round) {
    out = s.run({{"x", vec(big)}});
    EXPECT_FLOAT_EQ(out[0].data_as<float>()[999], 16.f);
    out = s.run({{"x", vec(small)}});
    EXPECT_FLOAT_EQ(out[0].data_as<float>()[0], 48.f);
    out = s.run({{"x", vec(bigger)}});
    EXPECT_FLOAT_EQ(out[0].data_as<float>()[2999], 32.f);
  }
}

TEST(Session, FoldsNodesWhoseInputsAreConstant) {
  auto m = chain_model(1);
  graph::Graph& g = *m->graph;
  graph::Value* c = g.add_initializer("c", vec({1, 1}));
  graph::Node* n = g.add_node("Scale", {c}, {"c2"}, "fold_me", "test");
  n->set_attr(graph::Attribute::make_float("k", 5.f));
  g.add_output(n->output(0));
  InferenceSession s(std::move(m));
  g_scale_runs = 0;
  auto out = s.run({{"x", vec({1})}});
  EXPECT_EQ(s.last_plan_stats().folded_nodes, 1);
  EXPECT_EQ(g_scale_runs, 2);  // the folded node once at plan time, the other per run
  EXPECT_FLOAT_EQ(out[1].data_as<float>()[1], 5.f);
  s.run({{"x", vec({2})}});
  EXPECT_EQ(g_scale_runs, 3);
}

TEST(Session, RunTimeShapesFlowDownstream) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim{}}));
  graph::Node* h = g.add_node("Head", {x}, {"h"}, "head", "test");
  graph::Node* sc = g.add_node("Scale", {h->output(0)}, {"y"}, "scale", "test");
  sc->set_attr(graph::Attribute::make_float("k", 3.f));
  g.add_output(sc->output(0));
  InferenceSession s(std::move(m));
  auto out = s.run({{"x", vec({1, 2, 3, 4, 5})}});
  EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{3}));
  EXPECT_FLOAT_EQ(out[0].data_as<float>()[2], 9.f);
  EXPECT_EQ(s.last_plan_stats().dynamic_nodes, 2);
}

TEST(Session, InputErrorsNameTheInput) {
  InferenceSession s(chain_model(1));
  auto expect_error = [&](const std::map<std::string, Tensor>& in, const std::string& text) {
    try {
      s.run(in);
      ADD_FAILURE() << "no error, expected: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error({}, "missing inputs: 'x' [N] f32");
  expect_error({{"x", Tensor(DataType::kInt64, {2})}}, "input 'x' must be f32, got i64");
  expect_error({{"x", Tensor(DataType::kFloat, {2, 2})}}, "input 'x' must have shape [N], got [2,2]");
  expect_error({{"x", vec({1})}, {"bogus", vec({1})}}, "'bogus' is not an input");
}

TEST(Session, UnsupportedOpsAreListedBeforeRunning) {
  auto m = chain_model(1);
  graph::Graph& g = *m->graph;
  g.add_node("FancyOp", {g.inputs()[0]}, {"f1"}, "", "test");
  g.add_node("OtherOp", {g.inputs()[0]}, {"f2"});
  EXPECT_EQ(unsupported_ops(*m), (std::vector<std::string>{"OtherOp", "test.FancyOp"}));
  try {
    InferenceSession s(std::move(m));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported ops (no CPU kernel): OtherOp, test.FancyOp"),
              std::string::npos)
        << e.what();
  }
}

TEST(Session, WritesAChromeTrace) {
  auto path = std::filesystem::temp_directory_path() / "onnxtrain_session_trace.json";
  {
    SessionOptions o;
    o.profile_path = path.string();
    InferenceSession s(chain_model(3), o);
    s.run({{"x", vec({1, 2})}});
  }
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.find("\"name\":\"scale2\""), std::string::npos) << text;
  std::filesystem::remove(path);
}

// state [3] -> <op>(k=2) -> "state.updated", aliased to "state"; with `late_reader`, a Scale
// after the update reads the old state into "y".
std::unique_ptr<graph::Model> update_model(const char* op, bool late_reader) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* x = g.add_input("state", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::known(3)}));
  graph::Node* u = g.add_node(op, {x}, {"state.updated"}, "update", "test");
  u->set_attr(graph::Attribute::make_float("k", 2.f));
  g.add_output(u->output(0));
  if (late_reader) {
    graph::Node* r = g.add_node("Scale", {x}, {"y"}, "reader", "test");
    r->set_attr(graph::Attribute::make_float("k", 3.f));
    g.add_output(r->output(0));
  }
  return m;
}

SessionOptions aliasing() {
  SessionOptions o;
  o.output_aliases["state.updated"] = "state";
  return o;
}

TEST(Session, OutputAliasWritesTheInputBufferInPlace) {
  InferenceSession s(update_model("ScaleInPlace", false), aliasing());
  Tensor state = vec({1, 2, 3});
  const std::byte* buffer = state.data();
  auto out = s.run({{"state", state}});
  EXPECT_EQ(out[0].numel(), 0);  // the value is in `state`
  EXPECT_EQ(state.data(), buffer);
  EXPECT_FLOAT_EQ(state.data_as<float>()[2], 6.f);
  EXPECT_EQ(s.last_plan_stats().aliased_in_place, 1);
  EXPECT_EQ(s.last_plan_stats().aliased_copied, 0);
  EXPECT_EQ(s.last_plan_stats().arena_bytes, 0);  // no buffer for the output
  s.run({{"state", state}});
  EXPECT_FLOAT_EQ(state.data_as<float>()[0], 4.f);
}

TEST(Session, OutputAliasIsCopiedWhenALaterNodeReadsTheInput) {
  InferenceSession s(update_model("ScaleInPlace", true), aliasing());
  Tensor state = vec({1, 2, 3});
  auto out = s.run({{"state", state}});
  EXPECT_EQ(s.last_plan_stats().aliased_in_place, 0);
  EXPECT_EQ(s.last_plan_stats().aliased_copied, 1);
  EXPECT_FLOAT_EQ(out[1].data_as<float>()[1], 6.f);  // the reader saw the old state (2 x 3)
  EXPECT_FLOAT_EQ(state.data_as<float>()[1], 4.f);   // and the state is updated
}

TEST(Session, OutputAliasIsCopiedWhenTheKernelIsNotInPlace) {
  InferenceSession s(update_model("Scale", false), aliasing());
  Tensor state = vec({1, 2, 3});
  s.run({{"state", state}});
  EXPECT_EQ(s.last_plan_stats().aliased_copied, 1);
  EXPECT_FLOAT_EQ(state.data_as<float>()[2], 6.f);
}

TEST(Session, OutputAliasErrorsNameTheValues) {
  SessionOptions o;
  o.output_aliases["state.updated"] = "nope";
  InferenceSession s(update_model("Scale", false), o);
  try {
    s.run({{"state", vec({1, 2, 3})}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope' is not a graph input"), std::string::npos) << e.what();
  }
}

TEST(Session, DeferredOutputsCompleteBeforeTheirFirstReader) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::known(2)}));
  graph::Node* d = g.add_node("AddOneLater", {x}, {"d"}, "later", "test");
  graph::Node* a = g.add_node("Scale", {x}, {"a"}, "independent", "test");
  graph::Node* e = g.add_node("Scale", {d->output(0)}, {"e"}, "reader", "test");
  graph::Node* d2 = g.add_node("AddOneLater", {x}, {"d2"}, "unread", "test");
  for (graph::Node* n : {a, e}) n->set_attr(graph::Attribute::make_float("k", 10.f));
  for (graph::Node* n : {a, e, d2}) g.add_output(n->output(0));
  InferenceSession s(std::move(m));
  g_log.clear();
  auto out = s.run({{"x", vec({1, 2})}});
  EXPECT_EQ(g_log, (std::vector<std::string>{"start later", "scale independent", "finish later",
                                              "scale reader", "start unread", "finish unread"}));
  EXPECT_FLOAT_EQ(out[1].data_as<float>()[1], 30.f);  // (2 + 1) x 10
  EXPECT_FLOAT_EQ(out[2].data_as<float>()[0], 2.f);   // completed at the end of the run
}

// a [3], b [17] (each Scale k=1 of an input) -> PackedDouble -> Scale k=10 each -> outputs; with
// `late_reader` a Scale after PackedDouble also reads `a`; with `input_operand` PackedDouble reads
// the graph input xb itself instead of b.
std::unique_ptr<graph::Model> packed_model(bool late_reader, bool input_operand) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* xa = g.add_input("xa", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::known(3)}));
  graph::Value* xb = g.add_input("xb", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::known(17)}));
  graph::Value* a = g.add_node("Scale", {xa}, {"a"}, "make_a", "test")->output(0);
  graph::Value* b = input_operand ? xb : g.add_node("Scale", {xb}, {"b"}, "make_b", "test")->output(0);
  graph::Node* p = g.add_node("PackedDouble", {a, b}, {"a2", "b2"}, "packed", "test");
  for (int i = 0; i < 2; ++i) {
    graph::Node* r = g.add_node("Scale", {p->output(i)}, {cat("y", i)}, cat("read", i), "test");
    r->set_attr(graph::Attribute::make_float("k", 10.f));
    g.add_output(r->output(0));
  }
  if (late_reader) g.add_output(g.add_node("Scale", {a}, {"late"}, "late_reader", "test")->output(0));
  return m;
}

TEST(Session, PackedInputsSitBackToBackWithTheOutputsOverThem) {
  std::vector<float> b(17);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i);
  for (const bool late : {false, true})
    for (const bool input_operand : {false, true}) {
      SCOPED_TRACE(cat("late reader ", late, ", graph input operand ", input_operand));
      InferenceSession s(packed_model(late, input_operand));
      g_packed_seen.clear();
      auto out = s.run({{"xa", vec({1, 2, 3})}, {"xb", vec(b)}});
      auto again = s.run({{"xa", vec({1, 2, 3})}, {"xb", vec(b)}});
      const bool expect_packed = !late && !input_operand;
      EXPECT_EQ(s.last_plan_stats().packed_blocks, expect_packed ? 1 : 0);
      EXPECT_EQ(g_packed_seen, std::vector<bool>(2, expect_packed));
      EXPECT_FLOAT_EQ(out[0].data_as<float>()[2], 60.f);
      EXPECT_FLOAT_EQ(out[1].data_as<float>()[16], 320.f);
      EXPECT_FLOAT_EQ(again[1].data_as<float>()[5], 100.f);
      if (late) {
        EXPECT_FLOAT_EQ(out[2].data_as<float>()[1], 2.f);  // the late reader saw a, not 2a
      }
    }
}

// Views (OpSchema::view: Identity, Reshape, ...) are placed over their input, so a chain of them
// is one buffer, live until the last reader of any value in it: x [16] -> a = 2x -> v, w
// (Identity views of a) -> three fresh [16] buffers made from x (which would take a's space were
// it freed after the views) -> y = 3w. A view that is a graph output is not placed over its
// input. (With a's buffer freed after its last own reader, c1 takes its space and y reads 15x:
// tried.)
TEST(Session, ViewsShareTheirInputsBufferAndKeepItLive) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  m->set_opset("test", 1);
  graph::Graph& g = *m->graph;
  graph::Value* x =
      g.add_input("x", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::known(16)}));
  auto scale = [&](graph::Value* in, float k, const std::string& name) {
    graph::Node* n = g.add_node("Scale", {in}, {name}, "make_" + name, "test");
    n->set_attr(graph::Attribute::make_float("k", k));
    return n->output(0);
  };
  graph::Value* a = scale(x, 2, "a");
  graph::Value* v = g.add_node("Identity", {a}, {"v"}, "view_v")->output(0);
  graph::Value* w = g.add_node("Identity", {v}, {"w"}, "view_w")->output(0);
  graph::Value* shown = g.add_node("Identity", {a}, {"shown"}, "output_view")->output(0);
  graph::Value* c = scale(scale(scale(x, 5, "c1"), 1, "c2"), 1, "c3");
  graph::Value* y = scale(w, 3, "y");
  for (graph::Value* o : {y, c, shown}) g.add_output(o);
  InferenceSession s(std::move(m));
  std::vector<float> in(16);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 1;
  for (int run = 0; run < 2; ++run) {
    const auto out = s.run({{"x", vec(in)}});
    EXPECT_EQ(s.last_plan_stats().view_nodes, 2);
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_FLOAT_EQ(out[0].data_as<float>()[i], 6 * in[i]) << "y = 3 w, element " << i;
      EXPECT_FLOAT_EQ(out[1].data_as<float>()[i], 5 * in[i]) << "c, element " << i;
      EXPECT_FLOAT_EQ(out[2].data_as<float>()[i], 2 * in[i]) << "shown, element " << i;
    }
  }
}

// Two ranks, one session each, reduce a [3] and b [17] through ai.onnxtrain.AllReduce: in place
// on the packed gradients, or (a read again after the reduction) through the kernel's own packed
// copy. Both give the rank-order sum, the same on every rank.
TEST(Session, AllReduceInPlaceAndCopiedGiveTheSameSums) {
  for (const bool late : {false, true}) {
    SCOPED_TRACE(cat("late reader ", late));
    InProcessGroup group(2);
    std::vector<std::vector<Tensor>> outs(2);
    std::vector<int> blocks(2, -1);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          auto m = std::make_unique<graph::Model>();
          m->set_opset("test", 1);
          m->set_opset(ops::kOnnxtrainDomain, 1);
          graph::Graph& g = *m->graph;
          graph::Value* xa = g.add_input("xa", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::known(3)}));
          graph::Value* xb = g.add_input("xb", ValueType::tensor(DataType::kFloat, graph::Shape{graph::Dim::known(17)}));
          graph::Value* a = g.add_node("Scale", {xa}, {"a"}, "make_a", "test")->output(0);
          graph::Value* b = g.add_node("Scale", {xb}, {"b"}, "make_b", "test")->output(0);
          graph::Node* ar = g.add_node("AllReduce", {a, b}, {"a_sum", "b_sum"}, "allreduce",
                                       ops::kOnnxtrainDomain);
          ar->set_attr(graph::Attribute::make_int("replicas", 1));
          for (int i = 0; i < 2; ++i) {
            graph::Node* n = g.add_node("Scale", {ar->output(i)}, {cat("y", i)}, cat("read", i), "test");
            g.add_output(n->output(0));
          }
          if (late) g.add_output(g.add_node("Scale", {a}, {"late"}, "late_reader", "test")->output(0));
          SessionOptions o;
          o.communicator = &group.communicator(r);
          InferenceSession s(std::move(m), o);
          std::vector<float> va(3), vb(17);
          for (int i = 0; i < 3; ++i) va[i] = 0.1f * static_cast<float>(i + 1) + static_cast<float>(r);
          for (int i = 0; i < 17; ++i) vb[i] = 1.0f / static_cast<float>(i + 1 + 7 * r);
          outs[r] = s.run({{"xa", vec(va)}, {"xb", vec(vb)}});
          blocks[r] = s.last_plan_stats().packed_blocks;
        } catch (const std::exception& e) {
          errors[r] = e.what();
          group.abort(e.what());
        }
      });
    for (auto& t : threads) t.join();
    ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << errors[1];
    EXPECT_EQ(blocks, std::vector<int>(2, late ? 0 : 1));
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(outs[r][0].data_as<float>()[i],
                  (0.1f * static_cast<float>(i + 1)) + (0.1f * static_cast<float>(i + 1) + 1.f));
      for (int i = 0; i < 17; ++i)
        EXPECT_EQ(outs[r][1].data_as<float>()[i],
                  1.0f / static_cast<float>(i + 1) + 1.0f / static_cast<float>(i + 8));
      if (late) {
        EXPECT_FLOAT_EQ(outs[r][2].data_as<float>()[0], 0.1f + static_cast<float>(r));
      }
    }
  }
}

}  // namespace
}  // namespace onnxtrain::runtime
