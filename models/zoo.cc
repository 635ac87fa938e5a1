// The zoo's models and its one registry table: each entry carries its name, description,
// defaults and build function, so listing, defaults and building cannot drift apart.
#include "models/zoo.h"

#include <algorithm>
#include <charconv>

#include "graph/error.h"
#include "models/builder.h"

namespace onnxtrain::models {

using graph::Value;

namespace {

// Sizes beyond this are typos, and refusing them keeps every product below int64 overflow.
constexpr int64_t kMaxSize = int64_t{1} << 24;

struct Resolved {
  std::vector<int64_t> input;
  int64_t classes = 0;
  int64_t width = 0;
  int64_t vocab = 0;
};

using BuildFn = Value* (*)(GraphBuilder& b, Value* x, const Resolved& r);

struct ModelSpec {
  ZooEntry entry;
  BuildFn build = nullptr;
  bool image_input = false;  // needs CxHxW
  // Smallest height/width accepted (image models): the size at which the last feature map is
  // still at least 1x1 (cnn); for resnets, whose five stride-2 stages (conv1, maxpool, layer2-4)
  // each map h to ceil(h/2), the smallest size at which every stage still halves a map larger
  // than 1x1 (17 -> 9, 5, 3, 2, 1; Fashion-MNIST's 28 -> 14, 7, 4, 2, 1).
  int64_t min_hw = 0;
  bool per_token = false;  // token model whose logits are (N, T, vocab): classes = vocab
};

int64_t channels(const Value* v) {
  return GraphBuilder::dims_of(v)[1];
}

Value* flatten_if_needed(GraphBuilder& b, Value* x) {
  return GraphBuilder::dims_of(x).size() > 2 ? b.flatten(x, "flatten") : x;
}

Value* build_linear(GraphBuilder& b, Value* x, const Resolved& r) {
  return b.matmul_add(flatten_if_needed(b, x), "fc", r.classes);
}

Value* build_mlp(GraphBuilder& b, Value* x, const Resolved& r) {
  Value* y = flatten_if_needed(b, x);
  y = b.relu(b.gemm(y, "fc1", r.width), "relu1");
  y = b.relu(b.gemm(y, "fc2", r.width), "relu2");
  return b.gemm(y, "fc3", r.classes);
}

Value* build_cnn(GraphBuilder& b, Value* x, const Resolved& r) {
  const int64_t w = r.width;
  Value* y = b.relu(b.conv(x, "conv1", {.out_channels = w, .kernel = 5, .pad = 2}), "relu1");
  y = b.max_pool(y, "pool1", 2, 2, 0);
  y = b.relu(b.conv(y, "conv2", {.out_channels = 2 * w, .kernel = 5}), "relu2");
  y = b.max_pool(y, "pool2", 2, 2, 0);
  y = b.flatten(y, "flatten");
  y = b.relu(b.gemm(y, "fc1", 4 * w), "relu3");
  return b.gemm(y, "fc2", r.classes);
}

ConvSpec conv_nobias(int64_t out, int64_t kernel, int64_t stride, int64_t pad) {
  return ConvSpec{
      .out_channels = out, .kernel = kernel, .stride = stride, .pad = pad, .bias = false};
}

// torchvision's downsample: 1x1 conv + BN when the residual changes shape.
Value* shortcut(GraphBuilder& b, Value* x, const std::string& p, int64_t out, int64_t stride) {
  if (stride == 1 && channels(x) == out) return x;
  Value* y = b.conv(x, p + ".downsample.0", conv_nobias(out, 1, stride, 0));
  return b.batch_norm(y, p + ".downsample.1");
}

Value* basic_block(GraphBuilder& b, Value* x, const std::string& p, int64_t planes,
                   int64_t stride) {
  Value* y = b.conv(x, p + ".conv1", conv_nobias(planes, 3, stride, 1));
  y = b.relu(b.batch_norm(y, p + ".bn1"), p + ".relu");
  y = b.batch_norm(b.conv(y, p + ".conv2", conv_nobias(planes, 3, 1, 1)), p + ".bn2");
  y = b.add(y, shortcut(b, x, p, planes, stride), p + ".add");
  return b.relu(y, p + ".relu_1");
}

// ResNet v1.5: the stride sits on the 3x3 conv, not on the first 1x1.
Value* bottleneck_block(GraphBuilder& b, Value* x, const std::string& p, int64_t planes,
                        int64_t stride) {
  constexpr int64_t kExpansion = 4;
  Value* y = b.conv(x, p + ".conv1", conv_nobias(planes, 1, 1, 0));
  y = b.relu(b.batch_norm(y, p + ".bn1"), p + ".relu");
  y = b.conv(y, p + ".conv2", conv_nobias(planes, 3, stride, 1));
  y = b.relu(b.batch_norm(y, p + ".bn2"), p + ".relu_1");
  y = b.conv(y, p + ".conv3", conv_nobias(planes * kExpansion, 1, 1, 0));
  y = b.batch_norm(y, p + ".bn3");
  y = b.add(y, shortcut(b, x, p, planes * kExpansion, stride), p + ".add");
  return b.relu(y, p + ".relu_2");
}

using BlockFn = Value* (*)(GraphBuilder&, Value*, const std::string&, int64_t, int64_t);

Value* resnet(GraphBuilder& b, Value* x, const Resolved& r, BlockFn block,
              const std::vector<int>& blocks_per_stage) {
  Value* y = b.conv(x, "conv1", conv_nobias(r.width, 7, 2, 3));
  y = b.relu(b.batch_norm(y, "bn1"), "relu");
  y = b.max_pool(y, "maxpool", 3, 2, 1);
  for (size_t stage = 0; stage < blocks_per_stage.size(); ++stage) {
    const int64_t planes = r.width << stage;
    for (int i = 0; i < blocks_per_stage[stage]; ++i) {
      const int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      y = block(b, y, cat("layer", stage + 1, ".", i), planes, stride);
    }
  }
  y = b.flatten(b.global_average_pool(y, "avgpool"), "flatten");
  return b.gemm(y, "fc", r.classes);
}

Value* build_resnet18(GraphBuilder& b, Value* x, const Resolved& r) {
  return resnet(b, x, r, basic_block, {2, 2, 2, 2});
}
Value* build_resnet34(GraphBuilder& b, Value* x, const Resolved& r) {
  return resnet(b, x, r, basic_block, {3, 4, 6, 3});
}
Value* build_resnet50(GraphBuilder& b, Value* x, const Resolved& r) {
  return resnet(b, x, r, bottleneck_block, {3, 4, 6, 3});
}

// Text classifier: embedding, masked mean over the tokens, Gemm + Relu, Gemm. `ids` is
// "input_ids" (N, T); it adds "attention_mask" (N, T), 1 for tokens and 0 for padding.
Value* build_textcls(GraphBuilder& b, Value* ids, const Resolved& r) {
  const int64_t t = r.input[0], d = r.width;
  Value* mask = b.int_input("attention_mask", r.input);
  Value* e = b.embedding(ids, "embed", r.vocab, d);
  graph::Node* cast = b.op("Cast", {mask}, "mask_float", std::vector<int64_t>{-1, t});
  cast->set_attr(graph::Attribute::make_int("to", static_cast<int64_t>(graph::DataType::kFloat)));
  Value* m = b.op("Unsqueeze", {cast->output(0), b.int_constant("mask_axes", {2})}, "mask_3d",
                  std::vector<int64_t>{-1, t, 1})->output(0);
  Value* masked = b.op("Mul", {e, m}, "masked", std::vector<int64_t>{-1, t, d})->output(0);
  Value* axis = b.int_constant("token_axis", {1});
  graph::Node* sum = b.op("ReduceSum", {masked, axis}, "token_sum", std::vector<int64_t>{-1, d});
  sum->set_attr(graph::Attribute::make_int("keepdims", 0));
  graph::Node* count = b.op("ReduceSum", {m, axis}, "token_count", std::vector<int64_t>{-1, 1});
  count->set_attr(graph::Attribute::make_int("keepdims", 0));
  Value* floor = b.op("Max", {count->output(0), b.float_constant("one", 1.0f)}, "token_count_1",
                      std::vector<int64_t>{-1, 1})->output(0);
  Value* mean = b.op("Div", {sum->output(0), floor}, "pooled", std::vector<int64_t>{-1, d})->output(0);
  Value* h = b.relu(b.gemm(mean, "fc1", d), "relu1");
  return b.gemm(h, "fc2", r.classes);
}

// Per-token model: embedding, MatMul + Add, Relu, MatMul + Add to the vocabulary: logits
// (N, T, vocab) for next-token labels (N, T).
Value* build_tokenlm(GraphBuilder& b, Value* ids, const Resolved& r) {
  Value* e = b.embedding(ids, "embed", r.vocab, r.width);
  Value* h = b.relu(b.matmul_add(e, "fc1", r.width), "relu1");
  return b.matmul_add(h, "head", r.vocab);
}

const std::vector<ModelSpec>& registry() {
  static const std::vector<ModelSpec> specs = {
      {.entry = {.name = "linear",
                 .description = "linear classifier: Flatten, MatMul + Add",
                 .default_input = {1, 28, 28},
                 .default_classes = 10},
       .build = build_linear},
      {.entry = {.name = "mlp",
                 .description =
                     "multilayer perceptron: Flatten, 2 x (Gemm + Relu) of `width` units, Gemm",
                 .default_input = {1, 28, 28},
                 .default_classes = 10,
                 .default_width = 128},
       .build = build_mlp},
      {.entry = {.name = "cnn",
                 .description =
                     "LeNet-style CNN: 2 x (Conv 5x5, Relu, MaxPool 2), Gemm + Relu, Gemm",
                 .default_input = {1, 28, 28},
                 .default_classes = 10,
                 .default_width = 32},
       .build = build_cnn,
       .image_input = true,
       .min_hw = 12},
      {.entry = {.name = "resnet18",
                 .description = "ResNet-18 (torchvision): BasicBlock x [2,2,2,2]",
                 .default_input = {3, 224, 224},
                 .default_classes = 1000,
                 .default_width = 64},
       .build = build_resnet18,
       .image_input = true,
       .min_hw = 17},
      {.entry = {.name = "resnet34",
                 .description = "ResNet-34 (torchvision): BasicBlock x [3,4,6,3]",
                 .default_input = {3, 224, 224},
                 .default_classes = 1000,
                 .default_width = 64},
       .build = build_resnet34,
       .image_input = true,
       .min_hw = 17},
      {.entry = {.name = "resnet50",
                 .description = "ResNet-50 v1.5 (torchvision): Bottleneck x [3,4,6,3], expansion 4",
                 .default_input = {3, 224, 224},
                 .default_classes = 1000,
                 .default_width = 64},
       .build = build_resnet50,
       .image_input = true,
       .min_hw = 17},
      {.entry = {.name = "textcls",
                 .description = "text classifier: input_ids + attention_mask, embedding, masked "
                                "mean, Gemm + Relu, Gemm",
                 .default_input = {32},
                 .default_classes = 4,
                 .default_width = 64,
                 .default_vocab = 1000},
       .build = build_textcls},
      {.entry = {.name = "tokenlm",
                 .description = "per-token model: input_ids, embedding, MatMul + Add, Relu, "
                                "MatMul + Add; logits [N,T,vocab]",
                 .default_input = {32},
                 .default_classes = 100,
                 .default_width = 64,
                 .default_vocab = 100},
       .build = build_tokenlm,
       .per_token = true},
  };
  return specs;
}

std::string known_names() {
  std::string out;
  for (const ModelSpec& s : registry()) out += (out.empty() ? "" : ", ") + s.entry.name;
  return out;
}

Resolved resolve(const ModelSpec& spec, const ZooOptions& o) {
  const ZooEntry& e = spec.entry;
  Resolved r;
  r.input = o.input_shape.empty() ? e.default_input : o.input_shape;
  r.classes = o.classes == 0 ? e.default_classes : o.classes;
  r.width = o.width == 0 ? e.default_width : o.width;
  r.vocab = o.vocab == 0 ? e.default_vocab : o.vocab;
  const std::string& n = e.name;
  if (e.default_vocab == 0) {
    OT_CHECK(o.vocab == 0, n, ": this model has no token input (got --vocab ", o.vocab, ")");
  } else {
    OT_CHECK(r.vocab > 0 && r.vocab <= kMaxSize, n, ": vocab must be in 1..", kMaxSize);
    OT_CHECK(r.input.size() == 1, n, ": input must be the sequence length T, got ",
             format_dims(r.input));
  }
  if (spec.per_token) {
    OT_CHECK(o.classes == 0 || o.classes == r.vocab, n,
             ": the classes are the vocabulary (give --vocab)");
    r.classes = r.vocab;
  }
  for (int64_t d : r.input)
    OT_CHECK(d > 0 && d <= kMaxSize, n, ": input ", format_dims(r.input),
             ": every dimension must be in 1..", kMaxSize);
  OT_CHECK(r.classes > 0 && r.classes <= kMaxSize, n, ": classes must be in 1..", kMaxSize,
           ", got ", r.classes);
  if (e.default_width == 0)
    OT_CHECK(o.width == 0, n, ": this model has no width (got ", o.width, ")");
  else
    OT_CHECK(r.width > 0 && r.width <= kMaxSize, n, ": width must be in 1..", kMaxSize, ", got ",
             r.width);
  if (spec.image_input) {
    OT_CHECK(r.input.size() == 3, n, ": input must be CxHxW, got ", format_dims(r.input));
    OT_CHECK(r.input[1] >= spec.min_hw && r.input[2] >= spec.min_hw, n, ": input ",
             format_dims(r.input), " is too small: height and width must be at least ",
             spec.min_hw);
  }
  return r;
}

std::string describe(const ZooEntry& e, const Resolved& r, uint64_t seed) {
  std::string s = cat(e.name, ": ", e.description, "; input ", format_dims(r.input), ", ",
                      r.classes, " classes");
  if (e.default_width != 0) s += cat(", width ", r.width);
  if (e.default_vocab != 0) s += cat(", vocab ", r.vocab);
  return s + cat(", seed ", seed);
}

}  // namespace

std::vector<ZooEntry> zoo_models() {
  std::vector<ZooEntry> out;
  for (const ModelSpec& s : registry()) out.push_back(s.entry);
  return out;
}

std::unique_ptr<graph::Model> build_zoo_model(const std::string& name, const ZooOptions& opts) {
  for (const ModelSpec& spec : registry()) {
    if (spec.entry.name != name) continue;
    const Resolved r = resolve(spec, opts);
    GraphBuilder b(name, opts.seed);
    Value* x = spec.entry.default_vocab > 0 ? b.int_input("input_ids", r.input)
                                            : b.input("input", r.input);
    Value* logits = spec.build(b, x, r);
    b.model().doc_string = describe(spec.entry, r, opts.seed);
    return b.finish(logits, "logits");
  }
  fail("unknown model '", name, "' (known models: ", known_names(), ")");
}

std::vector<int64_t> parse_dims(std::string_view text) {
  auto bad = [&](const std::string& why) {
    fail("invalid shape '", text, "': ", why,
         " (expected positive integers joined by 'x', like 3x224x224)");
  };
  if (text.empty()) bad("empty");
  std::vector<int64_t> dims;
  size_t start = 0;
  while (true) {
    const size_t end = std::min(text.find('x', start), text.size());
    const std::string_view part = text.substr(start, end - start);
    const size_t index = dims.size() + 1;
    if (part.empty()) bad(cat("dimension ", index, " is empty"));
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec == std::errc::result_out_of_range) bad(cat("dimension ", index, " is too large"));
    if (ec != std::errc() || ptr != part.data() + part.size())
      bad(cat("dimension ", index, " '", part, "' is not a number"));
    if (v <= 0) bad(cat("dimension ", index, " is ", v));
    dims.push_back(v);
    if (end == text.size()) break;
    start = end + 1;
  }
  return dims;
}

std::string format_dims(std::span<const int64_t> dims) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) out += cat(i ? "x" : "", dims[i]);
  return out;
}

}  // namespace onnxtrain::models
