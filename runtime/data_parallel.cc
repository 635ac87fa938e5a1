// DataParallelSession (data_parallel.h): replica partitions and replica threads.
#include "runtime/data_parallel.h"

#include <chrono>
#include <pthread.h>
#include <sched.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "graph/error.h"
#include "ops/op_api.h"
#include "runtime/collective_kernels.h"
#include "runtime/comm/hierarchical.h"
#include "runtime/comm/nccl_factory.h"
#include "runtime/comm/in_process.h"
#include "runtime/data/random.h"

namespace onnxtrain::runtime {
namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

constexpr const char* kReplicaSuffix = "/r";

bool is_shared(const Node& n) {
  return n.domain == ops::kOnnxtrainDomain && (n.op_type == "ShardBatch" || n.op_type == "AllReduce");
}

int replicas_of(const graph::Model& m) {
  int r = 1;
  for (const auto& n : m.graph->nodes())
    if (is_shared(*n)) {
      const int64_t v = n->attr_int("replicas", 0);
      OT_CHECK(v >= 1, n->describe(), ": attribute replicas must be >= 1");
      OT_CHECK(r == 1 || r == v, n->describe(), ": replicas=", v, ", another node says ", r);
      r = static_cast<int>(v);
    }
  return r;
}

// Replaces shared node n by one that keeps only the slots `keep_in` / `keep_out` (others
// omitted), reusing the kept output values' names.
void restrict_node(Graph& g, Node* n, const std::set<size_t>& keep_in, const std::set<size_t>& keep_out) {
  std::vector<Value*> ins;
  for (size_t i = 0; i < n->inputs().size(); ++i) ins.push_back(keep_in.count(i) ? n->input(i) : nullptr);
  std::vector<std::string> outs;
  for (size_t i = 0; i < n->outputs().size(); ++i)
    outs.push_back(keep_out.count(i) && n->output(i) ? g.fresh_name(n->output(i)->name() + "/part") : "");
  Node* m = g.insert_node_before(n, n->op_type, ins, outs, n->name, n->domain);
  m->attributes = n->attributes;
  m->device = n->device;
  std::vector<std::pair<Value*, std::string>> renames;
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    Value* old = n->output(i);
    if (!old) continue;
    if (keep_out.count(i)) {
      g.replace_all_uses(old, m->output(i));
      renames.emplace_back(m->output(i), old->name());
    }
  }
  // Outputs of other replicas lose their readers with the other replicas' nodes; detach them
  // from n first so n can go.
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    Value* old = n->output(i);
    if (!old || keep_out.count(i)) continue;
    std::vector<graph::Use> uses = old->uses();
    for (const graph::Use& u : uses) u.node->set_input(u.input_index, nullptr);
  }
  std::vector<Value*> outs_left = g.outputs();
  std::erase_if(outs_left, [&](Value* v) { return v && v->producer() == n; });
  g.set_outputs(outs_left);
  g.remove_node(n);
  for (auto& [v, name] : renames) g.rename_value(v, name);
}

