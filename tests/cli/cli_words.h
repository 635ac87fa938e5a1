// Small helpers shared by the CLI tests that train models: argument lists written as one string,
// and a model file's initializers by name (to compare trained weights).
#pragma once

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "graph/onnx_io.h"
#include "graph/tensor.h"

namespace onnxtrain::cli_test {

// "a b c" -> {"a", "b", "c"}: long argument lists stay readable.
inline std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Every initializer of the ONNX file, by name.
inline std::map<std::string, graph::Tensor> initializers(const std::string& file) {
  std::map<std::string, graph::Tensor> out;
  auto m = graph::import_onnx_file(file);
  for (graph::Value* v : m->graph->initializers()) out[v->name()] = v->initializer();
  return out;
}

}  // namespace onnxtrain::cli_test
