// The model zoo: reference models (linear, MLP, small CNN, ResNet-18/34/50) built as IR graphs
// with a symbolic batch, configurable input/classes/width and seeded PyTorch-default weights.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graph/ir.h"
#include "models/builder.h"  // count_parameters

namespace onnxtrain::models {

struct ZooOptions {
  // One example's shape: CxHxW for cnn/resnets; any rank (flattened), e.g. a single D, for
  // linear and mlp. Empty: the model's default.
  std::vector<int64_t> input_shape = {};  // "= {}" lets designated initializers skip it
  int64_t classes = 0;                    // 0: the model's default
  int64_t width = 0;                      // base channels / hidden size; 0: the model's default
  uint64_t seed = 0;
  int64_t vocab = 0;  // token models: embedding rows; 0: the model's default
};

struct ZooEntry {
  std::string name;
  std::string description;  // one line
  std::vector<int64_t> default_input;
  int64_t default_classes = 0;
  int64_t default_width = 0;  // 0: the model has no width
  int64_t default_vocab = 0;  // 0: the model has no token input
};

// Every model, in the order `onnxzoo --list` shows them.
std::vector<ZooEntry> zoo_models();

// Builds `name` with graph input "input" f32 [N, input_shape...] and output "logits"
// f32 [N, classes], opset 17, ir_version 8. Token models (default_vocab > 0) take
// "input_ids" i64 [N, T] (input_shape = T) instead, textcls also "attention_mask" i64 [N, T];
// tokenlm's logits are per token, [N, T, vocab]. Same options, same bytes. Throws Error listing the
// known names on an unknown one, and on invalid options (an input too small for the model's
// downsampling, a non-positive size, a width given to a model without one).
std::unique_ptr<graph::Model> build_zoo_model(const std::string& name, const ZooOptions& opts);

// "3x224x224" -> {3, 224, 224}; throws Error on anything that is not positive integers joined
// by 'x' ("3x0x2", "abc", "3x", "").
std::vector<int64_t> parse_dims(std::string_view text);
// {3, 224, 224} -> "3x224x224"
std::string format_dims(std::span<const int64_t> dims);

}  // namespace onnxtrain::models
