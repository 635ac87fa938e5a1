// onnxdump --format json: the model as one JSON document (schema "onnxdump/1"). Hand-written so
// the tool needs no JSON library; strings are escaped per RFC 8259 and repaired to valid UTF-8.
//
//   {"schema", "file", "ir_version", "producer": {name, version}, "domain", "model_version",
//    "opsets": [{domain, version}], "metadata": [{key, value}], "graph": GRAPH,
//    "training": TRAINING}   (training graphs only: graph/training_signature.h)
//   TRAINING = {"replicas", "partition", "inputs": [{name, role}],
//               "results": [{name, role, replica}], "state": [{state, updated, kind, original,
//               replica}], "gradients": [{param, grad, reduced, replica, bucket}],
//               "buckets": [{node, bytes}]}   (replica / partition / bucket -1 = none)
//   GRAPH = {"name", "inputs": [VALUE], "outputs": [VALUE],
//            "initializers": [{name, dtype, dims, bytes}], "nodes": [NODE]}
//   VALUE = {"name", "kind", "dtype", "shape": [3, "N", null] | null} (+ "type" for containers)
//   NODE  = {"name", "op_type", "domain", "device", "inputs": ["x", ""], "outputs",
//            "attributes": [{name, type, value}]}; tensors -> {dtype, dims, preview},
//            graphs -> GRAPH, type protos -> {kind, dtype, shape}. An omitted optional input is ""
//            as in ONNX.
#include <charconv>
#include <cmath>
#include <type_traits>
#include <variant>
#include <vector>

#include "graph/printer.h"
#include "tools/dump.h"

namespace onnxtrain::tools {
namespace {

using graph::Attribute;
using graph::AttrType;
using graph::Graph;
using graph::Node;
using graph::Value;

// Streaming writer with two-space indentation. Containers opened "inline" (dims, shapes, name
// lists) stay on one line, and so does everything nested in them.
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& os) : os_(os) {}

  void begin_object(bool one_line = false) { open('{', one_line); }
  void end_object() { close('}'); }
  void begin_array(bool one_line = false) { open('[', one_line); }
  void end_array() { close(']'); }

  void key(std::string_view k) {
    separate();
    write_string(k);
    os_ << ": ";
    after_key_ = true;
  }
  void str(std::string_view s) {
    separate();
    write_string(s);
  }
  void num(int64_t v) {
    separate();
    os_ << v;
  }
  // JSON has no NaN or infinities; they become the strings "nan", "inf", "-inf".
  void num(double v) {
    if (std::isnan(v)) return str("nan");
    if (std::isinf(v)) return str(v > 0 ? "inf" : "-inf");
    separate();
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v);
    os_.write(buf, res.ptr - buf);
  }
  void num_float(float v) {
    if (std::isnan(v) || std::isinf(v)) return num(static_cast<double>(v));
    separate();
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, v);  // shortest form that reads back as v
    os_.write(buf, res.ptr - buf);
  }
  void boolean(bool v) {
    separate();
    os_ << (v ? "true" : "false");
  }
  void null() {
    separate();
    os_ << "null";
  }
  void finish() { os_ << '\n'; }

 private:
  struct Frame {
    bool one_line;
    int count;
  };

  void open(char c, bool one_line) {
    separate();
    os_ << c;
    bool parent_one_line = !stack_.empty() && stack_.back().one_line;
    stack_.push_back({one_line || parent_one_line, 0});
  }
  void close(char c) {
    Frame f = stack_.back();
    stack_.pop_back();
    if (f.count > 0 && !f.one_line) newline();
    os_ << c;
  }
  // Writes the separator before the next element (a key starts an element, its value does not).
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (stack_.empty()) return;
    Frame& f = stack_.back();
    if (f.count++ > 0) os_ << ',';
    if (f.one_line) {
      if (f.count > 1) os_ << ' ';
    } else {
      newline();
    }
  }
  void newline() {
    os_ << '\n';
    for (size_t i = 0; i < stack_.size(); ++i) os_ << "  ";
  }
  void write_string(std::string_view raw) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string s = sanitize_utf8(raw);
    os_ << '"';
    for (char ch : s) {
      auto c = static_cast<unsigned char>(ch);
      if (c == '"') {
        os_ << "\\\"";
      } else if (c == '\\') {
        os_ << "\\\\";
      } else if (c < 0x20) {
        os_ << "\\u00" << kHex[c >> 4] << kHex[c & 0xF];
      } else {
        os_ << ch;
      }
    }
    os_ << '"';
  }

  std::ostream& os_;
  std::vector<Frame> stack_;
  bool after_key_ = false;
};

const char* value_kind(graph::ValueType::Kind k) {
  switch (k) {
    case graph::ValueType::Kind::kTensor:
      return "tensor";
    case graph::ValueType::Kind::kSparseTensor:
      return "sparse_tensor";
    case graph::ValueType::Kind::kSequence:
      return "sequence";
    case graph::ValueType::Kind::kOptional:
      return "optional";
    case graph::ValueType::Kind::kMap:
      return "map";
    case graph::ValueType::Kind::kUnknown:
      break;
  }
  return "unknown";
}

