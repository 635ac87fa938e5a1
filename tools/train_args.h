// onnxtrain's command line: the usage text and the parser into a TrainConfig, shared by the CLI
// (tools/onnxtrain.cc) and the Python module (python/_onnxtrain.cc).
#pragma once

#include <string>

#include "graph/error.h"
#include "tools/train_loop.h"

namespace onnxtrain::tools {

// `onnxtrain --help`.
extern const char* const kTrainUsage;

// A malformed command line (the CLI exits 2; Python raises ValueError).
class UsageError : public Error {
 public:
  using Error::Error;
};

struct Args {
  TrainConfig config;
  bool help = false, version = false;
  bool epochs_given = false, steps_given = false;
  bool batch_given = false, global_batch_given = false;
  bool momentum_given = false;
  std::string mean, std;
  double collective_timeout = 300;  // seconds
};

// argv[0] is the program name. Throws UsageError naming the flag; the specs' syntax (data,
// schedule) is checked too, the files are not opened.
Args parse_train_args(int argc, const char* const* argv);

}  // namespace onnxtrain::tools
