// Text form of the IR, one line per node:
//   %y[N,64,56,56] f32 = Conv<kernel_shape=[3,3],pads=[1,1,1,1]>(%x, %w)
// Used by onnxdump and by pass tests (compare printed graphs).
#pragma once

#include <ostream>
#include <string>

#include "graph/ir.h"

namespace onnxtrain::graph {

struct PrintOptions {
  bool show_initializers = true;  // one line per initializer before the nodes
  int max_attr_elems = 16;        // longer int/float lists are elided
};

std::string format_shape(const std::optional<Shape>& s);  // "[N,3,224,224]", "" if unknown
std::string format_type(const ValueType& t);               // "[N,3] f32", "seq(f32)"
std::string format_attribute(const Attribute& a, const PrintOptions& o = {});
std::string format_node(const Node& n, const PrintOptions& o = {});
void print_graph(std::ostream& os, const Graph& g, const PrintOptions& o = {}, int indent = 0);
void print_model(std::ostream& os, const Model& m, const PrintOptions& o = {});
// The training signature, one line per binding (print_model ends with it); nothing if empty.
void print_training(std::ostream& os, const TrainingSignature& t);
std::string to_text(const Graph& g, const PrintOptions& o = {});

}  // namespace onnxtrain::graph
