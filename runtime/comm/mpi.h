// The MPI process world (ProcessWorld over MPI_COMM_WORLD) and how a launch by mpirun / srun is
// recognised. Built with MPI when CMake's ONNXTRAIN_MPI is on; otherwise the same API reports
// that MPI is missing. No MPI header leaks out of this file.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/process_world.h"

namespace onnxtrain::runtime {

// True when this build has MPI (ONNXTRAIN_MPI).
bool mpi_built();

// The world size an MPI launcher announces in the environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE,
// or SLURM_STEP_NUM_TASKS / SLURM_NTASKS next to PMIX_RANK / PMI_RANK); 0 for a process started
// without one.
int mpi_launch_size();
// Processes of this launch on this machine (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
// SLURM_NTASKS_PER_NODE), or 1.
int mpi_local_size();
// This process's index among them (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID),
// or 0: which of the machine's GPUs it drives.
int mpi_local_rank();

class MpiWorld final : public ProcessWorld {
 public:
  // MPI_Init_thread (MPI_THREAD_SERIALIZED; every MPI call here holds one lock). `timeout`: how
  // long one collective waits for a peer; then this process prints "onnxtrain: error: rank R:
  // collective 'WHAT' timed out ... waiting for rank Q" on stderr (Q: the ranks that do not
  // answer a ping; every waiting rank answers one) and MPI_Abort ends the whole job with exit
  // code 1. Throws Error when the build has no MPI or the library cannot do serialized
  // threading.
  explicit MpiWorld(std::chrono::milliseconds timeout);
  // MPI_Finalize.
  ~MpiWorld() override;
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  // MPI_Iallreduce on the buffer (Open MPI picks the algorithm: ring / recursive doubling, so
  // a rank moves about 2(P-1)/P x the bytes instead of rank 0 moving (P-1)x); a progress thread
  // drives outstanding reductions while the caller computes. bf16 through a user-defined sum.
  void all_reduce(void* buf, int64_t count, graph::DataType dtype, std::string_view what) override;
  uint64_t all_reduce_start(void* buf, int64_t count, graph::DataType dtype,
                            std::string_view what) override;
  void all_reduce_wait(uint64_t ticket) override;
  void broadcast(void* buf, int64_t count, graph::DataType dtype, int root,
                 std::string_view what) override;
  void all_gather(const void* send, void* recv, int64_t count, graph::DataType dtype,
                  std::string_view what) override;
  void barrier(std::string_view what) override;

  // "Open MPI v4.1.4, MPI_Iallreduce algorithm 1 (ring)": the library and the nonblocking
  // allreduce algorithm this process asked for (compared across processes before step 1).
  std::string reduction_algorithm() const override;
  // Ends every process of the job with `code` (MPI_Abort); for an error only this process saw.
  [[noreturn]] void abort(int code);

 private:
  struct State;  // the MPI lock, outstanding reductions, the progress thread (mpi.cc)
  void gather_to_root(const void* send, void* recv, size_t bytes, std::string_view what);
  void bcast_bytes(void* buf, size_t bytes, int root, std::string_view what);

  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<State> state_;
};

}  // namespace onnxtrain::runtime
