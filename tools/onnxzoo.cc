// onnxzoo: writes a reference model from the zoo (linear, mlp, cnn, resnet18/34/50) as an
// .onnx file with seeded PyTorch-default weights.
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "models/zoo.h"
#include "tools/cli_main.h"

namespace onnxtrain::tools {
namespace {

constexpr const char* kUsage =
    "usage: onnxzoo NAME [--input CxHxW] [--classes N] [--width W] [--vocab V] [--seed S] -o FILE\n"
    "       onnxzoo --list\n"
    "\n"
    "Writes the zoo model NAME as an ONNX file (opset 17) with a symbolic batch dimension N:\n"
    "input \"input\" [N,C,H,W] f32, output \"logits\" [N,classes] f32, PyTorch-default\n"
    "(Kaiming-uniform) initial weights drawn from SEED; the same options give the same bytes.\n"
    "\n"
    "options:\n"
    "  --input SHAPE    one example's shape, e.g. 3x224x224 (a single D for linear/mlp);\n"
    "                   default depends on the model (see --list)\n"
    "  --classes N      number of output classes (default: 10, 1000 for resnets)\n"
    "  --width W        base channels (cnn, resnets) or hidden units (mlp)\n"
    "  --vocab V        token models (textcls, tokenlm): embedding rows; their --input is\n"
    "                   the sequence length T and their inputs are \"input_ids\" (and\n"
    "                   \"attention_mask\") [N,T] i64\n"
    "  --seed S         seed of the initial weights (default 0)\n"
    "  -o, --output F   file to write (atomically)\n"
    "  --list           list the models with their defaults\n"
    "  -h, --help       show this help\n";

struct Args {
  std::string name;
  std::string output;
  models::ZooOptions opts;
  bool list = false;
  bool help = false;
};

uint64_t parse_u64(std::string_view flag, std::string_view text) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  OT_CHECK(!text.empty() && ec == std::errc() && ptr == text.data() + text.size(), flag,
           ": expected a non-negative integer, got '", text, "'");
  return v;
}

int64_t parse_positive(std::string_view flag, std::string_view text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  OT_CHECK(!text.empty() && ec == std::errc() && ptr == text.data() + text.size() && v > 0, flag,
           ": expected a positive integer, got '", text, "'");
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_inline_value = false;
    if (arg.starts_with("--") && arg.find('=') != std::string::npos) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      has_inline_value = true;
    }
    auto take_value = [&]() -> std::string {
      if (has_inline_value) return value;
      OT_CHECK(i + 1 < argc, arg, " needs a value (see onnxzoo --help)");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      a.help = true;
    } else if (arg == "--list") {
      a.list = true;
    } else if (arg == "-o" || arg == "--output") {
      a.output = take_value();
      OT_CHECK(!a.output.empty(), arg, ": empty file name");
    } else if (arg == "--input") {
      a.opts.input_shape = models::parse_dims(take_value());
    } else if (arg == "--classes") {
      a.opts.classes = parse_positive(arg, take_value());
    } else if (arg == "--width") {
      a.opts.width = parse_positive(arg, take_value());
    } else if (arg == "--vocab") {
      a.opts.vocab = parse_positive(arg, take_value());
    } else if (arg == "--seed") {
      a.opts.seed = parse_u64(arg, take_value());
    } else if (arg.size() > 1 && arg[0] == '-') {
      fail("unknown option '", arg, "' (see onnxzoo --help)");
    } else {
      OT_CHECK(a.name.empty(), "unexpected argument '", arg, "' (model '", a.name,
               "' is already given)");
      a.name = arg;
    }
  }
  return a;
}

// 25557032 -> "25,557,032"
std::string with_thousands(int64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

void print_list() {
  for (const models::ZooEntry& e : models::zoo_models()) {
    std::string defaults =
        cat("input ", models::format_dims(e.default_input), ", ", e.default_classes, " classes");
    if (e.default_width != 0) defaults += cat(", width ", e.default_width);
    if (e.default_vocab != 0) defaults += cat(", vocab ", e.default_vocab);
    std::printf("%-10s %s (default %s)\n", e.name.c_str(), e.description.c_str(), defaults.c_str());
  }
}

std::string known_names() {
  std::string out;
  for (const models::ZooEntry& e : models::zoo_models()) out += (out.empty() ? "" : ", ") + e.name;
  return out;
}

int run(int argc, char** argv) {
  Args a = parse_args(argc, argv);
  if (a.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (a.list) {
    print_list();
    return 0;
  }
  OT_CHECK(!a.name.empty(), "no model name given (one of: ", known_names(),
           "; see onnxzoo --help)");
  // Check the name first so a typo is reported as such, not as a missing -o.
  bool known = false;
  for (const models::ZooEntry& e : models::zoo_models()) known |= e.name == a.name;
  OT_CHECK(known, "unknown model '", a.name, "' (known models: ", known_names(), ")");
  OT_CHECK(!a.output.empty(), "missing -o FILE (where to write the model)");

  std::unique_ptr<graph::Model> m = models::build_zoo_model(a.name, a.opts);
  graph::export_onnx_file(*m, a.output);
  std::printf("wrote %s: %s, %s parameters, %zu nodes\n", a.output.c_str(), a.name.c_str(),
              with_thousands(models::count_parameters(*m)).c_str(), m->graph->num_nodes());
  return 0;
}

}  // namespace
}  // namespace onnxtrain::tools

int main(int argc, char** argv) {
  return onnxtrain::tools::run_cli("onnxzoo", [&] { return onnxtrain::tools::run(argc, argv); });
}
