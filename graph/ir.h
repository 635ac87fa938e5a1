// The graph IR every pass and the runtime work on: Model > Graph > Node / Value, typed
// attributes, host-tensor initializers. Nodes and values are owned by their Graph and have
// stable addresses; edges are pointers (Node inputs -> Value, Value -> producer and uses).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "graph/dtype.h"
#include "graph/tensor.h"
#include "graph/training_signature.h"

namespace onnxtrain::graph {

class Graph;
class Node;

// One dimension: a known size, a symbol ("N"), or unknown.
struct Dim {
  int64_t value = -1;  // >= 0 when known
  std::string param;   // symbolic name when value < 0
  static Dim known(int64_t v) { return Dim{v, {}}; }
  static Dim symbol(std::string s) { return Dim{-1, std::move(s)}; }
  bool is_known() const { return value >= 0; }
  bool operator==(const Dim&) const = default;
};

using Shape = std::vector<Dim>;

// Type of a value: tensor (dtype + optional shape) or one of ONNX's container types.
struct ValueType {
  enum class Kind { kUnknown, kTensor, kSparseTensor, kSequence, kOptional, kMap };
  Kind kind = Kind::kUnknown;
  DataType dtype = DataType::kUndefined;       // tensor / sparse element type
  std::optional<Shape> shape;                  // nullopt: rank unknown
  DataType map_key = DataType::kUndefined;     // kMap
  std::shared_ptr<const ValueType> elem;       // kSequence / kOptional / kMap value type

  static ValueType tensor(DataType t, std::optional<Shape> s = std::nullopt) {
    ValueType v;
    v.kind = Kind::kTensor;
    v.dtype = t;
    v.shape = std::move(s);
    return v;
  }
  bool is_tensor() const { return kind == Kind::kTensor; }
  bool operator==(const ValueType& o) const;
};

// Shape from known sizes; a helper for builders.
Shape make_shape(std::initializer_list<int64_t> dims);
Shape make_shape(std::span<const int64_t> dims);

enum class AttrType {
  kUndefined = 0,
  kFloat = 1,
  kInt = 2,
  kString = 3,
  kTensor = 4,
  kGraph = 5,
  kFloats = 6,
  kInts = 7,
  kStrings = 8,
  kTensors = 9,
  kGraphs = 10,
  kSparseTensor = 11,  // refused on import (no sparse support yet)
  kSparseTensors = 12,
  kTypeProto = 13,
  kTypeProtos = 14,
};

std::string_view attr_type_name(AttrType t);

// Graph-valued attributes own their subgraph; copying an Attribute deep-copies it.
class GraphPtr {
 public:
  GraphPtr() = default;
  explicit GraphPtr(std::unique_ptr<Graph> g);
  GraphPtr(const GraphPtr& o);
  GraphPtr& operator=(const GraphPtr& o);
  GraphPtr(GraphPtr&&) noexcept = default;
  GraphPtr& operator=(GraphPtr&&) noexcept = default;
  ~GraphPtr();
  Graph* get() const { return g_.get(); }
  Graph* operator->() const { return g_.get(); }
  Graph& operator*() const { return *g_; }

 private:

  std::unique_ptr<Graph> g_;
};

struct Attribute {
  std::string name;
  AttrType type = AttrType::kUndefined;
  std::variant<std::monostate, float, int64_t, std::string, Tensor, GraphPtr, std::vector<float>,
               std::vector<int64_t>, std::vector<std::string>, std::vector<Tensor>,
               std::vector<GraphPtr>, ValueType, std::vector<ValueType>>
      value;
  std::string ref_attr_name;  // only inside function bodies (inlined away on import)
  std::string doc_string;

  static Attribute make_float(std::string n, float v);
  static Attribute make_int(std::string n, int64_t v);
  static Attribute make_string(std::string n, std::string v);
  static Attribute make_tensor(std::string n, Tensor v);
  static Attribute make_graph(std::string n, std::unique_ptr<Graph> g);
  static Attribute make_floats(std::string n, std::vector<float> v);
  static Attribute make_ints(std::string n, std::vector<int64_t> v);
  static Attribute make_strings(std::string n, std::vector<std::string> v);

