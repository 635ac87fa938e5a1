// MpiWorld (mpi.h). MPI has no timeouts, so every transfer is a nonblocking call polled with
// MPI_Test against a deadline; an expired deadline names the missing peer (point to point: the
// peer whose transfer is pending; a reduction: the ranks that do not answer a ping) and aborts
// the job instead of hanging. Sums are MPI_Iallreduce: the library's algorithm decides the order
// of additions (every rank still gets the same bytes: the allreduce algorithms Open MPI uses
// distribute one reduced value). Broadcast and gather stay point to point from / to the root.
#include "runtime/comm/mpi.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graph/bfloat16.h"
#include "runtime/comm/communicator.h"

#ifdef ONNXTRAIN_HAVE_MPI
#include <mpi.h>
#endif

namespace onnxtrain::runtime {
namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end && *end == '\0' && x > 0 && x < (1 << 24) ? static_cast<int>(x) : 0;
}

#ifdef ONNXTRAIN_HAVE_MPI
using Clock = std::chrono::steady_clock;
// Bytes per MPI message: counts are int.
constexpr size_t kChunk = size_t{1} << 30;
// Open MPI's choice of nonblocking allreduce algorithm (1 = ring).
constexpr const char* kNbcAlgorithm = "OMPI_MCA_coll_libnbc_iallreduce_algorithm";
// Elements per MPI_Iallreduce: counts are int.
constexpr int64_t kMaxCount = int64_t{1} << 30;
// Message tags: the gather to rank 0 and the broadcast from the root never match each other;
// ping / pong find the ranks that still answer when a reduction times out.
constexpr int kGatherTag = 1, kBcastTag = 2, kPingTag = 3, kPongTag = 4;

// MPI_Op for bfloat16 (as MPI_UINT16_T): each addition in float32, rounded to nearest-even bf16
// (graph/bfloat16.h). With 2 processes that is the in-process group's float sum rounded once.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = graph::bf16_from_float(graph::bf16_to_float(a[i]) + graph::bf16_to_float(b[i]));
}
#endif

}  // namespace

bool mpi_built() {
#ifdef ONNXTRAIN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int mpi_launch_size() {
  if (int n = env_int("OMPI_COMM_WORLD_SIZE")) return n;
  if (int n = env_int("PMI_SIZE")) return n;
  if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) {
    if (int n = env_int("SLURM_STEP_NUM_TASKS")) return n;
    if (int n = env_int("SLURM_NTASKS")) return n;
  }
  return 0;
}

int mpi_local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (int n = env_int(var); n > 0) return n;
  return 0;
}

int mpi_local_size() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (int n = env_int(var); n > 0) return n;
  return 1;
}

#ifdef ONNXTRAIN_HAVE_MPI

struct MpiWorld::State {
  std::mutex mu;               // held around every MPI call (MPI_THREAD_SERIALIZED)
  struct Reduction {
    std::vector<MPI_Request> reqs;
    std::string what;  // for the timeout message
    bool done = false;
  };
  std::map<uint64_t, Reduction> pending;  // started, not yet waited for
  uint64_t next = 1;
  bool stop = false;
  MPI_Op bf16 = MPI_OP_NULL;
  std::thread progress;
};

namespace {

// Answers every ping that has arrived (the caller holds the MPI lock): a rank whose reduction
// timed out asks who is still alive.
void answer_pings() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, MPI_COMM_WORLD, &flag, &st);
    if (!flag) return;
    int v = 0;
    MPI_Recv(&v, 1, MPI_INT, st.MPI_SOURCE, kPingTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Send(&v, 1, MPI_INT, st.MPI_SOURCE, kPongTag, MPI_COMM_WORLD);
  }
}

[[noreturn]] void report_timeout(int rank, std::chrono::milliseconds timeout,
                                 std::string_view what, const std::string& missing) {
  // A rank waiting for rank 0 may really wait for whoever rank 0 waits for.
  const char* via = rank != 0 && missing == " 0" ? " (or a rank that rank 0 waits for)" : "";
  std::fprintf(stderr,
               "onnxtrain: error: rank %d: collective '%.*s' timed out after %.0f s waiting "
               "for rank%s%s: it died or stalled (--collective-timeout)\n",
               rank, static_cast<int>(what.size()), what.data(),
               std::chrono::duration<double>(timeout).count(), missing.c_str(), via);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

// " 1, 3": the ranks, for the timeout message.
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? " " : ", ") + std::to_string(r);
  return s;
}