const char* attr_kind(AttrType t) {
  switch (t) {
    case AttrType::kFloat:
      return "float";
    case AttrType::kInt:
      return "int";
    case AttrType::kString:
      return "string";
    case AttrType::kTensor:
      return "tensor";
    case AttrType::kGraph:
      return "graph";
    case AttrType::kFloats:
      return "floats";
    case AttrType::kInts:
      return "ints";
    case AttrType::kStrings:
      return "strings";
    case AttrType::kTensors:
      return "tensors";
    case AttrType::kGraphs:
      return "graphs";
    case AttrType::kSparseTensor:
      return "sparse_tensor";
    case AttrType::kSparseTensors:
      return "sparse_tensors";
    case AttrType::kTypeProto:
      return "type_proto";
    case AttrType::kTypeProtos:
      return "type_protos";
    case AttrType::kUndefined:
      break;
  }
  return "undefined";
}

void write_dims(JsonWriter& w, const std::vector<int64_t>& dims) {
  w.begin_array(true);
  for (int64_t d : dims) w.num(d);
  w.end_array();
}

// kind, dtype, shape (and the printed "type" for containers) as keys of the open object.
void write_type_fields(JsonWriter& w, const graph::ValueType& t) {
  w.key("kind");
  w.str(value_kind(t.kind));
  bool has_elem_type =
      t.kind == graph::ValueType::Kind::kTensor || t.kind == graph::ValueType::Kind::kSparseTensor;
  w.key("dtype");
  if (has_elem_type && t.dtype != graph::DataType::kUndefined)
    w.str(graph::dtype_short_name(t.dtype));
  else
    w.null();
  w.key("shape");
  if (has_elem_type && t.shape) {
    w.begin_array(true);
    for (const graph::Dim& d : *t.shape) {
      if (d.is_known())
        w.num(d.value);
      else if (!d.param.empty())
        w.str(d.param);
      else
        w.null();
    }
    w.end_array();
  } else {
    w.null();
  }
  if (!has_elem_type && t.kind != graph::ValueType::Kind::kUnknown) {
    w.key("type");
    w.str(graph::format_type(t));
  }
}

void write_type(JsonWriter& w, const graph::ValueType& t) {
  w.begin_object(true);
  write_type_fields(w, t);
  w.end_object();
}

void write_value(JsonWriter& w, const Value& v) {
  w.begin_object(true);
  w.key("name");
  w.str(v.name());
  write_type_fields(w, v.type);
  w.end_object();
}

void write_tensor_summary(JsonWriter& w, const graph::Tensor& t) {
  w.begin_object(true);
  w.key("dtype");
  w.str(graph::dtype_short_name(t.dtype()));
  w.key("dims");
  write_dims(w, t.dims());
  w.key("preview");
  w.str(t.preview(8));
  w.end_object();
}

void write_graph(JsonWriter& w, const Graph& g);

void write_attribute_value(JsonWriter& w, const Attribute& a) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          w.null();
        } else if constexpr (std::is_same_v<T, float>) {
          w.num_float(v);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          w.num(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          w.str(v);
        } else if constexpr (std::is_same_v<T, graph::Tensor>) {
          write_tensor_summary(w, v);
        } else if constexpr (std::is_same_v<T, graph::GraphPtr>) {
          if (v.get())
            write_graph(w, *v);
          else
            w.null();
        } else if constexpr (std::is_same_v<T, std::vector<float>>) {
          w.begin_array(true);
          for (float f : v) w.num_float(f);
          w.end_array();
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          write_dims(w, v);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          w.begin_array(true);
          for (const auto& s : v) w.str(s);
          w.end_array();
        } else if constexpr (std::is_same_v<T, std::vector<graph::Tensor>>) {
          w.begin_array();
          for (const auto& t : v) write_tensor_summary(w, t);
          w.end_array();
        } else if constexpr (std::is_same_v<T, std::vector<graph::GraphPtr>>) {
          w.begin_array();
          for (const auto& sub : v) {
            if (sub.get())
              write_graph(w, *sub);
            else
              w.null();
          }
          w.end_array();
        } else if constexpr (std::is_same_v<T, graph::ValueType>) {
          write_type(w, v);
        } else if constexpr (std::is_same_v<T, std::vector<graph::ValueType>>) {
          w.begin_array(true);
          for (const auto& t : v) write_type(w, t);
          w.end_array();
        } else {
          static_assert(sizeof(T) == 0, "attribute alternative not handled");
        }
      },
      a.value);
}

void write_name_list(JsonWriter& w, const std::vector<Value*>& values) {
  w.begin_array(true);
  for (const Value* v : values) w.str(v ? v->name() : "");
  w.end_array();
}