// Replica k's share of a replicated training graph (see data_parallel.h).
std::unique_ptr<graph::Model> partition(const graph::Model& full, int k, int replicas) {
  std::unique_ptr<graph::Model> m = full.clone();
  Graph& g = *m->graph;
  const std::string suffix = kReplicaSuffix + std::to_string(k);
  // The device of replica k: the one its nodes carry (names end in /r<k>).
  std::string device;
  for (const auto& n : g.nodes())
    if (!is_shared(*n) && n->name.size() > suffix.size() &&
        n->name.compare(n->name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      device = n->device;
      break;
    }
  OT_CHECK(!device.empty(), "replicated graph: no node of replica ", k, " (suffix ", suffix,
           ") carries a device attribute");
  std::vector<Node*> shared;
  for (const auto& n : g.nodes())
    if (is_shared(*n)) shared.push_back(n.get());
  for (Node* n : shared) {
    std::set<size_t> in, out;
    if (n->op_type == "ShardBatch") {
      for (size_t i = 0; i < n->inputs().size(); ++i) in.insert(i);
      out.insert(static_cast<size_t>(k));
    } else {
      const size_t per = n->inputs().size() / static_cast<size_t>(replicas);
      OT_CHECK(per * static_cast<size_t>(replicas) == n->inputs().size() &&
                   n->outputs().size() == n->inputs().size(),
               n->describe(), ": ", n->inputs().size(), " inputs and ", n->outputs().size(),
               " outputs do not split into ", replicas, " replicas");
      for (size_t i = per * static_cast<size_t>(k); i < per * static_cast<size_t>(k + 1); ++i) {
        in.insert(i);
        out.insert(i);
      }
    }
    restrict_node(g, n, in, out);
  }
  // Graph outputs produced by other replicas go, then those replicas' nodes.
  std::vector<Value*> outs;
  for (Value* v : g.outputs())
    if (!v->producer() || v->producer()->device.empty() || v->producer()->device == device ||
        is_shared(*v->producer()))
      outs.push_back(v);
  g.set_outputs(outs);
  std::vector<Node*> order = g.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    if (is_shared(*n) || n->device.empty() || n->device == device) continue;
    for (Value* o : n->outputs())
      if (o)
        for (const graph::Use& u : std::vector<graph::Use>(o->uses())) u.node->set_input(u.input_index, nullptr);
    g.remove_node(n);
  }
  for (Value* v : g.initializers())
    if (v->uses().empty() && !v->is_graph_output() && !v->is_graph_input()) {
      g.clear_initializer(v);
      g.remove_value(v);
    }
  return m;
}

// "S/r<k>" -> "S"; other names unchanged.
std::string base_name(const std::string& name, int k) {
  const std::string suffix = kReplicaSuffix + std::to_string(k);
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return name.substr(0, name.size() - suffix.size());
  return name;
}

}  // namespace

// A replica's executor and the thread it runs on. Steps are handed over one at a time.
struct Replica {
  std::unique_ptr<TrainingSession> session;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;
  bool stop = false, busy = false;
  std::string error;

  void loop() {
    for (;;) {
      std::function<void()> j;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || job; });
        if (!job) return;
        j = std::move(job);
        job = nullptr;
      }
      j();
      {
        std::lock_guard lock(mu);
        busy = false;
      }
      cv.notify_all();
    }
  }
};

struct DataParallelSession::Impl {
  // Declared first, destroyed last: the sessions' AllReduce kernels use them to the end.
  std::vector<std::unique_ptr<Communicator>> nccl;
  std::unique_ptr<InProcessGroup> group;
  std::vector<std::unique_ptr<HierarchicalCommunicator>> hierarchical;  // with a world
  std::vector<std::unique_ptr<Replica>> replicas;
};

