// MpiWorld (mpi.h). MPI has no timeouts, so every transfer is a nonblocking call polled with
// MPI_Test against a deadline; an expired deadline names the collective and the missing peer
// and aborts the job instead of hanging. Sums are computed on rank 0 in rank order, never by
// MPI_Reduce, so the result does not depend on the MPI library's reduction tree.
#include "runtime/comm/mpi.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
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
// Message tags: the gather to rank 0 and the broadcast from the root never match each other.
constexpr int kGatherTag = 1, kBcastTag = 2;

template <typename T>
void add_into(void* acc, const std::byte* src, int64_t n) {
  T* a = static_cast<T*>(acc);
  const T* s = reinterpret_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) a[i] += s[i];
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

namespace {

// Polls `reqs` until all are done or `timeout` passed; on expiry prints which peers' requests
// are still pending and aborts the job.
void wait_all(std::vector<MPI_Request>& reqs, const std::vector<int>& peers, int rank,
              std::chrono::milliseconds timeout, std::string_view what) {
  if (reqs.empty()) return;
  const auto start = Clock::now();
  for (int spins = 0;; ++spins) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (Clock::now() - start > timeout) {
      std::string missing;
      for (size_t i = 0; i < reqs.size(); ++i) {
        int f = 0;
        MPI_Test(&reqs[i], &f, MPI_STATUS_IGNORE);
        const std::string p = std::to_string(peers[i]);
        if (!f && missing.find(" " + p + ",") == std::string::npos) missing += " " + p + ",";
      }
      if (missing.empty())  // completed just now: name every peer of the collective
        for (int p : peers)
          if (missing.find(" " + std::to_string(p) + ",") == std::string::npos)
            missing += " " + std::to_string(p) + ",";
      missing.pop_back();
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
    // Spin first (MPI progresses transfers only inside its calls), then poll gently: ranks
    // sharing cores must not starve the peer they wait for.
    if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

MpiWorld::MpiWorld(std::chrono::milliseconds timeout) : timeout_(timeout) {
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
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

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
  wait_all(reqs, peers, rank_, timeout_, what);
}

void MpiWorld::bcast_bytes(void* buf, size_t bytes, int root, std::string_view what) {
  // Point to point from the root (not MPI_Ibcast): the root then waits only for ranks that
  // have not taken their copy, and a timeout names them.
  auto* b = static_cast<std::byte*>(buf);
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
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
  wait_all(reqs, peers, rank_, timeout_, what);
}

void MpiWorld::all_reduce(void* buf, int64_t count, graph::DataType dtype, std::string_view what) {
  check_comm_args(buf, count, dtype, true, "all_reduce");
  const size_t bytes = static_cast<size_t>(count * comm_element_size(dtype, "all_reduce"));
  std::vector<std::byte> all(rank_ == 0 ? bytes * static_cast<size_t>(size_) : 0);
  gather_to_root(buf, all.data(), bytes, what);
  if (rank_ == 0 && dtype == graph::DataType::kBFloat16) {
    // The bf16 gradient wire: summed in float32 in rank order, rounded once (as in-process).
    std::vector<float> acc(static_cast<size_t>(count), 0.0f);
    for (int p = 0; p < size_; ++p) {
      const std::byte* src = all.data() + static_cast<size_t>(p) * bytes;
      for (int64_t i = 0; i < count; ++i) {
        uint16_t b = 0;
        std::memcpy(&b, src + 2 * i, 2);
        acc[static_cast<size_t>(i)] += graph::bf16_to_float(b);
      }
    }
    auto* out = static_cast<uint16_t*>(buf);
    for (int64_t i = 0; i < count; ++i) out[i] = graph::bf16_from_float(acc[static_cast<size_t>(i)]);
  } else if (rank_ == 0) {
    for (int p = 1; p < size_; ++p) {
      const std::byte* src = all.data() + static_cast<size_t>(p) * bytes;
      switch (dtype) {
        case graph::DataType::kFloat: add_into<float>(buf, src, count); break;
        case graph::DataType::kDouble: add_into<double>(buf, src, count); break;
        case graph::DataType::kInt32: add_into<int32_t>(buf, src, count); break;
        default: add_into<int64_t>(buf, src, count); break;
      }
    }
  }
  bcast_bytes(buf, bytes, 0, what);
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

MpiWorld::MpiWorld(std::chrono::milliseconds timeout) : timeout_(timeout) {
  fail("this onnxtrain was built without MPI (CMake option ONNXTRAIN_MPI, package "
       "libopenmpi-dev): it cannot join a multi-process launch");
}
MpiWorld::~MpiWorld() = default;
void MpiWorld::abort(int code) { std::_Exit(code); }
void MpiWorld::gather_to_root(const void*, void*, size_t, std::string_view) {}
void MpiWorld::bcast_bytes(void*, size_t, int, std::string_view) {}
void MpiWorld::all_reduce(void*, int64_t, graph::DataType, std::string_view) {}
void MpiWorld::broadcast(void*, int64_t, graph::DataType, int, std::string_view) {}
void MpiWorld::all_gather(const void*, void*, int64_t, graph::DataType, std::string_view) {}
void MpiWorld::barrier(std::string_view) {}

#endif

}  // namespace onnxtrain::runtime
