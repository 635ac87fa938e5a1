// Test helper: a ProcessWorld whose "processes" are threads of this test, through one rank of
// an InProcessGroup (rank-order sums, like MpiWorld), so the multi-process paths run in CI
// without mpirun.
#pragma once

#include <chrono>

#include "runtime/comm/in_process.h"
#include "runtime/comm/process_world.h"

namespace onnxtrain::runtime {

class ThreadWorld final : public ProcessWorld {
 public:
  explicit ThreadWorld(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(30); }
  void all_reduce(void* buf, int64_t count, DataType dtype, std::string_view) override {
    c_.all_reduce(buf, count, dtype);
  }
  void broadcast(void* buf, int64_t count, DataType dtype, int root, std::string_view) override {
    c_.broadcast(buf, count, dtype, root);
  }
  void all_gather(const void* send, void* recv, int64_t count, DataType dtype,
                  std::string_view) override {
    c_.all_gather(send, recv, count, dtype);
  }
  void barrier(std::string_view) override { c_.barrier(); }

 private:
  Communicator& c_;
};

}  // namespace onnxtrain::runtime