  float f() const { return std::get<float>(value); }
  int64_t i() const { return std::get<int64_t>(value); }
  const std::string& s() const { return std::get<std::string>(value); }
  const Tensor& t() const { return std::get<Tensor>(value); }
  Graph& g() const { return *std::get<GraphPtr>(value); }
  const std::vector<float>& floats() const { return std::get<std::vector<float>>(value); }
  const std::vector<int64_t>& ints() const { return std::get<std::vector<int64_t>>(value); }
  const std::vector<std::string>& strings() const {
    return std::get<std::vector<std::string>>(value);
  }
  const std::vector<Tensor>& tensors() const { return std::get<std::vector<Tensor>>(value); }
  const std::vector<GraphPtr>& graphs() const { return std::get<std::vector<GraphPtr>>(value); }
  const ValueType& tp() const { return std::get<ValueType>(value); }
  const std::vector<ValueType>& tps() const { return std::get<std::vector<ValueType>>(value); }
};

struct Use {
  Node* node;
  int input_index;
  bool operator==(const Use&) const = default;
};

class Value {
 public:
  const std::string& name() const { return name_; }
  ValueType type;
  std::string doc_string;
  // The file's metadata_props of this value (its ValueInfoProto in inputs, outputs or
  // value_info, initializers included), in file order, written back by export. Torch's dynamo
  // exporter records there what each initializer was in the module (parameter or buffer:
  // passes::prepare_training reads it).
  std::vector<std::pair<std::string, std::string>> metadata;

  Node* producer() const { return producer_; }
  int producer_output() const { return producer_output_; }
  const std::vector<Use>& uses() const { return uses_; }
  Graph* owner() const { return owner_; }

  bool is_graph_input() const { return is_input_; }
  bool is_graph_output() const;
  bool has_initializer() const { return initializer_.has_value(); }
  const Tensor& initializer() const { return *initializer_; }
  Tensor& mutable_initializer() { return *initializer_; }

  // Convenience for tensor values.
  DataType dtype() const { return type.dtype; }
  const std::optional<Shape>& shape() const { return type.shape; }

 private:
  friend class Graph;
  friend class Node;
  std::string name_;
  Graph* owner_ = nullptr;
  Node* producer_ = nullptr;
  int producer_output_ = -1;
  std::vector<Use> uses_;
  bool is_input_ = false;
  std::optional<Tensor> initializer_;
};

class Node {
 public:
  std::string name;
  std::string op_type;
  std::string domain;  // "" is ai.onnx
  std::string doc_string;
  std::string device;  // placement annotation: "cpu:0", "cuda:1"; empty = unplaced
  // The replica this node computes for (passes::replicate); -1 = not replicated or shared by
  // all replicas (ShardBatch, AllReduce). Exported in the training signature's `node` lines.
  int replica = -1;
  std::vector<Attribute> attributes;

  // Inputs/outputs; nullptr marks an omitted optional slot ("" in ONNX).
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }
  Graph* owner() const { return owner_; }

  void set_input(size_t i, Value* v);  // grows the list with nullptr slots as needed
  void add_input(Value* v) { set_input(inputs_.size(), v); }

  const Attribute* find_attr(std::string_view n) const;
  Attribute* find_attr(std::string_view n);
  int64_t attr_int(std::string_view n, int64_t fallback) const;
  float attr_float(std::string_view n, float fallback) const;
  std::string attr_string(std::string_view n, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(std::string_view n, std::vector<int64_t> fallback = {}) const;
  void set_attr(Attribute a);  // replaces an attribute of the same name

  // "'conv1' (Conv)" or "#12 (Conv)" for unnamed nodes: used in error messages.
  std::string describe() const;

 private:
  friend class Graph;
  Graph* owner_ = nullptr;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
};

class Graph {
 public:
  explicit Graph(std::string name = "main_graph", Graph* parent = nullptr);
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  std::string name;
  std::string doc_string;
  Graph* parent() const { return parent_; }
  void set_parent(Graph* p) { parent_ = p; }
  int depth() const;  // 0 for a main graph

  // ---- values
  // Creates a value; throws if the name is taken in this graph.
  Value* add_value(const std::string& name, ValueType type = {});
  Value* find_value(std::string_view name) const;  // this graph only
  Value* lookup(std::string_view name) const;      // this graph, then enclosing graphs
  // A name not used in this graph or any enclosing or nested graph: base, base_1, ...
  std::string fresh_name(const std::string& base);
  void rename_value(Value* v, const std::string& new_name);
  const std::vector<std::unique_ptr<Value>>& values() const { return values_; }

  Value* add_input(const std::string& name, ValueType type);
  void mark_input(Value* v);  // appends an existing value to the graph inputs
  Value* add_initializer(const std::string& name, Tensor t, bool also_input = false);
  void set_initializer(Value* v, Tensor t);
  void clear_initializer(Value* v);
  void add_output(Value* v) { outputs_.push_back(v); }
  void set_outputs(std::vector<Value*> outs) { outputs_ = std::move(outs); }
  void remove_input(Value* v);
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  // Values holding an initializer, in insertion order.
  std::vector<Value*> initializers() const;

