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
#include "runtime/comm/hierarchical.h"
#include "runtime/comm/nccl_factory.h"
#include "runtime/comm/in_process.h"
#include "runtime/data/random.h"

namespace onnxtrain::runtime {
namespace {

using graph::Graph;
using graph::Node;
using graph::Value;

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

DataParallelSession::DataParallelSession(std::vector<std::unique_ptr<graph::Model>> partitions,
                                         SessionOptions opts, ProcessWorld* world)
    : impl_(std::make_unique<Impl>()),
      replicas_(static_cast<int>(partitions.size())),
      world_(world && world->size() > 1 ? world : nullptr) {
  const int replicas = replicas_;
  OT_CHECK(replicas >= 1, "data parallel: no replica partition given");
  // Partition k is replica k's share (passes::partition), or the whole graph of one replica.
  for (int k = 0; k < replicas; ++k) {
    const graph::TrainingSignature& sig = partitions[static_cast<size_t>(k)]->training;
    OT_CHECK(sig.replicas == replicas, "data parallel: partition ", k, " is of a training graph "
             "built for ", sig.replicas, " replica(s), the session was given ", replicas);
    OT_CHECK(sig.partition == k || (replicas == 1 && sig.partition < 0), "data parallel: graph ",
             k, " is ", sig.partition < 0 ? std::string("a whole replicated graph")
                                           : cat("replica ", sig.partition, "'s partition"),
             ", expected replica ", k, "'s partition (passes::partition_replicas)");
  }
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
  if (world_)
    OT_CHECK(partitions[0]->training.partition >= 0, "data parallel: a multi-process run needs a "
             "training graph with ShardBatch/AllReduce nodes (TrainingOptions::collectives)");
  if (replicas == 1 && !world_) {
    auto r = std::make_unique<Replica>();
    each.device = device_of(0);
    r->session = std::make_unique<TrainingSession>(std::move(partitions[0]), each);
    impl_->replicas.push_back(std::move(r));
    return;
  }
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
    r->session = std::make_unique<TrainingSession>(std::move(partitions[static_cast<size_t>(k)]), o);
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
// Replica k's collective worker (InProcessCommunicator) goes on the same CPUs: left free, the
// workers summing gradient buckets during the backward landed on either core and slowed one
// replica at random, and every step waits for the slower one (ResNet-50 64² b16, R=2 x 1
// thread, 4 alternating runs each: 0.411 -> 0.372 s per step).
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
    if (impl_->group)
      pthread_setaffinity_np(impl_->group->communicator(k).worker_handle(), sizeof(set), &set);
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

void DataParallelSession::on_every_replica(const std::function<void(size_t k)>& job) {
  auto& reps = impl_->replicas;
  OT_CHECK(!impl_->group->aborted(), "data parallel: an earlier step failed: ",
           impl_->group->abort_reason());
  for (size_t k = 0; k < reps.size(); ++k) {
    Replica* r = reps[k].get();
    std::lock_guard lock(r->mu);
    r->error.clear();
    r->busy = true;
    r->job = [this, r, k, &job] {
      try {
        job(k);
      } catch (const std::exception& e) {
        r->error = e.what();
        impl_->group->abort(cat("replica ", k, " failed: ", e.what()));
      }
    };
    r->cv.notify_all();
  }
  std::string first_error;
  for (size_t k = 0; k < reps.size(); ++k) {
    Replica* r = reps[k].get();
    std::unique_lock lock(r->mu);
    r->cv.wait(lock, [&] { return !r->busy; });
    if (!r->error.empty() && first_error.empty()) first_error = r->error;
  }
  if (!first_error.empty()) fail(first_error);
}

void DataParallelSession::prepare(const std::map<std::string, graph::Tensor>& batch) {
  auto& reps = impl_->replicas;
  if (!impl_->group) return reps[0]->session->prepare(batch);
  on_every_replica([&](size_t k) { reps[k]->session->prepare(batch); });
}

StepResult DataParallelSession::step(const std::map<std::string, graph::Tensor>& batch, float lr,
                                     float loss_scale, uint64_t seed, float grad_scale) {
  auto& reps = impl_->replicas;
  if (!impl_->group) return reps[0]->session->step(batch, lr, loss_scale, seed, grad_scale);
  std::vector<StepResult> results(reps.size());
  const uint64_t first_replica = static_cast<uint64_t>(world_ ? world_->rank() : 0) * reps.size();
  on_every_replica([&](size_t k) {
    const uint64_t replica_seed = seed ? mix_seed(seed, first_replica + k) : 0;
    results[k] = reps[k]->session->step(batch, lr, loss_scale, replica_seed, grad_scale);
  });
  StepResult total;
  double overflowed = 0;  // replicas whose gradients were not finite
  for (const StepResult& r : results) {
    total.loss += r.loss;
    total.correct += r.correct;
    overflowed += r.finite ? 0 : 1;
  }
  if (world_) {
    double sums[3] = {total.loss, total.correct, overflowed};
    world_->all_reduce(sums, 3, DataType::kDouble, "step loss");
    total.loss = sums[0];
    total.correct = sums[1];
    overflowed = sums[2];
  }
  total.finite = overflowed == 0;
  return total;
}

std::map<std::string, graph::Tensor> DataParallelSession::state() const {
  std::map<std::string, graph::Tensor> out;
  // Every replica holds the same values; with sharded updates (passes::shard_updates) a
  // parameter's optimizer state lives only on the replica that updates it, so each value comes
  // from the first replica holding it. Kept weight copies are derived from their masters
  // (set_state rewrites them): not part of what is saved, broadcast or restored.
  for (const auto& r : impl_->replicas) {
    const TrainingSession& s = *r->session;
    for (const graph::StateBinding& b : s.signature().state)
      if (b.kind != graph::StateKind::kWeightCopy && !out.count(b.original))
        out[b.original] = s.state(b.state);
  }
  return out;
}

void DataParallelSession::set_state(const std::map<std::string, graph::Tensor>& state) {
  std::set<std::string> known;
  for (const auto& r : impl_->replicas)
    for (const graph::StateBinding& b : r->session->signature().state) known.insert(b.original);
  for (const auto& [name, t] : state)
    OT_CHECK(known.count(name), "training session: '", name, "' is not graph state");
  for (auto& r : impl_->replicas)
    for (const graph::StateBinding& b : r->session->signature().state)
      if (auto it = state.find(b.original); it != state.end()) r->session->set_state(b.state, it->second);
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

TrainingSession& DataParallelSession::replica_session(int k) {
  OT_CHECK(k >= 0 && k < replicas_, "data parallel: no replica ", k, " (", replicas_, " replicas)");
  return *impl_->replicas[static_cast<size_t>(k)]->session;
}

const TrainingSession& DataParallelSession::replica_session(int k) const {
  return const_cast<DataParallelSession*>(this)->replica_session(k);
}

bool DataParallelSession::replicas_identical() const {
  const auto& reps = impl_->replicas;
  const std::map<std::string, graph::Tensor> first = state();
  for (size_t k = 1; k < reps.size(); ++k)
    for (const graph::StateBinding& b : reps[k]->session->signature().state) {
      auto it = first.find(b.original);
      if (it == first.end() || !it->second.equals(reps[k]->session->state(b.state))) return false;
    }
  return true;
}

}  // namespace onnxtrain::runtime
