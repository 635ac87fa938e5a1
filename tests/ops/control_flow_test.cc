// If, Loop and Scan through InferenceSession: captured outer values (kept alive past their last
// explicit reader, two levels deep), branches of different shapes, a branch returning an outer
// value, counted / conditional / zero-trip loops, carried values that grow every iteration,
// scan outputs, Scan directions/axes and opset-8 batches, and errors. Expected values are
// computed by hand or by plain loops here.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/verifier.h"
#include "tests/ops/op_test_util.h"

namespace onnxtrain::optest {
namespace {

using graph::Graph;
using graph::Value;
using graph::ValueType;

ValueType f32_type(std::vector<int64_t> dims) {
  return ValueType::tensor(DataType::kFloat, graph::make_shape(dims));
}
ValueType scalar(DataType dt) {
  return ValueType::tensor(dt, graph::Shape{});
}

std::vector<Tensor> run_model(std::unique_ptr<graph::Model> m,
                              std::map<std::string, Tensor> feeds) {
  graph::verify_model(*m);
  runtime::SessionOptions opts;
  opts.threads = 2;
  runtime::InferenceSession s(std::move(m), opts);
  return s.run(feeds);
}

// main: a = Relu(x); b = Neg(x); y = If(cond) { then: a + 10 | else: Concat(a, a) }
// a has no explicit reader after Neg, so only the capture keeps its buffer from being reused.
std::unique_ptr<graph::Model> if_model(bool then_returns_outer) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", f32_type({3}));
  Value* cond = g.add_input("cond", scalar(DataType::kBool));
  Value* a = g.add_node("Relu", {x}, {"a"}, "relu")->output(0);
  a->type = f32_type({3});
  Value* b = g.add_node("Neg", {x}, {"b"}, "neg")->output(0);
  auto then_g = std::make_unique<Graph>("then", &g);
  if (then_returns_outer) {
    then_g->add_output(a);
  } else {
    Value* ten = then_g->add_initializer("ten", f32({1}, {10}));
    then_g->add_output(then_g->add_node("Add", {a, ten}, {"t_out"}, "t_add")->output(0));
  }
  auto else_g = std::make_unique<Graph>("else", &g);
  graph::Node* cat_node = else_g->add_node("Concat", {a, a}, {"e_out"}, "e_cat");
  cat_node->set_attr(Attribute::make_int("axis", 0));
  else_g->add_output(cat_node->output(0));
  graph::Node* iff = g.add_node("If", {cond}, {"y"}, "if");
  iff->set_attr(Attribute::make_graph("then_branch", std::move(then_g)));
  iff->set_attr(Attribute::make_graph("else_branch", std::move(else_g)));
  g.add_output(b);
  g.add_output(iff->output(0));
  return m;
}

TEST(If, BranchesCaptureALiveOuterValue) {
  const Tensor x = f32({3}, {-1, 2, 3});
  for (bool outer : {false, true}) {
    auto y_then = run_model(if_model(outer), {{"x", x}, {"cond", boolean({}, {1})}});
    EXPECT_EQ(values_of(y_then[0]), (std::vector<double>{1, -2, -3}));
    const std::vector<double> want =
        outer ? std::vector<double>{0, 2, 3} : std::vector<double>{10, 12, 13};
    EXPECT_EQ(values_of(y_then[1]), want);
    auto y_else = run_model(if_model(outer), {{"x", x}, {"cond", boolean({}, {0})}});
    EXPECT_EQ(y_else[1].dims(), (std::vector<int64_t>{6}));
    EXPECT_EQ(values_of(y_else[1]), (std::vector<double>{0, 2, 3, 0, 2, 3}));
  }
}

TEST(If, OneSessionFollowsTheConditionEveryRun) {
  runtime::SessionOptions opts;
  opts.threads = 1;
  runtime::InferenceSession s(if_model(false), opts);
  const Tensor x = f32({3}, {4, -5, 6});
  for (int rep = 0; rep < 3; ++rep) {
    auto t = s.run({{"x", x}, {"cond", boolean({}, {1})}});
    EXPECT_EQ(values_of(t[1]), (std::vector<double>{14, 10, 16}));
    auto e = s.run({{"x", x}, {"cond", boolean({}, {0})}});
    EXPECT_EQ(values_of(e[1]), (std::vector<double>{4, 0, 6, 4, 0, 6}));
  }
  EXPECT_EQ(s.cached_plans(), 1u);
}

TEST(If, ConditionMustBeOneBool) {
  auto m = if_model(false);
  m->graph->inputs()[1]->type = ValueType::tensor(DataType::kBool, graph::make_shape({2}));
  try {
    run_model(std::move(m), {{"x", f32({3}, {1, 2, 3})}, {"cond", boolean({2}, {1, 0})}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'if' (If)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("must be one bool"), std::string::npos) << e.what();
  }
}

TEST(If, UnsupportedOpInsideABranchIsRefusedUpFront) {
  auto m = if_model(false);
  graph::Graph& then_g = m->graph->nodes().back()->find_attr("then_branch")->g();
  then_g.add_node("NoSuchOp", {then_g.outputs()[0]}, {"t_bad"}, "bad");
  try {
    runtime::InferenceSession s(std::move(m));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NoSuchOp"), std::string::npos) << e.what();
  }
}

// Loop body: (i, cond, v) -> (cond', v', scans...) built by `fill`.
struct LoopSpec {
  std::optional<int64_t> trip;
  std::optional<bool> cond;
  Tensor v0;
  int scans = 0;
};

// main: x (3) input; y.. = Loop(M, cond, v0) with a body made by fill(body, i, c, v, x).
template <typename F>
std::unique_ptr<graph::Model> loop_model(const LoopSpec& spec, F&& fill) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", f32_type({3}));
  Value* trip = spec.trip ? g.add_initializer("M", i64({}, {*spec.trip})) : nullptr;
  Value* cond = spec.cond ? g.add_initializer("c0", boolean({}, {*spec.cond})) : nullptr;
  Value* v0 =
      g.add_input("v0", ValueType::tensor(spec.v0.dtype(), graph::make_shape(spec.v0.dims())));
  auto body = std::make_unique<Graph>("body", &g);
  Value* i = body->add_input("i", scalar(DataType::kInt64));
  Value* c = body->add_input("c", scalar(DataType::kBool));
  Value* v = body->add_input("v", ValueType::tensor(spec.v0.dtype()));
  fill(*body, i, c, v, x);
  std::vector<std::string> outs{"v_final"};
  for (int k = 0; k < spec.scans; ++k) outs.push_back(cat("scan", k));
  graph::Node* loop = g.add_node("Loop", {trip, cond, v0}, outs, "loop");
  loop->set_attr(Attribute::make_graph("body", std::move(body)));
  for (Value* o : loop->outputs()) g.add_output(o);
  return m;
}

TEST(Loop, CountedLoopCapturesAndScans) {
  // v' = v + x (x captured), scan 0 = v', scan 1 = i.
  auto m = loop_model({5, true, f32({3}, {0, 0, 0}), 2},
                      [](Graph& b, Value* i, Value* c, Value* v, Value* x) {
                        Value* s = b.add_node("Add", {v, x}, {"s"}, "add")->output(0);
                        b.add_output(b.add_node("Identity", {c}, {"c_out"}, "c_id")->output(0));
                        b.add_output(s);
                        b.add_output(b.add_node("Identity", {s}, {"s_scan"}, "s_id")->output(0));
                        b.add_output(b.add_node("Identity", {i}, {"i_scan"}, "i_id")->output(0));
                      });
  auto y = run_model(std::move(m), {{"x", f32({3}, {1, 2, -3})}, {"v0", f32({3}, {0, 0, 0})}});
  ASSERT_EQ(y.size(), 3u);
  EXPECT_EQ(values_of(y[0]), (std::vector<double>{5, 10, -15}));
  EXPECT_EQ(y[1].dims(), (std::vector<int64_t>{5, 3}));
  std::vector<double> want;
  for (int it = 1; it <= 5; ++it)
    for (double xv : {1.0, 2.0, -3.0}) want.push_back(it * xv);
  EXPECT_EQ(values_of(y[1]), want);
  EXPECT_EQ(values<int64_t>(y[2]), (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Loop, BodyConditionStopsAWhileLoop) {
  // No M: v' = 2v while i + 1 < 3 -> three iterations.
  auto m = loop_model({std::nullopt, true, f32({1}, {1}), 0},
                      [](Graph& b, Value* i, Value*, Value* v, Value*) {
                        Value* one = b.add_initializer("one", i64({}, {1}));
                        Value* three = b.add_initializer("three", i64({}, {3}));
                        Value* next = b.add_node("Add", {i, one}, {"i1"}, "inc")->output(0);
                        b.add_output(b.add_node("Less", {next, three}, {"c_out"}, "lt")->output(0));
                        b.add_output(b.add_node("Add", {v, v}, {"v2"}, "dbl")->output(0));
                      });
  auto y = run_model(std::move(m), {{"x", f32({3}, {0, 0, 0})}, {"v0", f32({1}, {1})}});
  EXPECT_EQ(values_of(y[0]), (std::vector<double>{8}));
}

TEST(Loop, CarriedValueGrowsEveryIteration) {
  // v' = Concat(v, v): a new shape (and nested plan) per iteration.
  auto m = loop_model({4, std::nullopt, f32({1}, {2.5f}), 0},
                      [](Graph& b, Value*, Value* c, Value* v, Value*) {
                        b.add_output(b.add_node("Identity", {c}, {"c_out"}, "c_id")->output(0));
                        graph::Node* n = b.add_node("Concat", {v, v}, {"vv"}, "cat");
                        n->set_attr(Attribute::make_int("axis", 0));
                        b.add_output(n->output(0));
                      });
  auto y = run_model(std::move(m), {{"x", f32({3}, {0, 0, 0})}, {"v0", f32({1}, {2.5f})}});
  EXPECT_EQ(y[0].dims(), (std::vector<int64_t>{16}));
  EXPECT_EQ(values_of(y[0]), std::vector<double>(16, 2.5));
}

TEST(Loop, ZeroTripsReturnTheInitialValues) {
  auto m = loop_model({0, true, f32({2}, {7, 8}), 1},
                      [](Graph& b, Value*, Value* c, Value* v, Value* x) {
                        b.add_output(b.add_node("Identity", {c}, {"c_out"}, "c_id")->output(0));
                        b.add_output(b.add_node("Identity", {v}, {"v_out"}, "v_id")->output(0));
                        Value* sc = b.add_node("Identity", {x}, {"x_scan"}, "x_id")->output(0);
                        sc->type = f32_type({3});
                        b.add_output(sc);
                      });
  auto y = run_model(std::move(m), {{"x", f32({3}, {1, 2, 3})}, {"v0", f32({2}, {7, 8})}});
  EXPECT_EQ(values_of(y[0]), (std::vector<double>{7, 8}));
  EXPECT_EQ(y[1].dims(), (std::vector<int64_t>{0, 3}));
}

TEST(Loop, NestedIfCapturesFromTwoLevelsUp) {
  // v' = (i is even) ? v + x : v - x, the If inside the body reading x from the main graph.
  auto m = loop_model({4, true, f32({3}, {0, 0, 0}), 0},
                      [](Graph& b, Value* i, Value* c, Value* v, Value* x) {
                        Value* two = b.add_initializer("two", i64({}, {2}));
                        Value* zero = b.add_initializer("zero", i64({}, {0}));
                        Value* r = b.add_node("Mod", {i, two}, {"r"}, "mod")->output(0);
                        Value* even = b.add_node("Equal", {r, zero}, {"even"}, "eq")->output(0);
                        auto then_g = std::make_unique<Graph>("then", &b);
                        then_g->add_output(then_g->add_node("Add", {v, x}, {"p"}, "p")->output(0));
                        auto else_g = std::make_unique<Graph>("else", &b);
                        else_g->add_output(else_g->add_node("Sub", {v, x}, {"q"}, "q")->output(0));
                        graph::Node* iff = b.add_node("If", {even}, {"v_next"}, "inner_if");
                        iff->set_attr(Attribute::make_graph("then_branch", std::move(then_g)));
                        iff->set_attr(Attribute::make_graph("else_branch", std::move(else_g)));
                        b.add_output(b.add_node("Identity", {c}, {"c_out"}, "c_id")->output(0));
                        b.add_output(iff->output(0));
                      });
  const std::vector<float> xs{1, -2, 4};
  auto y = run_model(std::move(m), {{"x", f32({3}, xs)}, {"v0", f32({3}, {0, 0, 0})}});
  std::vector<double> want(3, 0);
  for (int it = 0; it < 4; ++it)
    for (int k = 0; k < 3; ++k) want[k] += (it % 2 == 0 ? 1 : -1) * xs[k];
  EXPECT_EQ(values_of(y[0]), want);
}

}  // namespace
}  // namespace onnxtrain::optest

namespace onnxtrain::optest {
namespace {

// main: Scan(s0, X) with body (s, x) -> (s + x, s + x as a scan output); opset 8 adds a leading
// sequence_lens input and a batch axis.
std::unique_ptr<graph::Model> scan_model(int64_t opset, std::vector<Attribute> attrs,
                                         const std::vector<int64_t>& s_dims,
                                         const std::vector<int64_t>& x_dims, bool scan_output) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", opset);
  Graph& g = *m->graph;
  std::vector<Value*> ins;
  if (opset < 9)
    ins.push_back(
        g.add_input("lens", ValueType::tensor(DataType::kInt64, graph::make_shape({s_dims[0]}))));
  ins.push_back(g.add_input("s0", f32_type(s_dims)));
  ins.push_back(g.add_input("X", f32_type(x_dims)));
  auto body = std::make_unique<Graph>("body", &g);
  Value* s = body->add_input("s", ValueType::tensor(DataType::kFloat));
  Value* x = body->add_input("x", ValueType::tensor(DataType::kFloat));
  Value* sum = body->add_node("Add", {s, x}, {"sum"}, "add")->output(0);
  body->add_output(sum);
  std::vector<std::string> outs{"s_final"};
  if (scan_output) {
    body->add_output(body->add_node("Identity", {sum}, {"sum_scan"}, "id")->output(0));
    outs.push_back("ys");
  }
  graph::Node* n = g.add_node("Scan", ins, outs, "scan");
  n->set_attr(Attribute::make_graph("body", std::move(body)));
  n->set_attr(Attribute::make_int("num_scan_inputs", 1));
  for (Attribute& a : attrs) n->set_attr(std::move(a));
  for (Value* o : n->outputs()) g.add_output(o);
  return m;
}

TEST(Scan, ReverseInputAxisOneAndReversedOutputOnTheLastAxis) {
  const std::vector<float> x{1, 2, 3, 10, 20, 30};  // (2, 3): scanned over axis 1, last first
  auto y = run_model(scan_model(17,
                                {Attribute::make_ints("scan_input_axes", {1}),
                                 Attribute::make_ints("scan_input_directions", {1}),
                                 Attribute::make_ints("scan_output_axes", {-1}),
                                 Attribute::make_ints("scan_output_directions", {1})},
                                {2}, {2, 3}, true),
                     {{"s0", f32({2}, {100, 200})}, {"X", f32({2, 3}, x)}});
  // Plain loops: step p consumes column 2 - p; scan item p lands at column 2 - p.
  std::vector<double> s{100, 200}, ys(6);
  for (int p = 0; p < 3; ++p)
    for (int r = 0; r < 2; ++r) {
      s[r] += x[r * 3 + (2 - p)];
      ys[r * 3 + (2 - p)] = s[r];
    }
  EXPECT_EQ(values_of(y[0]), s);
  EXPECT_EQ(y[1].dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values_of(y[1]), ys);
}

TEST(Scan, Opset8BatchesWithSequenceLengths) {
  // Batch of 2 rows of (3 steps, 2 features); row 0 stops after 2 steps.
  const std::vector<float> x{1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};
  auto y = run_model(
      scan_model(8, {}, {2, 2}, {2, 3, 2}, false),
      {{"lens", i64({2}, {2, 3})}, {"s0", f32({2, 2}, {0, 0, 1, 1})}, {"X", f32({2, 3, 2}, x)}});
  EXPECT_EQ(values_of(y[0]),
            (std::vector<double>{1 + 3, 2 + 4, 1 + 10 + 30 + 50, 1 + 20 + 40 + 60}));
}

}  // namespace
}  // namespace onnxtrain::optest
