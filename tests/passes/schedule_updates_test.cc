// passes::schedule_updates: every optimizer update sits right behind the last node it has to
// follow (its inputs' producers, the other readers of the state it overwrites) and no earlier,
// global dependencies (clipping's norm, loss scaling's guard) keep the updates behind the whole
// backward, replicated graphs keep bucket_allreduce's order, the runtime still writes every update in place, and training is bit for
// bit the same as with the updates after the backward, in less planned memory.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "graph/ir.h"
#include "models/zoo.h"
#include "passes/passes.h"
#include "runtime/training_session.h"
#include "tests/passes/small_resnet.h"

namespace onnxtrain::passes {
namespace {

using graph::DataType;
using graph::Node;
using graph::Tensor;
using graph::Value;

std::unique_ptr<graph::Model> resnet() { return passtest::small_resnet(); }

// The nodes that write only state updates (parameters, moments, the step count), and for each
// the state values it overwrites.
std::unordered_map<const Node*, std::vector<const Value*>> update_nodes(const graph::Model& m) {
  const graph::Graph& g = *m.graph;
  std::unordered_map<const Value*, const Value*> state_of;
  for (const graph::StateBinding& s : m.training.state)
    if (s.kind != graph::StateKind::kRunningStatistic)
      state_of[g.find_value(s.updated)] = g.find_value(s.state);
  std::unordered_map<const Node*, std::vector<const Value*>> out;
  for (const auto& n : g.nodes()) {
    std::vector<const Value*> states;
    bool only_updates = !n->outputs().empty();
    for (const Value* o : n->outputs()) {
      if (!o) continue;
      auto it = state_of.find(o);
      if (it == state_of.end()) {
        only_updates = false;
        break;
      }
      states.push_back(it->second);
    }
    if (only_updates && !states.empty()) out[n.get()] = states;
  }
  return out;
}

struct Placement {
  int updates = 0;
  int ahead_of_backward = 0;  // updates placed before the last node that is not an update
  std::vector<std::string> early;  // "U runs before N": N must come first (WAR or data)
  std::vector<std::string> late;   // "U waits behind N": U could have run before N
};

// Each update node of m's node list (the order the executor follows): every node it must follow
// comes first, and everything between the latest such node and the update is another update
// (it could not run any earlier).
Placement placement(const graph::Model& m) {
  const graph::Graph& g = *m.graph;
  // The executor's order: the list's where the list is topological (so after schedule_updates).
  const std::vector<Node*> order = g.topological_order();
  std::unordered_map<const Node*, size_t> at;
  for (size_t i = 0; i < order.size(); ++i) at[order[i]] = i;
  const auto updates = update_nodes(m);
  size_t last_other = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (!updates.count(order[i])) last_other = i;
  Placement p;
  for (const auto& [u, states] : updates) {
    ++p.updates;
    // Parameter and moment updates (the step count, which follows nothing, runs first).
    p.ahead_of_backward += at.at(u) < last_other && states.front()->dtype() == DataType::kFloat;
    std::vector<const Node*> must_follow;
    for (const Value* in : u->inputs())
      if (in && in->producer()) must_follow.push_back(in->producer());
    for (const Value* s : states)
      for (const graph::Use& use : s->uses())
        if (use.node != u) must_follow.push_back(use.node);
    size_t latest = 0;
    bool any = false;
    for (const Node* n : must_follow) {
      if (at.at(n) > at.at(u)) p.early.push_back(u->describe() + " runs before " + n->describe());
      if (!any || at.at(n) > latest) latest = at.at(n);
      any = true;
    }
    for (size_t i = any ? latest + 1 : 0; i < at.at(u); ++i)
      if (!updates.count(order[i]))
        p.late.push_back(u->describe() + " waits behind " + order[i]->describe());
  }
  return p;
}

std::string first(const std::vector<std::string>& v) { return v.empty() ? "" : v.front(); }

TEST(ScheduleUpdates, EachUpdateRunsAsSoonAsItsGradientIsReady) {
  auto m = resnet();
  TrainingOptions o;
  o.optimizer.kind = OptimizerKind::kAdam;
  const TrainingGraphInfo info = build_training_graph(*m, o);
  // resnet18: 62 parameters (20 convolutions, 20 BN scales and biases, the classifier's weight
  // and bias) -> 62 Adam nodes, plus the step count.
  EXPECT_EQ(info.optimizer.update_nodes, 62);
  EXPECT_EQ(info.schedule.update_nodes, 63);
  // The list is the executor's order.
  const std::vector<Node*> topo = m->graph->topological_order();
  for (size_t i = 0; i < topo.size(); ++i)
    ASSERT_EQ(topo[i], m->graph->nodes()[i].get()) << "list position " << i;
  const Placement p = placement(*m);
  EXPECT_EQ(p.updates, 63);
  EXPECT_TRUE(p.early.empty()) << first(p.early);
  EXPECT_TRUE(p.late.empty()) << first(p.late);
  // All but the stem's (whose gradients come last) are interleaved with the backward.
  EXPECT_GE(p.ahead_of_backward, 55);
  EXPECT_EQ(info.schedule.interleaved, p.ahead_of_backward + 1);  // + the step count, run first

  // Off: attach_optimizer's order, every update behind the whole backward -- which the check
  // above reports as waiting.
  auto off = resnet();
  o.schedule_updates = false;
  const TrainingGraphInfo none = build_training_graph(*off, o);
  EXPECT_EQ(none.schedule.update_nodes, 0);
  const Placement q = placement(*off);
  EXPECT_EQ(q.ahead_of_backward, 0);
  EXPECT_TRUE(q.early.empty()) << first(q.early);
  EXPECT_GE(q.late.size(), 55u);
}

// A node reading a weight after its gradient is made (here a late output of weight x loss):
// the weight's update waits behind it, as the runtime writes the update over the weight.
TEST(ScheduleUpdates, AnUpdateWaitsForTheLastReaderOfItsWeight) {
  auto m = models::build_zoo_model("mlp", {.input_shape = {1, 4, 4}, .classes = 3, .width = 8});
  TrainingOptions o;
  o.schedule_updates = false;
  build_training_graph(*m, o);
  graph::Graph& g = *m->graph;
  const graph::StateBinding* w = nullptr;
  for (const graph::StateBinding& s : m->training.state)
    if (s.kind == graph::StateKind::kParameter && g.find_value(s.state)->shape()->size() == 2)
      w = &s;  // the last Gemm's weight
  ASSERT_NE(w, nullptr);
  const graph::ResultBinding* loss = m->training.results_with(graph::ResultRole::kLoss).front();
  Node* late = g.add_node("Mul", {g.find_value(w->state), g.find_value(loss->name)},
                          {"weight_times_loss"}, "late_reader");
  g.add_output(late->output(0));
  const UpdateScheduleStats st = schedule_updates(*m);
  EXPECT_GT(st.interleaved, 0);
  const Node* update = g.find_value(w->updated)->producer();
  std::unordered_map<const Node*, size_t> at;
  for (size_t i = 0; i < g.nodes().size(); ++i) at[g.nodes()[i].get()] = i;
  EXPECT_LT(at.at(late), at.at(update)) << update->describe();
  const Placement p = placement(*m);
  EXPECT_TRUE(p.early.empty()) << first(p.early);
  EXPECT_TRUE(p.late.empty()) << first(p.late);
}

// A dependency on every gradient is an input of every update: they all stay behind the
// backward (and still as early as that allows).
void stays_behind_the_backward(TrainingOptions o) {
  auto m = resnet();
  const TrainingGraphInfo info = build_training_graph(*m, o);
  EXPECT_EQ(info.schedule.update_nodes, info.optimizer.update_nodes + 1);
  const Placement p = placement(*m);
  EXPECT_TRUE(p.early.empty()) << first(p.early);
  EXPECT_TRUE(p.late.empty()) << first(p.late);
  EXPECT_EQ(p.ahead_of_backward, 0);
}

TEST(ScheduleUpdates, ClippingKeepsTheUpdatesBehindTheBackward) {
  TrainingOptions o;
  o.optimizer.clip_global_norm = 1.0f;
  stays_behind_the_backward(o);
}

TEST(ScheduleUpdates, LossScalingKeepsTheUpdatesBehindTheBackward) {
  TrainingOptions o;
  o.optimizer.loss_scaling = true;  // every update is guarded by grads_finite
  stays_behind_the_backward(o);
}

// Two replicas: bucket_allreduce's order stays (every update behind the backward, reading its
// bucket's AllReduce): interleaving them with the AllReduces scaled worse.
TEST(ScheduleUpdates, ReplicatedGraphsKeepTheBucketOrder) {
  auto m = resnet();
  TrainingOptions o;
  o.replicas = 2;
  o.bucket_mb = 0.01;  // several buckets
  const TrainingGraphInfo info = build_training_graph(*m, o);
  ASSERT_GT(info.buckets.num_buckets(), 2u);
  EXPECT_EQ(info.schedule.update_nodes, 0);
  EXPECT_EQ(info.schedule.interleaved, 0);
  const Placement p = placement(*m);
  EXPECT_TRUE(p.early.empty()) << first(p.early);
  EXPECT_EQ(p.ahead_of_backward, 0);
  for (const auto& [u, states] : update_nodes(*m)) {
    if (states.front()->dtype() != DataType::kFloat) continue;  // the step count
    bool reduced = false;
    for (const Value* in : u->inputs())
      reduced |= in && in->producer() && in->producer()->op_type == "AllReduce";
    EXPECT_TRUE(reduced) << u->describe();
  }
}

// The same nodes compute the same values in another order: three Adam steps give equal losses
// and bit-equal state; every update is still written over its state in place (no copies at the
// end of the step), and the freed gradients lower the planned arena.
TEST(ScheduleUpdates, TrainsBitForBitLikeUpdatesAfterTheBackward) {
  auto last = resnet(), early = resnet();
  TrainingOptions off, on;
  off.schedule_updates = false;
  build_training_graph(*last, off);
  build_training_graph(*early, on);
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::TrainingSession a(std::move(last), so), b(std::move(early), so);
  ASSERT_EQ(a.state_names(), b.state_names());
  passtest::expect_same_steps(a, b, 3, 5);
  const runtime::PlanStats& sa = a.session().last_plan_stats();
  const runtime::PlanStats& sb = b.session().last_plan_stats();
  EXPECT_EQ(sb.aliased_in_place, sa.aliased_in_place);
  EXPECT_EQ(sb.aliased_copied, sa.aliased_copied);  // BatchNormalization's running statistics
  EXPECT_EQ(sb.aliased_in_place, 62 * 3);           // every weight and both its moments
  EXPECT_LT(sb.arena_bytes, sa.arena_bytes);
}

}  // namespace
}  // namespace onnxtrain::passes
