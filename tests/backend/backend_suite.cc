// The ONNX backend test suite (Debian libonnx-testdata) run through InferenceSession: every test
// whose ops all have CPU kernels runs and its outputs are compared with the reference; the rest
// are skipped and their missing ops counted. Exit 1 when a test fails that is not excluded.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "passes/passes.h"
#include "runtime/npy.h"
#include "runtime/device/device.h"
#include "runtime/session.h"

namespace onnxtrain::backend_test {
namespace {

namespace fs = std::filesystem;
using graph::DataType;
using graph::Tensor;

constexpr const char* kDefaultDataDir = "/usr/share/libonnx-testdata/data";
constexpr const char* kSuites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-7;
constexpr int kSkipExitCode = 77;  // ctest SKIP_RETURN_CODE: the test data is not installed

const char* const kUsage =
    "usage: backend_suite [options]\n"
    "Runs the ONNX backend test data through the CPU executor.\n"
    "  --data-dir DIR        test data root (default /usr/share/libonnx-testdata/data)\n"
    "  --filter SUBSTR       only tests whose 'suite/name' contains SUBSTR (repeatable)\n"
    "  --exclusions FILE     known failures, 'test_name  reason' per line (default: the\n"
    "                        source tree's tests/backend/exclusions.txt)\n"
    "  --threads N           intra-op threads per session (default: all cores)\n"
    "  --device D            cpu (default) | sim | cuda[:N]: where tensors live and kernels\n"
    "                        run; nodes without a kernel there run on the CPU through host\n"
    "                        copies. cuda without a GPU: exit 77 (skipped)\n"
    "  --list-unsupported    list the ops that keep tests from running, with the tests\n"
    "  --optimize            rewrite each model with onnxrun's default inference optimizations\n"
    "                        (passes::optimize_inference) before running it\n"
    "  --verbose             one line per test\n"
    "  --help\n";

struct Options {
  std::string data_dir = kDefaultDataDir;
  std::string exclusions_path =
#ifdef ONNXTRAIN_SOURCE_DIR
      std::string(ONNXTRAIN_SOURCE_DIR) + "/tests/backend/exclusions.txt";
#else
      "";
#endif
  std::vector<std::string> filters;
  int threads = 0;
  std::string device = "cpu";
  std::shared_ptr<runtime::Device> dev;
  // Nodes the device ran with its own kernels / through host copies, over every plan.
  int64_t device_nodes = 0, staged_nodes = 0;
  bool verbose = false;
  bool list_unsupported = false;
  bool optimize = false;  // passes::optimize_inference first, as onnxrun does by default
};

enum class Outcome { kPass, kFail, kSkip };

struct TestCase {
  std::string suite, name;
  fs::path dir;
  std::string id() const { return suite + "/" + name; }
};

struct Result {
  Outcome outcome = Outcome::kSkip;
  std::string message;
  std::vector<std::string> unsupported;
  double ms = 0;
};

// ---------------------------------------------------------------- comparison

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits = 0;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant != 0) {  // subnormal: renormalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  } else {
    bits = sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Element i of a floating tensor as double; nullopt for other dtypes.
std::optional<double> float_at(const Tensor& t, int64_t i) {
  const std::byte* p = t.data();
  switch (t.dtype()) {
    case DataType::kFloat: {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      return v;
    }
    case DataType::kDouble: {
      double v;
      std::memcpy(&v, p + i * 8, 8);
      return v;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p + i * 2, 2);
      return t.dtype() == DataType::kFloat16 ? half_to_float(v) : bf16_to_float(v);
    }
    default:
      return std::nullopt;
  }
}

bool is_tolerance_dtype(DataType t) {
  return t == DataType::kFloat || t == DataType::kDouble || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string type_text(const Tensor& t) {
  return cat(graph::dtype_short_name(t.dtype()), dims_text(t.dims()));
}

std::string index_text(const std::vector<int64_t>& dims, int64_t flat) {
  std::vector<int64_t> idx(dims.size());
  for (size_t k = dims.size(); k-- > 0;) {
    idx[k] = dims[k] ? flat % dims[k] : 0;
    flat = dims[k] ? flat / dims[k] : 0;
  }
  return dims_text(idx);
}

bool close_enough(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;  // also equal infinities
  return std::fabs(a - b) <= kAtol + kRtol * std::fabs(b);
}

// Nullopt when `actual` matches `expected`; otherwise what differs, on one line.
std::optional<std::string> compare(const Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != expected.dtype() || actual.dims() != expected.dims())
    return cat("got ", type_text(actual), ", expected ", type_text(expected));
  int64_t n = expected.numel(), bad = 0, first = -1;
  std::string first_text;
  if (expected.dtype() == DataType::kString) {
    for (int64_t i = 0; i < n; ++i)
      if (actual.strings()[i] != expected.strings()[i] && bad++ == 0) {
        first = i;
        first_text =
            cat("\"", actual.strings()[i], "\" but expected \"", expected.strings()[i], "\"");
      }
  } else if (is_tolerance_dtype(expected.dtype())) {
    for (int64_t i = 0; i < n; ++i) {
      double a = *float_at(actual, i), b = *float_at(expected, i);
      if (!close_enough(a, b) && bad++ == 0) {
        first = i;
        first_text = cat(a, " but expected ", b, " (|diff| ", std::fabs(a - b), ")");
      }
    }
  } else {
    size_t width = std::max(1, graph::dtype_bits(expected.dtype()) / 8);
    if (graph::dtype_bits(expected.dtype()) < 8) {  // packed 4-bit: compare bytes
      if (actual.nbytes() && std::memcmp(actual.data(), expected.data(), actual.nbytes()) != 0)
        return std::string("packed 4-bit values differ");
      return std::nullopt;
    }
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(actual.data() + i * width, expected.data() + i * width, width) != 0 &&
          bad++ == 0) {
        first = i;
        Tensor a1(actual.dtype(), {1}), e1(expected.dtype(), {1});
        std::memcpy(a1.mutable_data(), actual.data() + i * width, width);
        std::memcpy(e1.mutable_data(), expected.data() + i * width, width);
        first_text = cat(a1.preview(1), " but expected ", e1.preview(1));
      }
  }
  if (bad == 0) return std::nullopt;
  return cat(bad, " of ", n, " elements differ; first at ", index_text(expected.dims(), first),
             ": ", first_text);
}

