// In-process collectives over shared memory. Each collective is two rendezvous: at the first,
// every rank publishes its buffer pointers and the calls are checked to match; between them,
// rank k does 1/R of the work (for all_reduce: it sums chunk k over all R buffers in rank
// order and writes the sum into chunk k of every buffer); the second ends the collective.
#include "runtime/comm/in_process.h"

#include <algorithm>
#include <cstring>

#include "graph/bfloat16.h"
#include "graph/error.h"

namespace onnxtrain::runtime {
namespace {

using Kind = InProcessCall::Kind;

// Chunks start at multiples of 16 elements, so every rank's loop vectorizes from an aligned
// boundary when the buffers are.
constexpr int64_t kChunkAlign = 16;
// Elements summed per block: the block's sum lives in a local array (cache and registers)
// before it is copied out to every destination.
constexpr int64_t kBlock = 512;

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

std::string describe(const InProcessCall& c) {
  if (c.kind == Kind::kBarrier) return "barrier()";
  std::string s =
      cat(kind_name(c.kind), "(count=", c.count, ", dtype=", graph::dtype_short_name(c.dtype));
  if (c.kind == Kind::kAllReduce || c.kind == Kind::kReduceScatter)
    s += cat(", op=", reduce_op_name(c.op));
  if (c.kind == Kind::kBroadcast) s += cat(", root=", c.root);
  if (c.parts && c.parts->size() != 1) {
    s += ", buffers=[";
    for (size_t i = 0; i < c.parts->size(); ++i) s += cat(i ? " " : "", (*c.parts)[i].count);
    s += "]";
  }
  return s + ")";
}

bool same_call(const InProcessCall& a, const InProcessCall& b) {
  if (!(a.kind == b.kind && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
        a.root == b.root && !a.parts == !b.parts))
    return false;
  if (!a.parts) return true;
  if (a.parts->size() != b.parts->size()) return false;
  for (size_t i = 0; i < a.parts->size(); ++i)
    if ((*a.parts)[i].count != (*b.parts)[i].count) return false;
  return true;
}

// dst[d][i] = src[0][i] + src[1][i] + ... (in that order) for i < n. Each block is read
// completely before it is written, so a destination may alias its source.
template <typename T>
void sum_in_rank_order(const std::vector<const T*>& src, const std::vector<T*>& dst, int64_t n) {
  T acc[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t m = std::min(kBlock, n - b);
    const T* first = src[0] + b;
    for (int64_t i = 0; i < m; ++i) acc[i] = first[i];
    for (size_t r = 1; r < src.size(); ++r) {
      const T* p = src[r] + b;
      for (int64_t i = 0; i < m; ++i) acc[i] += p[i];
    }
    for (T* d : dst) std::memcpy(d + b, acc, static_cast<size_t>(m) * sizeof(T));
  }
}

// Sums `n` elements starting at element `offset` of each source into each destination at
// `dst_offset`. Signed integers add as their unsigned twins: wrap-around, not UB.
template <typename T>
void sum_typed(const std::vector<const void*>& src, int64_t src_offset,
               const std::vector<void*>& dst, int64_t dst_offset, int64_t n) {
  std::vector<const T*> s;
  std::vector<T*> d;
  for (const void* p : src) s.push_back(static_cast<const T*>(p) + src_offset);
  for (void* p : dst) d.push_back(static_cast<T*>(p) + dst_offset);
  sum_in_rank_order<T>(s, d, n);
}

// bfloat16 (the --reduce-precision bf16 gradient wire): summed in float32 in rank order and
// rounded to bfloat16 once (graph/bfloat16.h), as the MPI world does.
void sum_bf16(const std::vector<const void*>& src, int64_t src_offset,
              const std::vector<void*>& dst, int64_t dst_offset, int64_t n) {
  float acc[kBlock];
  uint16_t out[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) acc[i] = 0;
    for (const void* p : src) {
      const uint16_t* q = static_cast<const uint16_t*>(p) + src_offset + b;
      for (int64_t i = 0; i < m; ++i) acc[i] += graph::bf16_to_float(q[i]);
    }
    for (int64_t i = 0; i < m; ++i) out[i] = graph::bf16_from_float(acc[i]);
    for (void* d : dst)
      std::memcpy(static_cast<uint16_t*>(d) + dst_offset + b, out,
                  static_cast<size_t>(m) * sizeof(uint16_t));
  }
}

void sum(DataType dtype, const std::vector<const void*>& src, int64_t src_offset,
         const std::vector<void*>& dst, int64_t dst_offset, int64_t n) {
  if (n <= 0) return;
  switch (dtype) {
    case DataType::kFloat:
      return sum_typed<float>(src, src_offset, dst, dst_offset, n);
    case DataType::kDouble:
      return sum_typed<double>(src, src_offset, dst, dst_offset, n);
    case DataType::kBFloat16:
      return sum_bf16(src, src_offset, dst, dst_offset, n);
    case DataType::kInt32:
      return sum_typed<uint32_t>(src, src_offset, dst, dst_offset, n);
    case DataType::kInt64:
      return sum_typed<uint64_t>(src, src_offset, dst, dst_offset, n);
    default:
      fail("in-process sum: dtype ", graph::dtype_short_name(dtype), " not reducible");
  }
}

}  // namespace