void write_node(JsonWriter& w, const Node& n) {
  w.begin_object();
  w.key("name");
  w.str(n.name);
  w.key("op_type");
  w.str(n.op_type);
  w.key("domain");
  w.str(n.domain);
  w.key("device");
  w.str(n.device);
  w.key("inputs");
  write_name_list(w, n.inputs());
  w.key("outputs");
  write_name_list(w, n.outputs());
  w.key("attributes");
  w.begin_array();
  for (const Attribute& a : n.attributes) {
    bool nested = std::holds_alternative<graph::GraphPtr>(a.value) ||
                  std::holds_alternative<std::vector<graph::GraphPtr>>(a.value) ||
                  std::holds_alternative<std::vector<graph::Tensor>>(a.value);
    w.begin_object(!nested);
    w.key("name");
    w.str(a.name);
    w.key("type");
    w.str(attr_kind(a.type));
    if (!a.ref_attr_name.empty()) {
      w.key("ref_attr_name");
      w.str(a.ref_attr_name);
    }
    w.key("value");
    write_attribute_value(w, a);
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

void write_graph(JsonWriter& w, const Graph& g) {
  w.begin_object();
  w.key("name");
  w.str(g.name);
  w.key("inputs");
  w.begin_array();
  for (const Value* v : g.inputs()) write_value(w, *v);
  w.end_array();
  w.key("outputs");
  w.begin_array();
  for (const Value* v : g.outputs()) write_value(w, *v);
  w.end_array();
  w.key("initializers");
  w.begin_array();
  for (const Value* v : g.initializers()) {
    const graph::Tensor& t = v->initializer();
    w.begin_object(true);
    w.key("name");
    w.str(v->name());
    w.key("dtype");
    w.str(graph::dtype_short_name(t.dtype()));
    w.key("dims");
    write_dims(w, t.dims());
    w.key("bytes");
    w.num(static_cast<int64_t>(t.nbytes()));
    w.end_object();
  }
  w.end_array();
  w.key("nodes");
  w.begin_array();
  for (const auto& n : g.nodes()) write_node(w, *n);
  w.end_array();
  w.end_object();
}

void write_training(JsonWriter& w, const graph::TrainingSignature& t) {
  auto field = [&](std::string_view k, const std::string& v) {
    w.key(k);
    w.str(v);
  };
  auto number = [&](std::string_view k, int64_t v) {
    w.key(k);
    w.num(v);
  };
  w.begin_object();
  number("replicas", t.replicas);
  number("partition", t.partition);
  w.key("inputs");
  w.begin_array();
  for (const graph::InputBinding& i : t.inputs) {
    w.begin_object(true);
    field("name", i.name);
    field("role", std::string(graph::input_role_name(i.role)));
    w.end_object();
  }
  w.end_array();
  w.key("results");
  w.begin_array();
  for (const graph::ResultBinding& r : t.results) {
    w.begin_object(true);
    field("name", r.name);
    field("role", std::string(graph::result_role_name(r.role)));
    number("replica", r.replica);
    w.end_object();
  }
  w.end_array();
  w.key("state");
  w.begin_array();
  for (const graph::StateBinding& b : t.state) {
    w.begin_object(true);
    field("state", b.state);
    field("updated", b.updated);
    field("kind", std::string(graph::state_kind_name(b.kind)));
    field("original", b.original);
    number("replica", b.replica);
    w.end_object();
  }
  w.end_array();
  w.key("gradients");
  w.begin_array();
  for (const graph::GradientBinding& g : t.gradients) {
    w.begin_object(true);
    field("param", g.param);
    field("grad", g.grad);
    field("reduced", g.reduced);
    number("replica", g.replica);
    number("bucket", g.bucket);
    w.end_object();
  }
  w.end_array();
  w.key("buckets");
  w.begin_array();
  for (const graph::GradientBucket& b : t.buckets) {
    w.begin_object(true);
    field("node", b.node);
    number("bytes", b.bytes);
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

}  // namespace



void write_json(std::ostream& os, const graph::Model& m) {
  JsonWriter w(os);
  w.begin_object();
  w.key("schema");
  w.str("onnxdump/1");
  w.key("file");
  w.str(m.source_path);
  w.key("ir_version");
  w.num(m.ir_version);
  w.key("producer");
  w.begin_object(true);
  w.key("name");
  w.str(m.producer_name);
  w.key("version");
  w.str(m.producer_version);
  w.end_object();
  w.key("domain");
  w.str(m.domain);
  w.key("model_version");
  w.num(m.model_version);
  w.key("opsets");
  w.begin_array();
  for (const auto& o : m.opsets) {
    w.begin_object(true);
    w.key("domain");
    w.str(o.domain);
    w.key("version");
    w.num(o.version);
    w.end_object();
  }
  w.end_array();
  w.key("metadata");
  w.begin_array();
  for (const auto& [k, v] : m.metadata) {
    w.begin_object(true);
    w.key("key");
    w.str(k);
    w.key("value");
    w.str(v);
    w.end_object();
  }
  w.end_array();
  w.key("graph");
  write_graph(w, *m.graph);
  if (!m.training.empty()) {
    w.key("training");
    write_training(w, m.training);
  }
  w.end_object();
  w.finish();
}

}  // namespace onnxtrain::tools