// ---------------------------------------------------------------- one test

// numpy has no bfloat16 / float8, so the test data stores such tensors as uint16 / uint8 of
// the same bits (the ONNX runner converts them with the graph's declared type). Same here.
Tensor as_declared(Tensor t, DataType declared) {
  bool retag = (declared == DataType::kBFloat16 && t.dtype() == DataType::kUInt16) ||
               (graph::is_float_dtype(declared) && graph::dtype_bits(declared) == 8 &&
                t.dtype() == DataType::kUInt8);
  if (!retag) return t;
  Tensor out(declared, t.dims());
  if (out.nbytes()) std::memcpy(out.mutable_data(), t.data(), out.nbytes());
  return out;
}

std::vector<fs::path> sorted_entries(const fs::path& dir, const std::string& prefix,
                                     bool want_dirs) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind(prefix, 0) != 0) continue;
    if (e.is_directory() == want_dirs) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// input_0.pb, input_1.pb, ... in numeric order, stopping at the first gap.
std::vector<fs::path> numbered_files(const fs::path& dir, const std::string& stem) {
  std::vector<fs::path> out;
  for (int i = 0;; ++i) {
    fs::path p = dir / cat(stem, "_", i, ".pb");
    if (!fs::exists(p)) break;
    out.push_back(p);
  }
  return out;
}

const char* non_tensor_kind(const graph::ValueType& t) {
  switch (t.kind) {
    case graph::ValueType::Kind::kTensor:
      return nullptr;
    case graph::ValueType::Kind::kSequence:
      return "sequence";
    case graph::ValueType::Kind::kOptional:
      return "optional";
    case graph::ValueType::Kind::kMap:
      return "map";
    case graph::ValueType::Kind::kSparseTensor:
      return "sparse tensor";
    default:
      return "untyped";
  }
}