// ---- InProcessCommunicator ----

class InProcessCommunicator::Work final : public CommWork {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    if (failed_) throw Error(error_);
  }
  bool done() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
  }
  void finish(bool failed, std::string error) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
      failed_ = failed;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool failed_ = false;
  std::string error_;
};

InProcessCommunicator::InProcessCommunicator(InProcessGroup& group, int rank)
    : group_(group), rank_(rank) {
  worker_ = std::thread([this] { worker_loop(); });
}

InProcessCommunicator::~InProcessCommunicator() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

int InProcessCommunicator::size() const {
  return group_.size();
}

void InProcessCommunicator::worker_loop() {
  for (;;) {
    std::unique_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task->run();
      task->work->finish(false, "");
    } catch (const std::exception& e) {
      task->work->finish(true, e.what());
    } catch (...) {
      task->work->finish(true,
                         cat("rank ", rank_, ": collective failed with a non-standard exception"));
    }
  }
}

std::shared_ptr<InProcessCommunicator::Work> InProcessCommunicator::submit(const Call& call) {
  std::string what = cat("rank ", rank_, ": ", kind_name(call.kind));
  try {
    if (call.kind != Kind::kBarrier) {
      bool reduce = call.kind == Kind::kAllReduce || call.kind == Kind::kReduceScatter;
      int64_t total = call.count;
      if (call.kind == Kind::kAllGather || call.kind == Kind::kReduceScatter) {
        OT_CHECK(call.count >= 0, what, ": count is negative (", call.count, ")");
        OT_CHECK(!__builtin_mul_overflow(call.count, int64_t{size()}, &total), what, ": count ",
                 call.count, " x ", size(), " ranks overflows int64");
      }
      int64_t send_count = call.kind == Kind::kReduceScatter ? total : call.count;
      int64_t recv_count = call.kind == Kind::kAllGather ? total : call.count;
      if (call.parts) {
        for (const ops::CollectiveBuffer& b : *call.parts)
          check_comm_args(b.data, b.count, call.dtype, false, what);
      } else {
        check_comm_args(call.send, send_count, call.dtype, reduce, what);
        check_comm_args(call.recv, recv_count, call.dtype, reduce, what);
      }
      OT_CHECK(call.kind != Kind::kBroadcast || (call.root >= 0 && call.root < size()), what,
               ": root ", call.root, " is not a rank of a size-", size(), " group");
    }
  } catch (const Error& e) {
    // The peers would otherwise wait for this rank until the timeout.
    group_.abort(e.what());
    throw;
  }
  auto task = std::make_unique<Task>();
  task->run = [this, call] { execute(call); };
  task->work = std::make_shared<Work>();
  std::shared_ptr<Work> work = task->work;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
  return work;
}

