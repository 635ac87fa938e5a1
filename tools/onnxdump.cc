// onnxdump: prints an ONNX model (inference or onnxtrain training graph) as text IR, Graphviz,
// JSON, statistics, an initializer list or the nodes of one op type. Usage errors exit with 2.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/printer.h"
#include "ops/plugin.h"
#include "tools/cli_main.h"
#include "tools/dump.h"

#ifndef ONNXTRAIN_VERSION
#define ONNXTRAIN_VERSION "0.1.0"
#endif

namespace onnxtrain::tools {
namespace {

constexpr int kUsageExit = 2;

constexpr const char* kUsage = R"(usage: onnxdump [options] MODEL.onnx

Prints an ONNX model: the ops of an exported network or of an onnxtrain training graph
(custom domains, per-node device placement, If/Loop/Scan subgraphs). MODEL may be '-' to
read the model from standard input.

views (at most one; default: the whole graph in the --format):
  --format FMT        text (default): one line per node, as the pass tests print it
                      dot: Graphviz digraph, e.g. onnxdump m.onnx --format dot | dot -Tsvg -o m.svg
                      json: one JSON document (schema "onnxdump/1")
  --stats             node count per op type, node total, parameter count (float
                      initializers except BatchNormalization running mean/var), initializer
                      total, inputs, outputs, opsets
  --initializers      one line per initializer: name, dtype, shape, first values
  --grep OPTYPE       only the nodes of that op type (or DOMAIN.OPTYPE), then their count

other options:
  --custom-op-lib PATH
                      load a custom-op library (ops/plugin_api.h) first (repeatable).
                      Printing needs no op library; the flag lets onnxrun / onnxtrain
                      command lines be reused, and a bad library fails here as there
  --no-initializers   text format: leave out the initializer lines
  --no-verify         do not run the graph verifier after loading (inspect a broken graph)
  -h, --help          this text
  --version           print the version

exit status: 0 success, 1 the model could not be read (message on stderr),
             2 usage error (unknown option, missing or bad argument)
)";

// A mistake on the command line, as opposed to a problem with the model.
class UsageError : public Error {
 public:
  using Error::Error;
};

enum class View { kGraph, kStats, kInitializers, kGrep };
enum class Format { kText, kDot, kJson };

struct Options {
  std::string model;
  View view = View::kGraph;
  Format format = Format::kText;
  bool format_given = false;
  std::string grep;
  std::vector<std::string> custom_op_libs;
  bool show_initializers = true;
  bool verify = true;
  bool help = false;
  bool version = false;
};

Format parse_format(std::string_view s) {
  if (s == "text") return Format::kText;
  if (s == "dot") return Format::kDot;
  if (s == "json") return Format::kJson;
  throw UsageError(cat("unknown --format '", s, "' (expected text, dot or json)"));
}

void set_view(Options& o, View v, std::string_view flag) {
  if (o.view != View::kGraph && o.view != v)
    throw UsageError(cat(flag, " cannot be combined with --stats, --initializers or --grep"));
  o.view = v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    // --flag=value and --flag value are both accepted for options taking a value.
    auto value_of = [&](std::string_view flag) -> std::optional<std::string> {
      if (arg == flag) {
        if (i + 1 >= argc) throw UsageError(cat(flag, " needs a value"));
        return std::string(argv[++i]);
      }
      if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag && arg[flag.size()] == '=')
        return std::string(arg.substr(flag.size() + 1));
      return std::nullopt;
    };
    if (only_positional || arg == "-" || arg.empty() || arg[0] != '-') {
      if (!o.model.empty()) throw UsageError(cat("unexpected extra argument '", arg, "'"));
      if (arg.empty()) throw UsageError("empty model path");
      o.model = std::string(arg);
    } else if (arg == "--") {
      only_positional = true;
    } else if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "--version") {
      o.version = true;
    } else if (arg == "--stats") {
      set_view(o, View::kStats, arg);
    } else if (arg == "--initializers") {
      set_view(o, View::kInitializers, arg);
    } else if (arg == "--no-initializers") {
      o.show_initializers = false;
    } else if (arg == "--no-verify") {
      o.verify = false;
    } else if (auto f = value_of("--format")) {
      o.format = parse_format(*f);
      o.format_given = true;
    } else if (auto lib = value_of("--custom-op-lib")) {
      if (lib->empty()) throw UsageError("--custom-op-lib needs a path");
      o.custom_op_libs.push_back(*lib);
    } else if (auto g = value_of("--grep")) {
      if (g->empty()) throw UsageError("--grep needs an op type");
      set_view(o, View::kGrep, "--grep");
      o.grep = *g;
    } else {
      throw UsageError(cat("unknown option '", arg, "' (see --help)"));
    }
  }
  if (o.help || o.version) return o;
  if (o.model.empty()) throw UsageError("no model given (usage: onnxdump [options] MODEL.onnx)");
  if (o.format_given && o.format != Format::kText && o.view != View::kGraph)
    throw UsageError(
        "--format dot/json applies to the graph view, not to --stats, "
        "--initializers or --grep");
  return o;
}

std::unique_ptr<graph::Model> load(const Options& o) {
  graph::LoadOptions lo;
  lo.verify = o.verify;
  if (o.model != "-") return graph::import_onnx_file(o.model, lo);
  // Read at most one byte more than the limit so an oversized stream is refused by import.
  std::string bytes;
  char buf[1 << 16];
  while (static_cast<int64_t>(bytes.size()) <= lo.max_file_bytes) {
    size_t got = std::fread(buf, 1, sizeof buf, stdin);
    if (got == 0) break;
    bytes.append(buf, got);
  }
  OT_CHECK(!std::ferror(stdin), "<stdin>: read failed");
  return graph::import_onnx_bytes(bytes, "<stdin>", "", lo);
}

int run(int argc, char** argv) {
  Options o;
  try {
    o = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "onnxdump: error: %s\n", e.what());
    return kUsageExit;
  }
  if (o.help) {
    std::cout << kUsage;
    return 0;
  }
  if (o.version) {
    std::cout << "onnxdump (onnxtrain) " << ONNXTRAIN_VERSION << '\n';
    return 0;
  }

  for (const std::string& lib : o.custom_op_libs) ops::load_op_library(lib);
  std::unique_ptr<graph::Model> model = load(o);
  std::ostream& os = std::cout;
  switch (o.view) {
    case View::kStats:
      write_stats(os, *model);
      break;
    case View::kInitializers:
      write_initializers(os, *model);
      break;
    case View::kGrep:
      write_grep(os, *model, o.grep);
      break;
    case View::kGraph:
      if (o.format == Format::kDot) {
        write_dot(os, *model);
      } else if (o.format == Format::kJson) {
        write_json(os, *model);
      } else {
        graph::PrintOptions po;
        po.show_initializers = o.show_initializers;
        graph::print_model(os, *model, po);
      }
      break;
  }
  os.flush();
  // A full disk or a closed pipe must not pass for a complete dump.
  OT_CHECK(os.good(), "writing to standard output failed");
  return 0;
}

}  // namespace
}  // namespace onnxtrain::tools

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  return onnxtrain::tools::run_cli("onnxdump", [&] { return onnxtrain::tools::run(argc, argv); });
}