MPI_Datatype mpi_type(graph::DataType t) {
  switch (t) {
    case graph::DataType::kFloat: return MPI_FLOAT;
    case graph::DataType::kDouble: return MPI_DOUBLE;
    case graph::DataType::kInt32: return MPI_INT32_T;
    case graph::DataType::kInt64: return MPI_INT64_T;
    case graph::DataType::kBFloat16: return MPI_UINT16_T;
    default: fail("all_reduce: dtype ", graph::dtype_short_name(t), " cannot be summed over MPI");
  }
}

// The ranks that do not answer a ping within a second (at most the timeout), with the MPI lock
// held; every rank polling a collective answers pings.
std::string silent_ranks(int rank, int size, std::chrono::milliseconds timeout) {
  std::vector<int> pong(static_cast<size_t>(size), 0);
  std::vector<MPI_Request> recvs(static_cast<size_t>(size), MPI_REQUEST_NULL);
  std::vector<MPI_Request> sends;
  int ping = rank;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    MPI_Irecv(&pong[static_cast<size_t>(p)], 1, MPI_INT, p, kPongTag, MPI_COMM_WORLD,
              &recvs[static_cast<size_t>(p)]);
    sends.emplace_back();
    MPI_Isend(&ping, 1, MPI_INT, p, kPingTag, MPI_COMM_WORLD, &sends.back());
  }
  const auto deadline =
      Clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(1));
  std::vector<int> silent;
  for (;;) {
    answer_pings();
    silent.clear();
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      int f = 0;
      MPI_Test(&recvs[static_cast<size_t>(p)], &f, MPI_STATUS_IGNORE);
      if (!f) silent.push_back(p);
    }
    if (silent.empty() || Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (silent.empty()) return " other than this one (every rank answers: one may be in another collective)";
  return rank_list(silent);
}

// Polls `reqs` until all are done or `timeout` passed (taking the MPI lock per poll); on expiry
// prints which peers' requests are still pending and aborts the job.
void wait_all(std::mutex& mu, std::vector<MPI_Request>& reqs, const std::vector<int>& peers,
              int rank, std::chrono::milliseconds timeout, std::string_view what) {
  if (reqs.empty()) return;
  const auto start = Clock::now();
  for (int spins = 0;; ++spins) {
    {
      std::lock_guard<std::mutex> lock(mu);
      int done = 0;
      MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (done) return;
      answer_pings();
      if (Clock::now() - start > timeout) {
        std::vector<int> missing;
        for (size_t i = 0; i < reqs.size(); ++i) {
          int f = 0;
          MPI_Test(&reqs[i], &f, MPI_STATUS_IGNORE);
          if (!f && std::find(missing.begin(), missing.end(), peers[i]) == missing.end())
            missing.push_back(peers[i]);
        }
        if (missing.empty()) missing = peers;  // completed just now: name every peer
        report_timeout(rank, timeout, what, rank_list(missing));
      }
    }
    // Spin first (MPI progresses transfers only inside its calls), then poll gently: ranks
    // sharing cores must not starve the peer they wait for.
    if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

MpiWorld::MpiWorld(std::chrono::milliseconds timeout)
    : timeout_(timeout), state_(std::make_unique<State>()) {
  // Open MPI's nonblocking allreduce (libnbc) picks a binomial tree for some sizes, where two
  // ranks send twice what the others do; the ring sends 2(P-1)/P x the bytes from every rank
  // and still gives every rank the same bits (each chunk is summed once, then copied). A value
  // the user set (environment or mpirun -x / --mca) is kept. Other MPI libraries ignore it.
  setenv(kNbcAlgorithm, "1", 0);
  int provided = 0;
  int argc = 0;
  char** argv = nullptr;
  OT_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS,
           "MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    fail("the MPI library provides thread level ", provided,
         ", onnxtrain needs MPI_THREAD_SERIALIZED (replica threads call MPI one at a time)");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Op_create(&bf16_sum, 1, &state_->bf16);
  // Drives outstanding reductions (MPI progresses them only inside MPI calls) and answers
  // pings; every 50 us while a reduction is outstanding, every millisecond otherwise.
  state_->progress = std::thread([s = state_.get()] {
    std::unique_lock<std::mutex> lock(s->mu);
    while (!s->stop) {
      bool outstanding = false;
      for (auto& [ticket, r] : s->pending) {
        if (r.done) continue;
        int done = 0;
        MPI_Testall(static_cast<int>(r.reqs.size()), r.reqs.data(), &done, MPI_STATUSES_IGNORE);
        if (done) {
          r.done = true;  // all_reduce_wait sees it at its next test
        } else {
          outstanding = true;
        }
      }
      answer_pings();
      lock.unlock();
      std::this_thread::sleep_for(outstanding ? std::chrono::microseconds(200)
                                              : std::chrono::microseconds(1000));
      lock.lock();
    }
  });
}

MpiWorld::~MpiWorld() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->progress.join();
  MPI_Op_free(&state_->bf16);
  MPI_Finalize();
}

