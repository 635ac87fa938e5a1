// onnxrun: runs an ONNX model on the CPU executor with inputs from .npy / .pb files and writes
// every output as .npy; optionally benchmarks (median latency) and writes a Chrome trace.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "graph/error.h"
#include "graph/file_io.h"
#include "graph/onnx_io.h"
#include "ops/op_api.h"
#include "ops/plugin.h"
#include "passes/passes.h"
#include "runtime/npy.h"
#include "runtime/device/device.h"
#include "runtime/session.h"
#include "tools/inference_prep.h"
#include "tools/cli_main.h"

namespace onnxtrain::tools {
namespace {

namespace fs = std::filesystem;
using graph::DataType;
using graph::Tensor;

constexpr const char* kUsage =
    "usage: onnxrun MODEL.onnx --input NAME=FILE ... [--output-dir DIR] [options]\n"
    "       onnxrun --list-ops\n"
    "\n"
    "Runs MODEL on the CPU. Every graph input without an initializer needs an --input; each\n"
    "output is written to DIR/<output name>.npy (characters outside [A-Za-z0-9._-] become '_'),\n"
    "or summarized on stdout without --output-dir.\n"
    "\n"
    "options:\n"
    "  --input NAME=FILE  graph input NAME from FILE: NumPy .npy or ONNX TensorProto .pb\n"
    "                     (repeatable; may also override an initializer-backed input)\n"
    "  --output-dir DIR   where to write the outputs (created if missing)\n"
    "  --threads N        intra-op threads (default: all cores)\n"
    "  --device D         cpu | cuda | cuda:N (default: cuda when an NVIDIA GPU is present);\n"
    "                     nodes without a CUDA kernel run on the CPU through host copies\n"
    "  --bench N          after the first run, run N more times and print the median latency\n"
    "  --profile FILE     write a Chrome trace (chrome://tracing, Perfetto) of all runs\n"
    "  --custom-op-lib PATH\n"
    "                     load a custom-op library (built against ops/plugin_api.h) before\n"
    "                     the model (repeatable; --list-ops then lists its ops too)\n"
    "  --precision P      fp32 (default) | bf16 | fp16: mixed precision as onnxtrain's (the\n"
    "                     convolutions and matmuls in P, the elementwise ops that follow them\n"
    "                     too, the rest float32; outputs float32). On the CPU with native\n"
    "                     bf16 the fused convolutions run in bf16 too, their weights rounded\n"
    "                     to bf16 once. Refused where the device has no native P kernels\n"
    "                     (bf16 on the CPU: AVX512-BF16 or AMX) unless --allow-emulation\n"
    "                     (which runs unfused)\n"
    "  --allow-emulation  run --precision on a device without native kernels (slow)\n"
    "  --no-optimize      run the graph as written (by default Conv+BatchNormalization+Add+Relu\n"
    "                     chains are fused into oneDNN convolutions; results agree to 1e-4)\n"
    "  --conv-algorithm A direct (default) | winograd: oneDNN's Winograd kernels for 3x3\n"
    "                     stride-1 float32 convolutions over maps of at least 7x7 (CPU;\n"
    "                     faster on AVX-512, rounding error ~1e-6 relative instead of ~2e-7)\n"
    "  --list-ops         print the registered ops and exit\n"
    "  -h, --help         show this help\n";

// Bad command lines exit 2 (everything else that goes wrong exits 1).
class UsageError : public Error {
 public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void usage_fail(Args&&... args) {
  throw UsageError(cat(std::forward<Args>(args)..., " (see onnxrun --help)"));
}

struct Args {
  std::string model;
  std::vector<std::pair<std::string, std::string>> inputs;  // name, file
  std::vector<std::string> custom_op_libs;
  std::string output_dir;
  std::string profile;
  int threads = 0;
  std::string device;  // "" = runtime::default_device_spec()
  int bench = 0;
  bool list_ops = false;
  bool help = false;
  bool optimize = true;
  passes::ConvAlgorithm conv_algorithm = passes::ConvAlgorithm::kDirect;
  DataType precision = DataType::kFloat;
  bool allow_emulation = false;
};

int parse_count(std::string_view flag, std::string_view text, int min) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < min)
    usage_fail(flag, ": expected an integer >= ", min, ", got '", text, "'");
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto take_value = [&]() -> std::string {
      if (i + 1 >= argc) usage_fail(arg, " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      a.help = true;
    } else if (arg == "--list-ops") {
      a.list_ops = true;
    } else if (arg == "--input" || arg == "-i") {
      std::string v = take_value();
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == v.size())
        usage_fail("--input expects NAME=FILE, got '", v, "'");
      a.inputs.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (arg == "--custom-op-lib") {
      a.custom_op_libs.push_back(take_value());
      if (a.custom_op_libs.back().empty()) usage_fail(arg, ": empty path");
    } else if (arg == "--output-dir" || arg == "-o") {
      a.output_dir = take_value();
      if (a.output_dir.empty()) usage_fail(arg, ": empty folder name");
    } else if (arg == "--threads") {
      a.threads = parse_count(arg, take_value(), 0);
    } else if (arg == "--bench") {
      a.bench = parse_count(arg, take_value(), 1);
    } else if (arg == "--device") {
      a.device = take_value();
    } else if (arg == "--no-optimize") {
      a.optimize = false;
    } else if (arg == "--precision") {
      const std::string v = take_value();
      const std::optional<DataType> t = runtime::parse_precision(v);
      if (!t) usage_fail(arg, ": expected fp32, bf16 or fp16, got '", v, "'");
      a.precision = *t;
    } else if (arg == "--allow-emulation") {
      a.allow_emulation = true;
    } else if (arg == "--conv-algorithm") {
      const std::string v = take_value();
      const std::optional<passes::ConvAlgorithm> algo = passes::parse_conv_algorithm(v);
      if (!algo) usage_fail(arg, ": expected direct or winograd, got '", v, "'");
      a.conv_algorithm = *algo;
    } else if (arg == "--profile") {
      a.profile = take_value();
      if (a.profile.empty()) usage_fail(arg, ": empty file name");
    } else if (arg.size() > 1 && arg[0] == '-') {
      usage_fail("unknown option '", arg, "'");
    } else if (!a.model.empty()) {
      usage_fail("unexpected argument '", arg, "' (the model is already '", a.model, "')");
    } else {
      a.model = arg;
    }
  }
  return a;
}

std::string type_text(const graph::ValueType& t) {
  if (!t.is_tensor()) return "a non-tensor value";
  std::string s(graph::dtype_short_name(t.dtype));
  if (!t.shape) return s + "[?]";
  s += "[";
  for (size_t i = 0; i < t.shape->size(); ++i) {
    const graph::Dim& d = (*t.shape)[i];
    s += i ? "," : "";
    s += d.is_known() ? std::to_string(d.value) : d.param.empty() ? "?" : d.param;
  }
  return s + "]";
}

std::string type_text(const Tensor& t) {
  std::string s = cat(graph::dtype_short_name(t.dtype()), "[");
  for (size_t i = 0; i < t.dims().size(); ++i) s += cat(i ? "," : "", t.dims()[i]);
  return s + "]";
}

// A file given for graph input `v` must match its declared dtype and known dims.
void check_input(const graph::Value& v, const Tensor& t, const std::string& file) {
  const graph::ValueType& want = v.type;
  if (!want.is_tensor())
    fail("input '", v.name(), "' is ", type_text(want), "; only tensors can be given");
  bool ok = want.dtype == graph::DataType::kUndefined || want.dtype == t.dtype();
  if (ok && want.shape) {
    ok = want.shape->size() == t.dims().size();
    for (size_t i = 0; ok && i < t.dims().size(); ++i)
      ok = !(*want.shape)[i].is_known() || (*want.shape)[i].value == t.dims()[i];
  }
  OT_CHECK(ok, "input '", v.name(), "': ", file, " holds ", type_text(t), " but the model expects ",
           type_text(want));
}

std::string sanitize(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

// One file name per output: sanitized, with _2, _3 ... when two names collide.
std::vector<std::string> output_file_names(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  std::set<std::string> used;
  for (const auto& n : names) {
    std::string base = sanitize(n), candidate = base;
    for (int k = 2; used.count(candidate); ++k) candidate = cat(base, "_", k);
    used.insert(candidate);
    out.push_back(candidate + ".npy");
  }
  return out;
}

void list_ops() {
  auto all = ops::OpRegistry::global().all();
  std::printf("registered ops: %zu\n", all.size());
  for (const ops::OpSchema* s : all) {
    std::string range = s->until_version >= (1 << 30)
                            ? cat(s->since_version, "+")
                            : cat(s->since_version, "-", s->until_version);
    std::printf("  %s%s%s (opset %s)%s\n", s->domain.c_str(), s->domain.empty() ? "" : ".",
                s->op_type.c_str(), range.c_str(), s->cpu_kernel ? "" : " [no CPU kernel]");
  }
}

// The session would refuse unknown ops too; here the message can point at the flag.

double run_ms(runtime::InferenceSession& session, const std::map<std::string, Tensor>& feed) {
  auto start = std::chrono::steady_clock::now();
  session.run(feed);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int run(int argc, char** argv) {
  Args a = parse_args(argc, argv);
  if (a.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (const std::string& lib : a.custom_op_libs) ops::load_op_library(lib);
  if (a.list_ops) {
    list_ops();
    return 0;
  }
  if (a.model.empty()) usage_fail("no model given");

  std::unique_ptr<graph::Model> model = graph::import_onnx_file(a.model);
  const graph::Graph& g = *model->graph;
  std::map<std::string, Tensor> feed;
  for (const auto& [name, file] : a.inputs) {
    const graph::Value* v = g.find_value(name);
    if (!v || !v->is_graph_input()) {
      std::string known;
      for (const auto* in : g.inputs())
        if (!in->has_initializer()) known += cat(known.empty() ? "" : ", ", "'", in->name(), "'");
      fail("--input ", name, "=", file, ": the model has no input named '", name,
           "' (its inputs: ", known.empty() ? "none" : known, ")");
    }
    OT_CHECK(!feed.count(name), "--input ", name, " is given twice");
    Tensor t = runtime::read_tensor_file(file);
    check_input(*v, t, file);
    feed[name] = std::move(t);
  }
  std::string missing;
  for (const auto* v : g.inputs())
    if (!v->has_initializer() && !feed.count(v->name()))
      missing += cat(missing.empty() ? "" : ", ", "'", v->name(), "' ", type_text(v->type));
  OT_CHECK(missing.empty(), a.model, ": missing inputs: ", missing,
           " (give each with --input NAME=FILE)");

  std::vector<std::string> out_names;
  for (const auto* v : g.outputs()) out_names.push_back(v->name());
  // Before the run (issue #17): no file written is a file read or another file written, and each
  // can be written where it goes.
  {
    std::vector<graph::FileRole> reads{{"the model", a.model}};
    for (const auto& [name, file] : a.inputs) reads.push_back({cat("--input ", name), file});
    for (const std::string& lib : a.custom_op_libs) reads.push_back({"--custom-op-lib", lib});
    std::vector<graph::FileRole> writes{{"--profile", a.profile}};
    if (!a.output_dir.empty()) {
      const auto files = output_file_names(out_names);
      for (size_t i = 0; i < files.size(); ++i)
        writes.push_back({cat("output '", out_names[i], "'"),
                          (fs::path(a.output_dir) / files[i]).string()});
    }
    graph::check_distinct_files(reads, writes);
    graph::check_writable({"--profile", a.profile});
  }
  runtime::SessionOptions opts;
  opts.device = runtime::make_device(a.device.empty() ? runtime::default_device_spec() : a.device);
  const tools::InferencePrep prep = tools::prepare_inference(
      *model, *opts.device,
      {.optimize = a.optimize, .precision = a.precision, .allow_emulation = a.allow_emulation,
       .conv_algorithm = a.conv_algorithm},
      a.model);
  if (const auto& info = prep.autocast)
    std::printf("precision   %s mixed: %d Conv/Gemm/MatMul and %d following nodes in %s, "
                "%d casts; %s\n",
                runtime::precision_name(a.precision).c_str(), info->low_nodes, info->follow_nodes,
                runtime::precision_name(a.precision).c_str(), info->casts,
                prep.fusion ? cat(prep.fusion->fused_convs, " convolutions fused").c_str()
                            : "unfused");
  if (const auto& c = prep.conv)
    std::printf("convolution winograd on %d of %d convolutions\n", c->winograd_forward,
                c->forward);
  opts.threads = a.threads;
  opts.profile_path = a.profile;
  runtime::InferenceSession session(std::move(model), opts);

  auto start = std::chrono::steady_clock::now();
  std::vector<Tensor> outputs = session.run(feed);
  double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  OT_CHECK(outputs.size() == out_names.size(), "the run returned ", outputs.size(),
           " outputs but the graph has ", out_names.size());

  if (!a.output_dir.empty()) {
    // Check every output first so a failure leaves no partial set of files.
    for (size_t i = 0; i < outputs.size(); ++i)
      OT_CHECK(runtime::npy_supports(outputs[i].dtype()), "output '", out_names[i], "' is ",
               type_text(outputs[i]), ", which a .npy file cannot hold");
    std::error_code ec;
    fs::create_directories(a.output_dir, ec);
    OT_CHECK(!ec, a.output_dir, ": cannot create the output folder: ", ec.message());
    auto files = output_file_names(out_names);
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::string path = (fs::path(a.output_dir) / files[i]).string();
      runtime::write_npy(path, outputs[i]);
      std::printf("%s: %s -> %s\n", out_names[i].c_str(), type_text(outputs[i]).c_str(),
                  path.c_str());
    }
  } else {
    for (size_t i = 0; i < outputs.size(); ++i)
      std::printf("%s: %s = %s\n", out_names[i].c_str(), type_text(outputs[i]).c_str(),
                  outputs[i].preview(8).c_str());
  }

  if (a.bench > 0) {
    std::vector<double> ms;
    for (int k = 0; k < a.bench; ++k) ms.push_back(run_ms(session, feed));
    std::sort(ms.begin(), ms.end());
    size_t n = ms.size();
    double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    std::printf(
        "median latency: %.3f ms (%d runs after 1 warm-up of %.3f ms; min %.3f, max %.3f)\n",
        median, a.bench, first_ms, ms.front(), ms.back());
  }
  if (!a.profile.empty()) {
    session.write_profile(a.profile);
    std::printf("profile: %s\n", a.profile.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace onnxtrain::tools

int main(int argc, char** argv) {
  onnxtrain::tools::keep_freed_memory();
  return onnxtrain::tools::run_cli("onnxrun", [&] {
    try {
      return onnxtrain::tools::run(argc, argv);
    } catch (const onnxtrain::tools::UsageError& e) {
      std::fprintf(stderr, "onnxrun: error: %s\n", e.what());
      return 2;
    }
  });
}