  // ---- nodes (kept in a list whose order is the order exported)
  // Creates a node; each output name becomes a new value ("" leaves the slot empty).
  Node* add_node(const std::string& op_type, const std::vector<Value*>& inputs,
                 const std::vector<std::string>& output_names, const std::string& name = "",
                 const std::string& domain = "");
  // Same, placed directly before `before` in the node list.
  Node* insert_node_before(Node* before, const std::string& op_type,
                           const std::vector<Value*>& inputs,
                           const std::vector<std::string>& output_names,
                           const std::string& name = "", const std::string& domain = "");
  // Gives node n (of this graph) a new value named `name` as output slot i (growing the list
  // with empty slots); the slot must be empty. Throws if the name is taken.
  Value* add_node_output(Node* n, size_t i, const std::string& name);
  // Removes a node. Its outputs must be unused (throws otherwise) and are deleted with it.
  void remove_node(Node* n);
  // Deletes a value that has no producer and no uses and is not a graph input/output.
  void remove_value(Value* v);
  // remove_node / remove_value for many at once, in one pass over the graph (the one-at-a-time
  // forms search the node and value lists each time: quadratic when a pass drops most of a
  // graph, as partition does per replica). The outputs of `nodes` may be read only by `nodes`
  // (their subgraphs included).
  void remove_nodes(const std::vector<Node*>& nodes);
  void remove_values(const std::vector<Value*>& values);
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  size_t num_nodes() const { return nodes_.size(); }

  // Redirects every use of `from` (also graph outputs and captures in subgraphs) to `to`.
  void replace_all_uses(Value* from, Value* to);

  // Kahn order over explicit inputs and values captured by subgraphs, stable with respect to
  // the current list order. Throws Error naming a node on a cycle.
  std::vector<Node*> topological_order() const;
  void sort_topologically();  // reorders the node list to topological_order()
  // Moves `nodes` (of this graph, each once) behind all others, in the given order. Only the
  // list order changes, which topological_order() follows where dependencies leave a choice.
  void move_to_end(std::span<Node* const> nodes);

  // Clones `nodes` (of this graph) into this graph. Each cloned output gets the name
  // rename(old_name); inputs produced inside the set map to the clones, other inputs map
  // through `value_map` when present there and stay shared otherwise; so do the values a
  // cloned If / Loop / Scan's subgraphs capture from this graph. Returns the clones and
  // extends value_map with old -> new for every cloned output.
  std::vector<Node*> clone_nodes(std::span<Node* const> nodes,
                                 const std::function<std::string(const std::string&)>& rename,
                                 std::unordered_map<const Value*, Value*>& value_map);

  // Deep copy with the same names; captured outer values resolve by name in `parent`.
  std::unique_ptr<Graph> clone(Graph* parent) const;
  // Only the nodes `keep` accepts, the graph inputs, and the values and initializers those nodes
  // read; a kept node's input made by a dropped node becomes an omitted input, a graph output
  // made by one is left out. Proportional to what is kept, not to the whole graph (partition
  // copies one replica's share of a graph of R replicas this way).
  std::unique_ptr<Graph> clone_if(const std::function<bool(const Node&)>& keep) const;

  // Values from enclosing graphs that nodes of this graph (or nested subgraphs) read.
  std::vector<Value*> captured_values() const;

 private:
  std::unique_ptr<Graph> clone_filtered(Graph* parent,
                                        const std::function<bool(const Node&)>* keep) const;
  friend class Node;
  Node* create_node(size_t position, const std::string& op_type, const std::vector<Value*>& inputs,
                    const std::vector<std::string>& output_names, const std::string& name,
                    const std::string& domain);
  bool name_used_anywhere(const std::string& n) const;

  Graph* parent_ = nullptr;
  std::vector<std::unique_ptr<Value>> values_;
  std::unordered_map<std::string, Value*> by_name_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::vector<Value*> initializer_order_;
  std::unordered_map<std::string, int> fresh_counter_;
};

struct OpsetImport {
  std::string domain;  // "" and "ai.onnx" are the default domain
  int64_t version = 0;
  bool operator==(const OpsetImport&) const = default;
};

class Model {
 public:
  Model();
  int64_t ir_version = 8;
  std::vector<OpsetImport> opsets;
  std::string producer_name = "onnxtrain";
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc_string;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::unique_ptr<Graph> graph;
  std::string source_path;  // file it was imported from (for error messages), may be empty
  // What the values of a training graph mean (graph/training_signature.h); empty for a model
  // that is not a training graph. Exported as the metadata entry "onnxtrain.training".
  TrainingSignature training;

  // Version of `domain` this model imports, or nullopt.
  std::optional<int64_t> opset_version(std::string_view domain) const;
  void set_opset(const std::string& domain, int64_t version);
  std::unique_ptr<Model> clone() const;
  // clone() with Graph::clone_if's node filter on the main graph.
  std::unique_ptr<Model> clone_if(const std::function<bool(const Node&)>& keep) const;

 private:
  std::unique_ptr<Model> clone_with(std::unique_ptr<Graph> g) const;

 public:
};

}  // namespace onnxtrain::graph
