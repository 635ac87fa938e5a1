// onnxtrain: trains an ONNX model with synchronous data parallelism. This file only starts the
// process world and runs the loop: tools/train_args.cc parses the command line into a
// TrainConfig, tools/train_loop.cc and train/ do the work. Usage errors exit with 2.
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "graph/error.h"
#include "runtime/comm/mpi.h"
#include "runtime/data/dataset.h"
#include "runtime/data/transform.h"
#include "runtime/lr_schedule.h"
#include "tools/cli_main.h"
#include "tools/train_args.h"
#include "tools/train_loop.h"
#include "train/checkpoint_state.h"

#ifndef ONNXTRAIN_VERSION
#define ONNXTRAIN_VERSION "0.1.0"
#endif

namespace onnxtrain::tools {
namespace {

constexpr int kUsageExit = 2;

int run(int argc, char** argv) {
  Args a;
  try {
    a = parse_train_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "onnxtrain: error: %s\n", e.what());
    return kUsageExit;
  }
  if (a.help) {
    std::fputs(kTrainUsage, stdout);
    return 0;
  }
  if (a.version) {
    std::printf("onnxtrain %s\n", ONNXTRAIN_VERSION);
    return 0;
  }
  a.config.log = stdout;
  a.config.live = isatty(STDOUT_FILENO) != 0;
  // Under mpirun / srun with P > 1 this process is one of P; a plain start never touches MPI.
  const int launched = runtime::mpi_launch_size();
  std::unique_ptr<runtime::MpiWorld> world;
  if (launched > 1) {
    OT_CHECK(runtime::mpi_built(), "launched as one of ", launched,
             " MPI processes, but this onnxtrain was built without MPI (install libopenmpi-dev "
             "and rebuild with -DONNXTRAIN_MPI=ON)");
    world = std::make_unique<runtime::MpiWorld>(std::chrono::milliseconds(
        static_cast<int64_t>(a.collective_timeout * 1000)));
    a.config.train.parallel.world = world.get();
    a.config.train.parallel.local_processes = runtime::mpi_local_size();
    a.config.train.parallel.local_rank = runtime::mpi_local_rank();
    // mpirun hands ranks a terminal even when its own output goes to a file: epoch lines only.
    a.config.live = false;
  }
  TrainResult result;
  try {
    result = run_training(a.config);
  } catch (const runtime::WorldConsistentError& e) {
    // Every process stops here alike: each prints, then MPI_Finalize (~world) as usual.
    std::fprintf(stderr, "onnxtrain: error: %s\n", e.what());
    std::fflush(stderr);
    return 1;
  } catch (const std::exception& e) {
    if (!world) throw;
    // Only this process failed; the others would wait in their next collective.
    std::fprintf(stderr, "onnxtrain: error: rank %d: %s\n", world->rank(), e.what());
    world->abort(1);
  }
  // Stopped by a signal after writing what it had: the shell's convention, 128 + the signal.
  return result.stopped_by_signal != 0 ? 128 + result.stopped_by_signal : 0;
}

}  // namespace
}  // namespace onnxtrain::tools

int main(int argc, char** argv) {
  onnxtrain::tools::keep_freed_memory();
  return onnxtrain::tools::run_cli("onnxtrain", [&] { return onnxtrain::tools::run(argc, argv); });
}