DataParallelSession::DataParallelSession(std::unique_ptr<graph::Model> graph, int replicas,
                                         SessionOptions opts, ProcessWorld* world)
    : impl_(std::make_unique<Impl>()),
      replicas_(replicas),
      world_(world && world->size() > 1 ? world : nullptr) {
  OT_CHECK(replicas >= 1, "data parallel: replicas must be >= 1, got ", replicas);
  const int in_graph = replicas_of(*graph);
  OT_CHECK(in_graph == replicas, "data parallel: the training graph is built for ", in_graph,
           " replica(s), the session was asked for ", replicas);
  if (opts.threads <= 0) opts.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  SessionOptions each = opts;
  each.threads = std::max(1, opts.threads / replicas);
  each.replica_devices.clear();
  OT_CHECK(opts.replica_devices.empty() || static_cast<int>(opts.replica_devices.size()) == replicas,
           "data parallel: ", opts.replica_devices.size(), " replica devices for ", replicas,
           " replicas");
  auto device_of = [&](int k) {
    return opts.replica_devices.empty() ? opts.device : opts.replica_devices[static_cast<size_t>(k)];
  };
  if (world_) {
    bool replicated = false;
    for (const auto& n : graph->graph->nodes()) replicated = replicated || is_shared(*n);
    OT_CHECK(replicated, "data parallel: a multi-process run needs a training graph with "
             "ShardBatch/AllReduce nodes (TrainingOptions::collectives)");
  }
  if (replicas == 1 && !world_) {
    auto r = std::make_unique<Replica>();
    each.device = device_of(0);
    r->session = std::make_unique<TrainingSession>(std::move(graph), each);
    impl_->replicas.push_back(std::move(r));
    return;
  }
  register_collective_kernels();
  // With a world, local ranks wait here while local rank 0 waits for the other processes:
  // the world's deadline must expire first (it names the missing process).
  std::chrono::milliseconds local_timeout = std::chrono::seconds(300);
  if (world_) local_timeout = std::max(local_timeout, 2 * world_->timeout() + std::chrono::seconds(60));
  impl_->group = std::make_unique<InProcessGroup>(replicas, local_timeout);
  // Replicas on distinct GPUs reduce with NCCL, one communicator over every process of a world
  // (each process must decide alike: they run the same command); otherwise (CPUs, two replicas
  // on one GPU, ONNXTRAIN_NO_NCCL=1) through the in-process group, staged through host memory.
  std::vector<int> gpus;
  for (int k = 0; k < replicas; ++k) {
    const std::shared_ptr<Device>& d = device_of(k);
    if (d && d->kind() == ops::DeviceKind::kCuda) gpus.push_back(d->index());
  }
  const char* no_nccl = std::getenv("ONNXTRAIN_NO_NCCL");
  if (static_cast<int>(gpus.size()) == replicas &&
      std::set<int>(gpus.begin(), gpus.end()).size() == gpus.size() &&
      !(no_nccl && *no_nccl && std::string(no_nccl) != "0"))
    impl_->nccl = make_nccl_communicators(gpus, world_);
  for (int k = 0; k < replicas; ++k) {
    auto r = std::make_unique<Replica>();
    SessionOptions o = each;
    o.device = device_of(k);
    o.communicator = &impl_->group->communicator(k);
    if (!impl_->nccl.empty()) {
      o.communicator = impl_->nccl[static_cast<size_t>(k)].get();
    } else if (world_) {
      impl_->hierarchical.push_back(std::make_unique<HierarchicalCommunicator>(*o.communicator, *world_));
      o.communicator = impl_->hierarchical.back().get();
    }
    if (!o.profile_path.empty()) o.profile_path += ".r" + std::to_string(k);
    r->session = std::make_unique<TrainingSession>(partition(*graph, k, replicas), o);
    impl_->replicas.push_back(std::move(r));
  }
  for (auto& r : impl_->replicas) r->thread = std::thread([p = r.get()] { p->loop(); });
  pin_replica_threads(each.threads);
}

// Replica k's thread on its own CPUs (k*T .. k*T+T-1 of the allowed ones): without it the
// scheduler often stacks the two replicas of a 2-core machine on one core for a while after a
// wake-up (resnet18 w16 28x28, R=2 x 1 thread: 2719 -> 2931 img/s, steadier). Only when the
// replicas use exactly the CPUs this process may run on (the whole machine, or what mpirun
// bound it to): with spare CPUs, pinning would stack concurrent runs on the first ones.
// ONNXTRAIN_NO_PIN=1 turns it off.
void DataParallelSession::pin_replica_threads(int per) {
  const char* off = std::getenv("ONNXTRAIN_NO_PIN");
  if (off && *off && std::string(off) != "0") return;
  const std::vector<int> cpus = allowed_cpus();
  const int replicas = static_cast<int>(impl_->replicas.size());
  if (static_cast<int>(cpus.size()) != replicas * per) return;
  for (int k = 0; k < replicas; ++k) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int t = 0; t < per; ++t) CPU_SET(cpus[static_cast<size_t>(k * per + t)], &set);
    pthread_setaffinity_np(impl_->replicas[static_cast<size_t>(k)]->thread.native_handle(),
                           sizeof(set), &set);
  }
}