void InProcessCommunicator::execute(Call call) {
  call.seq = seq_++;
  group_.arrive(rank_, call);
  // From here until depart() every rank's published call is fixed and its buffers in use, so
  // depart() must run even if the work fails.
  try {
    work(call, group_.calls_);
  } catch (const std::exception& e) {
    group_.abort(cat("rank ", rank_, ": ", kind_name(call.kind), " #", call.seq, ": ", e.what()));
    group_.depart();
    throw;
  }
  group_.depart();
}

void InProcessCommunicator::work(const Call& call, const std::vector<Call>& calls) {
  const int r_count = size();
  const int64_t elem = call.kind == Kind::kBarrier ? 0 : comm_element_size(call.dtype, "");
  switch (call.kind) {
    case Kind::kAllReduce: {
      int64_t per_rank = (call.count + r_count - 1) / r_count;
      int64_t chunk = (per_rank + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
      int64_t begin = std::min(call.count, chunk * rank_);
      int64_t end = std::min(call.count, begin + chunk);
      std::vector<const void*> src;
      std::vector<void*> dst;
      for (const Call& c : calls) {
        src.push_back(c.recv);
        dst.push_back(c.recv);
      }
      sum(call.dtype, src, begin, dst, begin, end - begin);
      break;
    }
    case Kind::kReduceScatter: {
      std::vector<const void*> src;
      for (const Call& c : calls) src.push_back(c.send);
      sum(call.dtype, src, call.count * rank_, {call.recv}, 0, call.count);
      break;
    }
    case Kind::kBroadcast: {
      if (rank_ == call.root) break;
      const auto& from = *calls[call.root].parts;
      for (size_t i = 0; i < from.size(); ++i)
        if (from[i].count > 0)
          std::memcpy((*call.parts)[i].data, from[i].data,
                      static_cast<size_t>(from[i].count * elem));
      break;
    }
    case Kind::kAllGather: {
      size_t bytes = static_cast<size_t>(call.count * elem);
      for (int r = 0; r < r_count && bytes > 0; ++r) {
        auto* dst = static_cast<std::byte*>(call.recv) + bytes * r;
        if (dst != calls[r].send) std::memmove(dst, calls[r].send, bytes);
      }
      break;
    }
    case Kind::kBarrier:
      break;
  }
}

void InProcessCommunicator::all_reduce(void* buf, int64_t count, DataType dtype, ReduceOp op) {
  all_reduce_async(buf, count, dtype, op).wait();
}

CommHandle InProcessCommunicator::all_reduce_async(void* buf, int64_t count, DataType dtype,
                                                   ReduceOp op) {
  Call call{Kind::kAllReduce, count, dtype, op, 0, buf, buf, 0, nullptr};
  return CommHandle(submit(call));
}

void InProcessCommunicator::broadcast(void* buf, int64_t count, DataType dtype, int root) {
  broadcast_async({{buf, count}}, dtype, root).wait();
}

CommHandle InProcessCommunicator::broadcast_async(const std::vector<ops::CollectiveBuffer>& bufs,
                                                  DataType dtype, int root) {
  Call call{Kind::kBroadcast, 0, dtype, ReduceOp::kSum, root, nullptr, nullptr, 0, nullptr};
  for (const ops::CollectiveBuffer& b : bufs) {
    OT_CHECK(!__builtin_add_overflow(call.count, b.count, &call.count), "rank ", rank_,
             ": broadcast: the buffers' counts overflow int64");
  }
  call.parts = std::make_shared<const std::vector<ops::CollectiveBuffer>>(bufs);
  return CommHandle(submit(call));
}

void InProcessCommunicator::all_gather(const void* send, void* recv, int64_t count,
                                       DataType dtype) {
  submit(Call{Kind::kAllGather, count, dtype, ReduceOp::kSum, 0, send, recv, 0, nullptr})->wait();
}

void InProcessCommunicator::reduce_scatter(const void* send, void* recv, int64_t count_per_rank,
                                           DataType dtype, ReduceOp op) {
  submit(Call{Kind::kReduceScatter, count_per_rank, dtype, op, 0, send, recv, 0, nullptr})->wait();
}

void InProcessCommunicator::barrier() {
  submit(Call{})->wait();
}

// ---- InProcessGroup ----

InProcessGroup::InProcessGroup(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout) {
  OT_CHECK(size >= 1, "InProcessGroup: size must be >= 1 (got ", size, ")");
  OT_CHECK(timeout.count() > 0, "InProcessGroup: timeout must be positive (got ", timeout.count(),
           " ms)");
  calls_.resize(static_cast<size_t>(size));
  arrived_flags_.assign(static_cast<size_t>(size), 0);
  for (int k = 0; k < size; ++k)
    comms_.push_back(std::unique_ptr<InProcessCommunicator>(new InProcessCommunicator(*this, k)));
}

InProcessGroup::~InProcessGroup() {
  abort("in-process group destroyed");
  comms_.clear();
}

InProcessCommunicator& InProcessGroup::communicator(int rank) {
  OT_CHECK(rank >= 0 && rank < size_, "InProcessGroup: rank ", rank, " out of range [0, ", size_,
           ")");
  return *comms_[static_cast<size_t>(rank)];
}

void InProcessGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lk(mu_);
  abort_locked(reason);
}