std::string MpiWorld::reduction_algorithm() const {
  const char* v = std::getenv(kNbcAlgorithm);
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, static_cast<size_t>(len));
  lib = lib.substr(0, lib.find_first_of(",\n"));
  return cat(lib, ", MPI_Iallreduce algorithm ", v ? v : "default",
             v && std::string(v) == "1" ? " (ring)" : "");
}

void MpiWorld::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void MpiWorld::gather_to_root(const void* send, void* recv, size_t bytes, std::string_view what) {
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  const auto* s = static_cast<const std::byte*>(send);
  auto* r = static_cast<std::byte*>(recv);
  if (rank_ == 0 && bytes) std::memcpy(r, s, bytes);
  std::unique_lock<std::mutex> lock(state_->mu);
  // At least one message per rank, so rank 0 sees every rank arrive.
  const size_t messages = std::max<size_t>(1, (bytes + kChunk - 1) / kChunk);
  for (int p = rank_ == 0 ? 1 : 0; p < (rank_ == 0 ? size_ : 1); ++p)
    for (size_t m = 0; m < messages; ++m) {
      const size_t off = m * kChunk;
      const int n = static_cast<int>(std::min(kChunk, bytes - off));
      reqs.emplace_back();
      peers.push_back(p);
      if (rank_ == 0)
        MPI_Irecv(r + static_cast<size_t>(p) * bytes + off, n, MPI_BYTE, p, kGatherTag,
                  MPI_COMM_WORLD, &reqs.back());
      else
        MPI_Isend(s + off, n, MPI_BYTE, 0, kGatherTag, MPI_COMM_WORLD, &reqs.back());
    }
  lock.unlock();
  wait_all(state_->mu, reqs, peers, rank_, timeout_, what);
}

void MpiWorld::bcast_bytes(void* buf, size_t bytes, int root, std::string_view what) {
  // Point to point from the root (not MPI_Ibcast): the root then waits only for ranks that
  // have not taken their copy, and a timeout names them.
  auto* b = static_cast<std::byte*>(buf);
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  std::unique_lock<std::mutex> lock(state_->mu);
  // An empty message still arrives: every rank passes the collective.
  const size_t messages = std::max<size_t>(1, (bytes + kChunk - 1) / kChunk);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || (rank_ != root && p != root)) continue;
    for (size_t m = 0; m < messages; ++m) {
      const size_t off = m * kChunk;
      const int n = static_cast<int>(std::min(kChunk, bytes - off));
      reqs.emplace_back();
      peers.push_back(p);
      if (rank_ == root)
        MPI_Isend(b + off, n, MPI_BYTE, p, kBcastTag, MPI_COMM_WORLD, &reqs.back());
      else
        MPI_Irecv(b + off, n, MPI_BYTE, root, kBcastTag, MPI_COMM_WORLD, &reqs.back());
    }
  }
  lock.unlock();
  wait_all(state_->mu, reqs, peers, rank_, timeout_, what);
}

void MpiWorld::all_reduce(void* buf, int64_t count, graph::DataType dtype, std::string_view what) {
  all_reduce_wait(all_reduce_start(buf, count, dtype, what));
}