DataParallelSession::~DataParallelSession() {
  for (auto& r : impl_->replicas) {
    {
      std::lock_guard lock(r->mu);
      r->stop = true;
    }
    r->cv.notify_all();
  }
  for (auto& r : impl_->replicas)
    if (r->thread.joinable()) r->thread.join();
}

std::vector<int> allowed_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  return cpus;
}

uint64_t DataParallelSession::mix_seed(uint64_t a, uint64_t b) {
  const uint64_t z = DataRng(a, b).next();
  return z ? z : 1;
}

StepResult DataParallelSession::step(const std::map<std::string, graph::Tensor>& batch, float lr,
                                     float loss_scale, uint64_t seed) {
  auto& reps = impl_->replicas;
  if (!impl_->group) return reps[0]->session->step(batch, lr, loss_scale, seed);
  OT_CHECK(!impl_->group->aborted(), "data parallel: an earlier step failed: ",
           impl_->group->abort_reason());
  std::vector<StepResult> results(reps.size());
  for (size_t k = 0; k < reps.size(); ++k) {
    Replica* r = reps[k].get();
    std::lock_guard lock(r->mu);
    r->error.clear();
    r->busy = true;
    const uint64_t global_replica =
        static_cast<uint64_t>(world_ ? world_->rank() : 0) * reps.size() + k;
    const uint64_t replica_seed = seed ? mix_seed(seed, global_replica) : 0;
    r->job = [this, r, k, &batch, lr, loss_scale, replica_seed, &results] {
      try {
        results[k] = r->session->step(batch, lr, loss_scale, replica_seed);
      } catch (const std::exception& e) {
        r->error = e.what();
        impl_->group->abort(cat("replica ", k, " failed: ", e.what()));
      }
    };
    r->cv.notify_all();
  }
  StepResult total;
  std::string first_error;
  for (size_t k = 0; k < reps.size(); ++k) {
    Replica* r = reps[k].get();
    std::unique_lock lock(r->mu);
    r->cv.wait(lock, [&] { return !r->busy; });
    if (!r->error.empty() && first_error.empty()) first_error = r->error;
    total.loss += results[k].loss;
    total.correct += results[k].correct;
  }
  if (!first_error.empty()) fail(first_error);
  if (world_) {
    double sums[2] = {total.loss, total.correct};
    world_->all_reduce(sums, 2, DataType::kDouble, "step loss");
    total.loss = sums[0];
    total.correct = sums[1];
  }
  return total;
}

std::map<std::string, graph::Tensor> DataParallelSession::state() const {
  std::map<std::string, graph::Tensor> out;
  for (const auto& [name, t] : impl_->replicas[0]->session->all_state()) out[base_name(name, 0)] = t;
  return out;
}

void DataParallelSession::set_state(const std::map<std::string, graph::Tensor>& state) {
  for (size_t k = 0; k < impl_->replicas.size(); ++k) {
    TrainingSession& s = *impl_->replicas[k]->session;
    for (const auto& [name, t] : state) {
      const std::string local = !impl_->group ? name : name + kReplicaSuffix + std::to_string(k);
      s.set_state(local, t);
    }
  }
}

std::unique_ptr<graph::Model> DataParallelSession::trained_model(const graph::Model& original) const {
  std::unique_ptr<graph::Model> m = original.clone();
  const std::map<std::string, graph::Tensor> s = state();
  for (Value* v : m->graph->initializers()) {
    auto it = s.find(v->name());
    if (it != s.end()) m->graph->set_initializer(v, it->second);
  }
  return m;
}

bool DataParallelSession::replicas_identical() const {
  const auto& reps = impl_->replicas;
  for (size_t k = 1; k < reps.size(); ++k)
    for (const auto& [name, t] : reps[k]->session->all_state()) {
      const std::string r0 = base_name(name, static_cast<int>(k)) + kReplicaSuffix + "0";
      if (!reps[0]->session->has_state(r0) || !reps[0]->session->state(r0).equals(t)) return false;
    }
  return true;
}

}  // namespace onnxtrain::runtime
