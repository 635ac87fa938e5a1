// Harness of the hostile-input tests: bounded child processes (a fork for the API, onnxdump for
// the CLI), builders of hostile ONNX protos, and the fixture that asserts one clean error.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "onnx/onnx_pb.h"

namespace onnxtrain::hostile {

namespace fs = std::filesystem;
using Strings = std::vector<std::string>;

// "No huge allocation": a child whose resident memory passes this is killed and the case fails.
constexpr long kMaxChildRssKb = 768L * 1024;
constexpr int kChildSeconds = 120;

struct ChildResult {
  bool exited = false;  // exited normally (not killed by a signal)
  int code = -1;
  int signal = 0;
  long max_rss_kb = 0;
  std::string killed_for;  // why the watchdog killed it, empty if it did not
  std::string out, err;

  bool within_limits() const { return killed_for.empty() && max_rss_kb <= kMaxChildRssKb; }
  std::string describe() const;
};

std::string slurp(const fs::path& p);
// Reaps `pid`, killing it when it outgrows kMaxChildRssKb or runs longer than `seconds`.
ChildResult wait_bounded(pid_t pid, int seconds);
// Runs `body` in a forked child; its return value comes back in ChildResult::out.
ChildResult run_forked(const std::function<std::string()>& body, const fs::path& scratch,
                       int seconds = kChildSeconds);
// Runs onnxdump with stdin from /dev/null and stdout/stderr captured in files under `scratch`.
ChildResult run_onnxdump(const Strings& args, const fs::path& scratch);
// One-letter outcome of an API load: E<message> (onnxtrain::Error), X<message> (any other
// exception: a finding), O (loaded).
std::string load_outcome(const std::function<void()>& load);

// ---------------------------------------------------------------- hostile protos

std::string raw_floats(const std::vector<float>& v);
std::vector<float> floats_of(const graph::Tensor& t);
void set_tensor_type(onnx::ValueInfoProto* vi, const std::string& name, int elem_type,
                     const std::vector<int64_t>& dims);
onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, const Strings& inputs,
                          const Strings& outputs, const std::string& name,
                          const std::string& domain = "");
onnx::GraphProto* add_graph_attr(onnx::NodeProto* n, const std::string& name);
onnx::TensorProto* add_initializer(onnx::GraphProto* g, const std::string& name, int dtype,
                                   const std::vector<int64_t>& dims);
onnx::ModelProto empty_model();
// y = Add(x, w) with x: f32[4] input, w: f32[4] = {1,2,3,4} initializer.
onnx::ModelProto add_model();
// The Add model with w moved to external data; nullptr leaves a key out.
onnx::ModelProto external_model(const char* location, const char* offset, const char* length,
                                const std::vector<int64_t>& dims = {4});
// The Add model with w of `dtype` and `dims` and no data at all.
onnx::ModelProto model_with_w(int dtype, const std::vector<int64_t>& dims);
// Adds function `name` (domain "local", input a, output b, empty body) and the "local" opset.
onnx::FunctionProto* add_function(onnx::ModelProto& m, const std::string& name);
// A small model touching most of the format: initializers in raw and typed form, an attribute
// tensor, an If with two subgraphs, a model-local function, value_info.
onnx::ModelProto rich_model();
// A model whose innermost subgraph sits `levels` If-nestings below the main graph.
onnx::ModelProto nested_if_model(int levels);

// ---------------------------------------------------------------- fixture

// Each test gets root_ = <tmp>/onnxtrain_hostile_<pid>_<test> holding model/ (dir_, the model's
// folder, with w.bin = {1,2,3,4}) and files outside it that no load may read.
class Hostile : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  static void write_file(const fs::path& p, const std::string& bytes);
  std::string write_model(const onnx::ModelProto& m, const std::string& name = "model.onnx");
  // The API load of `path` in a child: its outcome string (see load_outcome).
  ChildResult api_load(const std::string& path, const graph::LoadOptions& opts = {});
  // (a) the API throws onnxtrain::Error "<path>: ..." on one line containing every fragment;
  // (b) onnxdump (default options only) exits 1 with exactly that line after "onnxdump: error: ".
  void expect_rejected(const std::string& path, const Strings& fragments,
                       const graph::LoadOptions& opts = {}, bool run_cli = true);
  void expect_cli_error(const std::string& path, const Strings& fragments,
                        const std::string& api_msg = "");
  void expect_cli_ok(const std::string& path);

  fs::path root_, dir_;
};

}  // namespace onnxtrain::hostile