Result run_data_sets(const TestCase& tc, std::unique_ptr<graph::Model> model, Options& opts) {
  Result r;
  // ONNX convention: input_i.pb feeds the i-th graph input that has no initializer;
  // output_i.pb is the i-th graph output.
  std::vector<std::string> inputs, outputs;
  std::vector<DataType> input_types, output_types;
  for (const auto* v : model->graph->inputs())
    if (!v->has_initializer()) {
      inputs.push_back(v->name());
      input_types.push_back(v->dtype());
    }
  for (const auto* v : model->graph->outputs()) {
    outputs.push_back(v->name());
    output_types.push_back(v->dtype());
  }

  runtime::SessionOptions so;
  so.threads = opts.threads;
  so.device = opts.dev;
  if (opts.optimize) passes::optimize_inference(*model);
  runtime::InferenceSession session(std::move(model), so);
  auto data_sets = sorted_entries(tc.dir, "test_data_set_", true);
  OT_CHECK(!data_sets.empty(), "no test_data_set_* folder");
  for (const auto& ds : data_sets) {
    std::string set = ds.filename().string();
    auto in_files = numbered_files(ds, "input");
    auto out_files = numbered_files(ds, "output");
    OT_CHECK(in_files.size() <= inputs.size(), set, ": ", in_files.size(),
             " input files but the graph has ", inputs.size(), " inputs without initializer");
    std::map<std::string, Tensor> feed;
    for (size_t i = 0; i < in_files.size(); ++i)
      feed[inputs[i]] = as_declared(runtime::read_tensor_pb(in_files[i].string()), input_types[i]);
    std::vector<Tensor> got = session.run(feed);
    OT_CHECK(out_files.size() == got.size(), set, ": the run returned ", got.size(),
             " outputs but there are ", out_files.size(), " reference outputs");
    for (size_t i = 0; i < out_files.size(); ++i) {
      Tensor want = as_declared(runtime::read_tensor_pb(out_files[i].string()), output_types[i]);
      if (auto diff = compare(got[i], want))
        fail(set, ": output ", i, " '", outputs[i], "': ", *diff);
    }
    opts.device_nodes += session.last_plan_stats().device_nodes;
    opts.staged_nodes += session.last_plan_stats().staged_nodes;
  }
  r.outcome = Outcome::kPass;
  return r;
}

// Never throws: every problem of one test becomes its Result.
Result run_test(const TestCase& tc, Options& opts, bool list_only) {
  Result r;
  auto start = std::chrono::steady_clock::now();
  try {
    auto model = graph::import_onnx_file((tc.dir / "model.onnx").string());
    // As the tools do: sequences with a static structure become tensor ops; the rest stay and
    // are counted as unsupported.
    passes::lower_sequences(*model);
    r.unsupported = runtime::unsupported_ops(*model);
    if (!r.unsupported.empty()) {
      std::string ops;
      for (const auto& op : r.unsupported) ops += (ops.empty() ? "" : ", ") + op;
      r.message = "unsupported: " + ops;
      return r;
    }
    for (const auto* list : {&model->graph->inputs(), &model->graph->outputs()})
      for (const auto* v : *list)
        if (const char* kind = non_tensor_kind(v->type)) {
          r.message = cat("graph ", list == &model->graph->inputs() ? "input" : "output", " '",
                          v->name(), "' is a ", kind, " (only tensors are bound)");
          return r;
        }
    if (list_only) return r;
    r = run_data_sets(tc, std::move(model), opts);
  } catch (const Error& e) {
    r.outcome = Outcome::kFail;
    r.message = e.what();
  } catch (const std::bad_alloc&) {
    r.outcome = Outcome::kFail;
    r.message = "out of memory";
  } catch (const std::exception& e) {
    r.outcome = Outcome::kFail;
    r.message = cat("unexpected exception: ", e.what());
  } catch (...) {
    r.outcome = Outcome::kFail;
    r.message = "unknown exception";
  }
  r.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// ---------------------------------------------------------------- driver

// `test_name  reason` per line; '#' starts a comment. Keyed by name or suite/name.
std::map<std::string, std::string> load_exclusions(const std::string& path) {
  std::map<std::string, std::string> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "backend_suite: note: no exclusion list at %s\n", path.c_str());
    return out;
  }
  std::string line;
  while (std::getline(in, line)) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream ls(line);
    std::string name, reason;
    if (!(ls >> name)) continue;
    std::getline(ls >> std::ws, reason);
    while (!reason.empty() && std::isspace(static_cast<unsigned char>(reason.back())))
      reason.pop_back();
    out[name] = reason.empty() ? "no reason given" : reason;
  }
  return out;
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "backend_suite: error: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage_error(cat(argv[i], " needs a value"));
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--data-dir") {
      o.data_dir = value(i);
    } else if (a == "--filter") {
      o.filters.push_back(value(i));
    } else if (a == "--exclusions") {
      o.exclusions_path = value(i);
    } else if (a == "--threads") {
      std::string v = value(i);
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 0 || n > 4096) usage_error("--threads needs a count >= 0");
      o.threads = static_cast<int>(n);
    } else if (a == "--device") {
      o.device = value(i);
    } else if (a == "--optimize") {
      o.optimize = true;
    } else if (a == "--verbose" || a == "-v") {
      o.verbose = true;
    } else if (a == "--list-unsupported") {
      o.list_unsupported = true;
    } else {
      usage_error(cat("unknown option '", a, "'"));
    }
  }
  return o;
}