void InProcessGroup::abort_locked(const std::string& reason) {
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  cv_.notify_all();
}

bool InProcessGroup::aborted() const {
  std::lock_guard<std::mutex> lk(mu_);
  return aborted_;
}

std::string InProcessGroup::abort_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return abort_reason_;
}

void InProcessGroup::throw_aborted_locked(int rank, const Call& call) const {
  fail("rank ", rank, ": ", kind_name(call.kind), " #", call.seq,
       ": in-process group aborted: ", abort_reason_);
}

void InProcessGroup::arrive(int rank, const Call& call) {
  std::unique_lock<std::mutex> lk(mu_);
  if (aborted_) throw_aborted_locked(rank, call);
  calls_[static_cast<size_t>(rank)] = call;
  arrived_flags_[static_cast<size_t>(rank)] = 1;
  if (++arrived_ == size_) {
    for (int r = 1; r < size_; ++r) {
      const Call& c = calls_[static_cast<size_t>(r)];
      if (!same_call(calls_[0], c)) {
        std::string msg = cat("in-process group: collective #", call.seq,
                              " does not match across ranks: rank 0 called ", describe(calls_[0]),
                              ", rank ", r, " called ", describe(c));
        abort_locked(msg);
        fail(msg);
      }
    }
    arrived_ = 0;
    std::fill(arrived_flags_.begin(), arrived_flags_.end(), 0);
    ++arrive_generation_;
    cv_.notify_all();
    return;
  }
  const uint64_t generation = arrive_generation_;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  // Once the generation moved every rank is in the collective and uses this rank's buffers,
  // so this rank takes part even if an abort arrives at the same time.
  while (arrive_generation_ == generation) {
    if (aborted_) throw_aborted_locked(rank, call);
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout &&
        arrive_generation_ == generation && !aborted_) {
      std::string missing;
      for (int r = 0; r < size_; ++r)
        if (!arrived_flags_[static_cast<size_t>(r)]) missing += cat(missing.empty() ? "" : ", ", r);
      std::string msg = cat("in-process group: ", describe(call), " #", call.seq, " on rank ", rank,
                            " timed out after ", timeout_.count() / 1000.0, " s: rank(s) ", missing,
                            " did not arrive");
      abort_locked(msg);
      fail(msg);
    }
  }
}

void InProcessGroup::depart() {
  std::unique_lock<std::mutex> lk(mu_);
  if (++departed_ == size_) {
    departed_ = 0;
    ++depart_generation_;
    cv_.notify_all();
    return;
  }
  const uint64_t generation = depart_generation_;
  cv_.wait(lk, [&] { return depart_generation_ != generation; });
}

}  // namespace onnxtrain::runtime