uint64_t MpiWorld::all_reduce_start(void* buf, int64_t count, graph::DataType dtype,
                                    std::string_view what) {
  check_comm_args(buf, count, dtype, true, "all_reduce");
  const MPI_Datatype type = mpi_type(dtype);
  const int64_t es = comm_element_size(dtype, "all_reduce");
  std::lock_guard<std::mutex> lock(state_->mu);
  State::Reduction r;
  const MPI_Op op = dtype == graph::DataType::kBFloat16 ? state_->bf16 : MPI_SUM;
  // An empty reduction still runs: every rank passes the collective.
  for (int64_t at = 0; at < count || (count == 0 && r.reqs.empty()); at += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - at));
    r.reqs.emplace_back();
    MPI_Iallreduce(MPI_IN_PLACE, static_cast<std::byte*>(buf) + at * es, n, type, op,
                   MPI_COMM_WORLD, &r.reqs.back());
    if (count == 0) break;
  }
  const uint64_t ticket = state_->next++;
  r.what = std::string(what);
  state_->pending.emplace(ticket, std::move(r));
  return ticket;
}

void MpiWorld::all_reduce_wait(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(state_->mu);
  auto it = state_->pending.find(ticket);
  OT_CHECK(it != state_->pending.end(), "all_reduce_wait: unknown ticket ", ticket);
  // The clock starts at the wait: a reduction may be outstanding through a long backward pass.
  const auto deadline = Clock::now() + timeout_;
  // A waiter drives the transfer itself, as wait_all does: MPI moves data only inside its calls,
  // and a TCP transfer of megabytes needs many of them (the progress thread's occasional test
  // is for the overlap while nobody waits).
  for (int spins = 0; !it->second.done; ++spins) {
    int done = 0;
    MPI_Testall(static_cast<int>(it->second.reqs.size()), it->second.reqs.data(), &done,
                MPI_STATUSES_IGNORE);
    if (done) break;
    answer_pings();
    if (Clock::now() > deadline)
      report_timeout(rank_, timeout_, it->second.what, silent_ranks(rank_, size_, timeout_));
    lock.unlock();
    if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
  state_->pending.erase(it);
}

void MpiWorld::broadcast(void* buf, int64_t count, graph::DataType dtype, int root,
                         std::string_view what) {
  check_comm_args(buf, count, dtype, false, "broadcast");
  OT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a process of ", size_);
  bcast_bytes(buf, static_cast<size_t>(count * comm_element_size(dtype, "broadcast")), root, what);
}

void MpiWorld::all_gather(const void* send, void* recv, int64_t count, graph::DataType dtype,
                          std::string_view what) {
  check_comm_args(send, count, dtype, false, "all_gather");
  const size_t bytes = static_cast<size_t>(count * comm_element_size(dtype, "all_gather"));
  gather_to_root(send, recv, bytes, what);
  bcast_bytes(recv, bytes * static_cast<size_t>(size_), 0, what);
}

void MpiWorld::barrier(std::string_view what) {
  // Through rank 0 like the others, so a timeout names the missing rank.
  int32_t zero = 0;
  all_reduce(&zero, 1, graph::DataType::kInt32, what);
}

#else  // no MPI in this build

struct MpiWorld::State {};
MpiWorld::MpiWorld(std::chrono::milliseconds timeout) : timeout_(timeout) {
  fail("this onnxtrain was built without MPI (CMake option ONNXTRAIN_MPI, package "
       "libopenmpi-dev): it cannot join a multi-process launch");
}
MpiWorld::~MpiWorld() = default;
void MpiWorld::abort(int code) { std::_Exit(code); }
std::string MpiWorld::reduction_algorithm() const { return ""; }
void MpiWorld::gather_to_root(const void*, void*, size_t, std::string_view) {}
void MpiWorld::bcast_bytes(void*, size_t, int, std::string_view) {}
void MpiWorld::all_reduce(void*, int64_t, graph::DataType, std::string_view) {}
uint64_t MpiWorld::all_reduce_start(void*, int64_t, graph::DataType, std::string_view) {
  return 0;
}
void MpiWorld::all_reduce_wait(uint64_t) {}
void MpiWorld::broadcast(void*, int64_t, graph::DataType, int, std::string_view) {}
void MpiWorld::all_gather(const void*, void*, int64_t, graph::DataType, std::string_view) {}
void MpiWorld::barrier(std::string_view) {}

#endif

}  // namespace onnxtrain::runtime