std::vector<TestCase> discover(const Options& o) {
  std::vector<TestCase> out;
  for (const char* suite : kSuites) {
    fs::path dir = fs::path(o.data_dir) / suite;
    if (!fs::is_directory(dir)) {
      std::printf("backend_suite: note: %s missing, its tests are not run\n", dir.c_str());
      continue;
    }
    for (const auto& t : sorted_entries(dir, "", true)) {
      if (!fs::exists(t / "model.onnx")) continue;
      TestCase tc{suite, t.filename().string(), t};
      bool wanted = o.filters.empty();
      for (const auto& f : o.filters) wanted = wanted || tc.id().find(f) != std::string::npos;
      if (wanted) out.push_back(std::move(tc));
    }
  }
  return out;
}

// "Op1 (12), Op2 (3)" by count, then name.
std::vector<std::pair<std::string, int>> by_count(const std::map<std::string, int>& counts) {
  std::vector<std::pair<std::string, int>> v(counts.begin(), counts.end());
  std::stable_sort(v.begin(), v.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return v;
}

int run(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  if (!fs::is_directory(o.data_dir)) {
    std::printf("backend_suite: no test data at %s (apt-get install libonnx-testdata); skipped\n",
                o.data_dir.c_str());
    return kSkipExitCode;
  }
  if (o.device.rfind("cuda", 0) == 0 && runtime::cuda_device_count() == 0) {
    std::printf("backend_suite: --device %s: no CUDA GPU found; skipped\n", o.device.c_str());
    return kSkipExitCode;
  }
  // The reference outputs are float32 (or wider) math: TF32 rounding misses their tolerance
  // (Linear, addmm, Conv on an H200).
  runtime::set_cuda_tf32(false);
  o.dev = runtime::make_device(o.device);
  auto exclusions = load_exclusions(o.exclusions_path);
  std::vector<TestCase> tests = discover(o);
  int passed = 0, failed = 0, skipped = 0;
  std::map<std::string, int> unsupported_counts;
  std::map<std::string, std::vector<std::string>> unsupported_tests;
  std::vector<std::string> failures;
  auto suite_start = std::chrono::steady_clock::now();

  for (const auto& tc : tests) {
    auto ex = exclusions.find(tc.name);
    if (ex == exclusions.end()) ex = exclusions.find(tc.id());
    if (ex != exclusions.end() && !o.list_unsupported) {
      ++skipped;
      std::printf("SKIP %s: excluded: %s\n", tc.id().c_str(), ex->second.c_str());
      continue;
    }
    Result r = run_test(tc, o, o.list_unsupported);
    for (const auto& op : r.unsupported) {
      ++unsupported_counts[op];
      unsupported_tests[op].push_back(tc.id());
    }
    switch (r.outcome) {
      case Outcome::kPass:
        ++passed;
        if (o.verbose) std::printf("PASS %s (%.1f ms)\n", tc.id().c_str(), r.ms);
        break;
      case Outcome::kFail:
        ++failed;
        failures.push_back(tc.id());
        std::printf("FAIL %s: %s\n", tc.id().c_str(), r.message.c_str());
        break;
      case Outcome::kSkip:
        ++skipped;
        if (o.verbose) std::printf("SKIP %s: %s\n", tc.id().c_str(), r.message.c_str());
        break;
    }
    std::fflush(stdout);
  }

  if (o.list_unsupported) {
    for (const auto& [op, n] : by_count(unsupported_counts)) {
      std::printf("%s (%d):", op.c_str(), n);
      for (const auto& t : unsupported_tests[op]) std::printf(" %s", t.c_str());
      std::printf("\n");
    }
  }
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - suite_start).count();
  std::printf("backend_suite: %zu tests in %.1f s\n", tests.size(), secs);
  std::printf("backend: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
  if (o.dev && !o.dev->host_memory())
    std::printf("device %s: %lld nodes ran on its own kernels, %lld through host copies\n",
                o.dev->name().c_str(), static_cast<long long>(o.device_nodes),
                static_cast<long long>(o.staged_nodes));
  std::string line;
  for (const auto& [op, n] : by_count(unsupported_counts))
    line += cat(line.empty() ? "" : ", ", op, " (", n, ")");
  std::printf("unsupported: %s\n", line.empty() ? "none" : line.c_str());
  return failed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace onnxtrain::backend_test

int main(int argc, char** argv) {
  try {
    return onnxtrain::backend_test::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backend_suite: error: %s\n", e.what());
    return 1;
  }
}
