// make_scaled_tanh_mlp: writes a zoo-style MLP whose activations are my.ops.ScaledTanh —
// 2 x (Gemm + ScaledTanh), Gemm — with input "input" f32 [N, D], output "logits"
// f32 [N, classes] and seeded PyTorch-default weights (models::GraphBuilder, like onnxzoo).
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "models/builder.h"
#include "tools/cli_main.h"

namespace {

using onnxtrain::fail;
namespace graph = onnxtrain::graph;

constexpr const char* kUsage =
    "usage: make_scaled_tanh_mlp OUT.onnx [--input-dim D] [--classes C] [--width W]\n"
    "                            [--scale S] [--seed K]\n"
    "Writes an MLP (2 x (Gemm + my.ops.ScaledTanh), Gemm) that needs the example\n"
    "custom-op library: onnxrun OUT.onnx --custom-op-lib libscaled_tanh_ops.so ...\n"
    "defaults: D 20, C 3, W 32, S 0.5, K 1\n";

struct Options {
  std::string out;
  int64_t input_dim = 20, classes = 3, width = 32;
  float scale = 0.5f;
  uint64_t seed = 1;
};

int64_t parse_positive(std::string_view flag, std::string_view text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v <= 0)
    fail(flag, ": expected a positive integer, got '", text, "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--input-dim") {
      o.input_dim = parse_positive(arg, value());
    } else if (arg == "--classes") {
      o.classes = parse_positive(arg, value());
    } else if (arg == "--width") {
      o.width = parse_positive(arg, value());
    } else if (arg == "--scale") {
      const std::string v = value();
      size_t used = 0;
      try {
        o.scale = std::stof(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != v.size()) fail(arg, ": expected a number, got '", v, "'");
    } else if (arg == "--seed") {
      o.seed = static_cast<uint64_t>(parse_positive(arg, value()));
    } else if (!arg.empty() && arg[0] == '-') {
      fail("unknown option '", arg, "'\n", kUsage);
    } else if (o.out.empty()) {
      o.out = arg;
    } else {
      fail("unexpected argument '", arg, "'");
    }
  }
  if (o.out.empty()) fail("no output file given\n", kUsage);
  return o;
}

// A my.ops.ScaledTanh node after `x`; its output keeps x's type so the next layer can read
// its dims (the builder's layers check ranks), exactly what the op's shape inference says.
graph::Value* scaled_tanh(onnxtrain::models::GraphBuilder& b, graph::Value* x,
                          const std::string& name, float scale) {
  graph::Node* n = b.graph().add_node("ScaledTanh", {x}, {name}, name, "my.ops");
  n->set_attr(graph::Attribute::make_float("scale", scale));
  n->output(0)->type = x->type;
  return n->output(0);
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  onnxtrain::models::GraphBuilder b("scaled_tanh_mlp", o.seed);
  b.model().set_opset("my.ops", 1);
  const int64_t dims[] = {o.input_dim};
  graph::Value* y = b.input("input", dims);
  y = scaled_tanh(b, b.gemm(y, "fc1", o.width), "act1", o.scale);
  y = scaled_tanh(b, b.gemm(y, "fc2", o.width), "act2", o.scale);
  y = b.gemm(y, "fc3", o.classes);
  auto model = b.finish(y, "logits");
  graph::export_onnx_file(*model, o.out);
  std::printf("%s: scaled_tanh_mlp, input [N,%lld], %lld classes, width %lld, scale %g\n",
              o.out.c_str(), static_cast<long long>(o.input_dim), static_cast<long long>(o.classes),
              static_cast<long long>(o.width), o.scale);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return onnxtrain::tools::run_cli("make_scaled_tanh_mlp", [&] { return run(argc, argv); });
}
