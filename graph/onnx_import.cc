// ONNX protobuf -> IR. The input is untrusted: sizes, offsets, paths and nesting are checked
// before anything is allocated or read, and every error names the file and the field.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/onnx_placement.h"
#include "graph/onnx_value_metadata.h"
#include "graph/verifier.h"
#include "onnx/onnx_pb.h"

namespace onnxtrain::graph {
namespace {

namespace fs = std::filesystem;
constexpr int kMaxFunctionDepth = 32;
constexpr int kMaxRank = 64;

struct Ctx {
  std::string file;      // display name for errors
  std::string base_dir;  // folder external data is resolved against ("" = none allowed)
  const LoadOptions& opts;
  std::map<std::pair<std::string, std::string>, const onnx::FunctionProto*> functions;
  int inline_counter = 0;
  int64_t inlined_nodes = 0;   // nodes emitted by function expansion so far
  int64_t inline_budget = 0;   // refuse expansion beyond this
};

std::string tensor_where(const std::string& graph_where, const std::string& tname) {
  return cat(graph_where, "tensor '", tname, "'");
}

// ---------------------------------------------------------------- types

Dim convert_dim(const onnx::TensorShapeProto_Dimension& d, const std::string& where, int i) {
  if (d.has_dim_value()) {
    OT_CHECK(d.dim_value() >= 0, where, ": dim ", i, " is negative (", d.dim_value(), ")");
    return Dim::known(d.dim_value());
  }
  if (d.has_dim_param()) return Dim::symbol(d.dim_param());
  return Dim{};
}

DataType convert_dtype(int32_t v, const std::string& where, bool allow_undefined) {
  if (v == 0 && allow_undefined) return DataType::kUndefined;
  OT_CHECK(is_known_dtype(v), where, ": unknown data type ", v);
  return static_cast<DataType>(v);
}

ValueType convert_type(const onnx::TypeProto& t, const std::string& where) {
  ValueType out;
  auto convert_shape = [&](const onnx::TensorShapeProto& s) {
    OT_CHECK(s.dim_size() <= kMaxRank, where, ": rank ", s.dim_size(), " exceeds ", kMaxRank);
    Shape shape;
    for (int i = 0; i < s.dim_size(); ++i) shape.push_back(convert_dim(s.dim(i), where, i));
    return shape;
  };
  switch (t.value_case()) {
    case onnx::TypeProto::kTensorType:
      out.kind = ValueType::Kind::kTensor;
      out.dtype = convert_dtype(t.tensor_type().elem_type(), where, true);
      if (t.tensor_type().has_shape()) out.shape = convert_shape(t.tensor_type().shape());
      break;
    case onnx::TypeProto::kSparseTensorType:
      out.kind = ValueType::Kind::kSparseTensor;
      out.dtype = convert_dtype(t.sparse_tensor_type().elem_type(), where, true);
      if (t.sparse_tensor_type().has_shape())
        out.shape = convert_shape(t.sparse_tensor_type().shape());
      break;
    case onnx::TypeProto::kSequenceType:
      out.kind = ValueType::Kind::kSequence;
      if (t.sequence_type().has_elem_type())
        out.elem = std::make_shared<ValueType>(convert_type(t.sequence_type().elem_type(), where));
      break;
    case onnx::TypeProto::kOptionalType:
      out.kind = ValueType::Kind::kOptional;
      if (t.optional_type().has_elem_type())
        out.elem = std::make_shared<ValueType>(convert_type(t.optional_type().elem_type(), where));
      break;
    case onnx::TypeProto::kMapType:
      out.kind = ValueType::Kind::kMap;
      out.map_key = convert_dtype(t.map_type().key_type(), where, true);
      if (t.map_type().has_value_type())
        out.elem = std::make_shared<ValueType>(convert_type(t.map_type().value_type(), where));
      break;
    default:
      break;
  }
  return out;
}

// ---------------------------------------------------------------- tensors

// Checks `location` and returns the canonical path of the data file inside base_dir.
fs::path resolve_external(const std::string& location, const Ctx& ctx, const std::string& where) {
  OT_CHECK(!location.empty(), where, ": external data has no 'location'");
  OT_CHECK(!ctx.base_dir.empty(), where, ": external data '", location,
           "' needs a model file to resolve against");
  fs::path loc(location);
  OT_CHECK(!loc.is_absolute() && location[0] != '/', where, ": external data location '", location,
           "' is absolute; it must be relative to the model's folder");
  for (const auto& part : loc)
    OT_CHECK(part != "..", where, ": external data location '", location,
             "' contains '..'; it must stay inside the model's folder");
  std::error_code ec;
  fs::path base = fs::canonical(ctx.base_dir, ec);
  OT_CHECK(!ec, where, ": cannot resolve model folder '", ctx.base_dir, "': ", ec.message());
  fs::path full = fs::canonical(base / loc, ec);
  OT_CHECK(!ec, where, ": external data file '", location, "' not found next to the model (",
           ec.message(), ")");
  auto rel = full.lexically_relative(base);
  OT_CHECK(!rel.empty() && *rel.begin() != "..", where, ": external data location '", location,
           "' resolves to '", full.string(), "', outside the model's folder");
  OT_CHECK(fs::is_regular_file(full, ec), where, ": external data '", location,
           "' is not a regular file");
  return full;
}

struct ExternalRef {
  fs::path path;
  std::string location;
  int64_t offset = 0;
  int64_t length = 0;
};

// Validates location, offset and length against the file before anything is allocated.
ExternalRef check_external(const onnx::TensorProto& t, Ctx& ctx, const std::string& where,
                           int64_t expected) {
  ExternalRef ref;
  int64_t length = -1;
  for (const auto& kv : t.external_data()) {
    auto parse_int = [&](const std::string& s) {
      size_t pos = 0;
      long long v = 0;
      try {
        v = std::stoll(s, &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      OT_CHECK(pos == s.size() && !s.empty() && v >= 0, where, ": external data '", kv.key(),
               "' is not a non-negative integer ('", s, "')");
      return static_cast<int64_t>(v);
    };
    if (kv.key() == "location") ref.location = kv.value();
    else if (kv.key() == "offset") ref.offset = parse_int(kv.value());
    else if (kv.key() == "length") length = parse_int(kv.value());
  }
  ref.path = resolve_external(ref.location, ctx, where);
  std::error_code ec;
  auto file_size = static_cast<int64_t>(fs::file_size(ref.path, ec));
  OT_CHECK(!ec, where, ": cannot stat external data '", ref.location, "': ", ec.message());
  OT_CHECK(ref.offset <= file_size, where, ": external data offset ", ref.offset,
           " is past the end of '", ref.location, "' (", file_size, " bytes)");
  if (length < 0) length = file_size - ref.offset;
  OT_CHECK(length <= file_size - ref.offset, where, ": external data offset ", ref.offset,
           " + length ", length, " is past the end of '", ref.location, "' (", file_size, " bytes)");
  OT_CHECK(length == expected, where, ": external data length ", length, " does not match dims (",
           expected, " bytes expected)");
  ref.length = length;
  return ref;
}

void read_external(const ExternalRef& ref, const std::string& where, Tensor& out) {
  std::ifstream in(ref.path, std::ios::binary);
  OT_CHECK(in.good(), where, ": cannot open external data '", ref.location, "'");
  in.seekg(ref.offset);
  if (ref.length > 0) in.read(reinterpret_cast<char*>(out.mutable_data()), ref.length);
  OT_CHECK(in.good() && in.gcount() == ref.length, where, ": short read from external data '",
           ref.location, "'");
}

template <typename Src, typename Dst>
void copy_typed(const Src& field, size_t expected, Tensor& out, const std::string& where,
                const char* field_name) {
  OT_CHECK(static_cast<size_t>(field.size()) == expected, where, ": ", field_name, " holds ",
           field.size(), " values but dims need ", expected);
  auto* dst = out.mutable_data_as<Dst>();
  for (size_t i = 0; i < expected; ++i) dst[i] = static_cast<Dst>(field.Get(static_cast<int>(i)));
}

Tensor convert_tensor(const onnx::TensorProto& t, Ctx& ctx, const std::string& where) {
  OT_CHECK(!t.has_segment(), where, ": segmented tensors are not supported");
  DataType dt = convert_dtype(t.data_type(), where, false);
  OT_CHECK(t.dims_size() <= kMaxRank, where, ": rank ", t.dims_size(), " exceeds ", kMaxRank);
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  int64_t count = checked_element_count(dims, where);
  if (dt != DataType::kString) {
    auto bytes = dtype_storage_bytes(dt, count);
    OT_CHECK(bytes && *bytes <= ctx.opts.max_tensor_bytes, where, ": ", count, " elements of ",
             dtype_short_name(dt), " exceed the tensor size cap of ", ctx.opts.max_tensor_bytes,
             " bytes");
  }
  bool external = t.data_location() == onnx::TensorProto::EXTERNAL;
  if (!external && !t.has_raw_data() && dt != DataType::kString) {
    // Refuse a huge tensor whose typed field cannot possibly hold it before allocating.
    int64_t available = std::max({t.float_data_size(), t.int32_data_size(), t.int64_data_size(),
                                  t.double_data_size(), t.uint64_data_size()});
    int64_t needed = count;
    if (dt == DataType::kComplex64 || dt == DataType::kComplex128) needed = 2 * count;
    if (dtype_bits(dt) == 4) needed = count / 2 + count % 2;
    OT_CHECK(available >= needed, where, ": holds ", available, " values but dims need ", needed);
  }
  if (!external && t.has_raw_data() && dt != DataType::kString) {
    auto expected = dtype_storage_bytes(dt, count);
    OT_CHECK(static_cast<int64_t>(t.raw_data().size()) == *expected, where, ": raw_data has ",
             t.raw_data().size(), " bytes but dims ", dims.size() ? "" : "[] ", "need ", *expected,
             " (", count, " x ", dtype_short_name(dt), ")");
  }
  if (dt == DataType::kString) {
    // Checked before allocating: the element count is bounded by what the file holds.
    OT_CHECK(!external, where, ": string tensors cannot use external data");
    OT_CHECK(t.string_data_size() == count, where, ": string_data holds ", t.string_data_size(),
             " values but dims need ", count);
  }
  std::optional<ExternalRef> ext;
  if (external && dt != DataType::kString)
    ext = check_external(t, ctx, where, *dtype_storage_bytes(dt, count));
  Tensor out(dt, dims);
  if (dt == DataType::kString) {
    for (int64_t i = 0; i < count; ++i) out.mutable_strings()[i] = t.string_data(static_cast<int>(i));
    return out;
  }
  if (external) {
    read_external(*ext, where, out);
    return out;
  }
  if (t.has_raw_data()) {
    if (out.nbytes()) std::memcpy(out.mutable_data(), t.raw_data().data(), out.nbytes());
    return out;
  }
  auto n = static_cast<size_t>(count);
  switch (dt) {
    case DataType::kFloat: copy_typed<decltype(t.float_data()), float>(t.float_data(), n, out, where, "float_data"); break;
    case DataType::kComplex64: copy_typed<decltype(t.float_data()), float>(t.float_data(), 2 * n, out, where, "float_data"); break;
    case DataType::kDouble: copy_typed<decltype(t.double_data()), double>(t.double_data(), n, out, where, "double_data"); break;
    case DataType::kComplex128: copy_typed<decltype(t.double_data()), double>(t.double_data(), 2 * n, out, where, "double_data"); break;
    case DataType::kInt64: copy_typed<decltype(t.int64_data()), int64_t>(t.int64_data(), n, out, where, "int64_data"); break;
    case DataType::kUInt32: copy_typed<decltype(t.uint64_data()), uint32_t>(t.uint64_data(), n, out, where, "uint64_data"); break;
    case DataType::kUInt64: copy_typed<decltype(t.uint64_data()), uint64_t>(t.uint64_data(), n, out, where, "uint64_data"); break;
    case DataType::kInt32: copy_typed<decltype(t.int32_data()), int32_t>(t.int32_data(), n, out, where, "int32_data"); break;
    case DataType::kInt16: copy_typed<decltype(t.int32_data()), int16_t>(t.int32_data(), n, out, where, "int32_data"); break;
    case DataType::kUInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16: copy_typed<decltype(t.int32_data()), uint16_t>(t.int32_data(), n, out, where, "int32_data"); break;
    case DataType::kInt8: copy_typed<decltype(t.int32_data()), int8_t>(t.int32_data(), n, out, where, "int32_data"); break;
    case DataType::kUInt8:
    case DataType::kBool:
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ: copy_typed<decltype(t.int32_data()), uint8_t>(t.int32_data(), n, out, where, "int32_data"); break;
    case DataType::kUInt4:
    case DataType::kInt4: {
      // int32_data holds one packed byte per pair of elements.
      copy_typed<decltype(t.int32_data()), uint8_t>(t.int32_data(), out.nbytes(), out, where, "int32_data");
      break;
    }
    default: fail(where, ": data type ", dtype_short_name(dt), " has no typed storage");
  }
  return out;
}

// ---------------------------------------------------------------- functions

// Expands calls of model-local functions into their bodies, recursively.
void expand_nodes(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes, Ctx& ctx,
                  int depth, std::vector<onnx::NodeProto>& out, const std::string& where);

void inline_call(const onnx::NodeProto& call, const onnx::FunctionProto& fn, Ctx& ctx, int depth,
                 std::vector<onnx::NodeProto>& out, const std::string& where) {
  std::string fn_where = cat(where, "function '", fn.name(), "' (domain '", fn.domain(), "')");
  OT_CHECK(depth < kMaxFunctionDepth, fn_where, ": functions nest deeper than ", kMaxFunctionDepth,
           " (recursive function?)");
  std::map<std::string, std::string> rename;
  for (int i = 0; i < fn.input_size(); ++i)
    rename[fn.input(i)] = i < call.input_size() ? call.input(i) : "";
  for (int i = 0; i < fn.output_size(); ++i)
    rename[fn.output(i)] = i < call.output_size() ? call.output(i) : "";
  std::string prefix = cat(call.name().empty() ? fn.name() : call.name(), "/inl", ctx.inline_counter++, "/");
  auto mapped = [&](const std::string& n) -> std::string {
    if (n.empty()) return n;
    auto it = rename.find(n);
    return it != rename.end() ? it->second : prefix + n;
  };
  std::map<std::string, const onnx::AttributeProto*> call_attrs;
  for (const auto& a : call.attribute()) call_attrs[a.name()] = &a;

  ctx.inlined_nodes += fn.node_size();
  OT_CHECK(ctx.inlined_nodes <= ctx.inline_budget, fn_where, ": inlining expands the graph beyond ",
           ctx.inline_budget, " nodes");
  google::protobuf::RepeatedPtrField<onnx::NodeProto> body;
  for (const auto& n : fn.node()) {
    onnx::NodeProto c = n;
    for (int i = 0; i < c.input_size(); ++i) c.set_input(i, mapped(c.input(i)));
    for (int i = 0; i < c.output_size(); ++i) c.set_output(i, mapped(c.output(i)));
    if (!c.name().empty()) c.set_name(prefix + c.name());
    google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
    for (const auto& a : c.attribute()) {
      OT_CHECK(a.type() != onnx::AttributeProto::GRAPH && a.type() != onnx::AttributeProto::GRAPHS,
               fn_where, ": node '", n.name(), "' (", n.op_type(),
               ") has a subgraph attribute; inlining such function bodies is not supported");
      if (a.ref_attr_name().empty()) {
        *attrs.Add() = a;
        continue;
      }
      auto it = call_attrs.find(a.ref_attr_name());
      if (it == call_attrs.end()) continue;  // not given by the caller: attribute absent
      onnx::AttributeProto v = *it->second;
      v.set_name(a.name());
      *attrs.Add() = v;
    }
    *c.mutable_attribute() = attrs;
    *body.Add() = std::move(c);
  }
  expand_nodes(body, ctx, depth + 1, out, where);
}

void expand_nodes(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes, Ctx& ctx,
                  int depth, std::vector<onnx::NodeProto>& out, const std::string& where) {
  for (const auto& n : nodes) {
    auto it = ctx.functions.find({n.domain(), n.op_type()});
    if (it == ctx.functions.end()) {
      out.push_back(n);
      continue;
    }
    inline_call(n, *it->second, ctx, depth, out, where);
  }
}

// ---------------------------------------------------------------- graphs

void convert_graph(const onnx::GraphProto& gp, Graph& g, Ctx& ctx, int depth);

Attribute convert_attribute(const onnx::AttributeProto& ap, Graph& owner, Ctx& ctx, int depth,
                            const std::string& where) {
  std::string aw = cat(where, ": attribute '", ap.name(), "'");
  OT_CHECK(!ap.name().empty(), where, ": attribute without a name");
  Attribute a;
  a.name = ap.name();
  a.doc_string = ap.doc_string();
  a.ref_attr_name = ap.ref_attr_name();
  int type = ap.type();
  if (type == 0) {  // very old exporters leave the type out: infer it from the field set
    if (ap.has_f()) type = 1;
    else if (ap.has_i()) type = 2;
    else if (ap.has_s()) type = 3;
    else if (ap.has_t()) type = 4;
    else if (ap.has_g()) type = 5;
    else if (ap.floats_size()) type = 6;
    else if (ap.ints_size()) type = 7;
    else if (ap.strings_size()) type = 8;
    else if (ap.tensors_size()) type = 9;
    else if (ap.graphs_size()) type = 10;
    else fail(aw, ": no type and no value");
  }
  auto subgraph = [&](const onnx::GraphProto& sg) {
    OT_CHECK(depth + 1 <= ctx.opts.max_subgraph_depth, aw, ": subgraphs nest deeper than ",
             ctx.opts.max_subgraph_depth, " levels");
    auto child = std::make_unique<Graph>(sg.name(), &owner);
    convert_graph(sg, *child, ctx, depth + 1);
    return GraphPtr(std::move(child));
  };
  switch (type) {
    case 1: a.value = ap.f(); break;
    case 2: a.value = static_cast<int64_t>(ap.i()); break;
    case 3: a.value = ap.s(); break;
    case 4: a.value = convert_tensor(ap.t(), ctx, cat(aw, " tensor")); break;
    case 5: a.value = subgraph(ap.g()); break;
    case 6: a.value = std::vector<float>(ap.floats().begin(), ap.floats().end()); break;
    case 7: a.value = std::vector<int64_t>(ap.ints().begin(), ap.ints().end()); break;
    case 8: a.value = std::vector<std::string>(ap.strings().begin(), ap.strings().end()); break;
    case 9: {
      std::vector<Tensor> ts;
      for (const auto& t : ap.tensors()) ts.push_back(convert_tensor(t, ctx, cat(aw, " tensor")));
      a.value = std::move(ts);
      break;
    }
    case 10: {
      std::vector<GraphPtr> gs;
      for (const auto& sg : ap.graphs()) gs.push_back(subgraph(sg));
      a.value = std::move(gs);
      break;
    }
    case 13: a.value = convert_type(ap.tp(), aw); break;
    case 14: {
      std::vector<ValueType> tps;
      for (const auto& tp : ap.type_protos()) tps.push_back(convert_type(tp, aw));
      a.value = std::move(tps);
      break;
    }
    case 11:
    case 12: fail(aw, ": sparse tensor attributes are not supported");
    default: fail(aw, ": unknown attribute type ", type);
  }
  a.type = static_cast<AttrType>(type);
  return a;
}

void convert_graph(const onnx::GraphProto& gp, Graph& g, Ctx& ctx, int depth) {
  std::string gw = depth == 0 ? cat(ctx.file, ": ") : cat(ctx.file, ": subgraph '", gp.name(), "': ");
  g.name = gp.name();
  g.doc_string = gp.doc_string();
  OT_CHECK(gp.sparse_initializer_size() == 0, gw, "sparse initializer '",
           gp.sparse_initializer(0).values().name(), "' is not supported");

  for (const auto& vi : gp.input()) {
    OT_CHECK(!vi.name().empty(), gw, "graph input without a name");
    OT_CHECK(!g.find_value(vi.name()), gw, "graph input '", vi.name(), "' is listed twice");
    Value* v = g.add_input(vi.name(), convert_type(vi.type(), cat(gw, "input '", vi.name(), "'")));
    v->doc_string = vi.doc_string();
    v->metadata = read_value_metadata(vi, cat(gw, "input '", vi.name(), "'"));
  }
  for (const auto& tp : gp.initializer()) {
    OT_CHECK(!tp.name().empty(), gw, "initializer without a name");
    std::string tw = tensor_where(gw, tp.name());
    Tensor t = convert_tensor(tp, ctx, tw);
    Value* v = g.find_value(tp.name());
    if (v) {
      OT_CHECK(v->is_graph_input() && !v->has_initializer(), tw, ": initializer is defined twice");
      g.set_initializer(v, std::move(t));
    } else {
      g.add_initializer(tp.name(), std::move(t));
    }
  }

  std::vector<onnx::NodeProto> nodes;
  expand_nodes(gp.node(), ctx, 0, nodes, gw);
  // Pass 1: create nodes and their outputs (so inputs may refer to any definition).
  std::vector<Node*> created;
  created.reserve(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) {
    const auto& np = nodes[k];
    std::string nw = np.name().empty() ? cat(gw, "node #", k, " (", np.op_type(), ")")
                                       : cat(gw, "node '", np.name(), "' (", np.op_type(), ")");
    OT_CHECK(!np.op_type().empty(), nw, ": empty op_type");
    std::set<std::string> seen;
    for (const auto& o : np.output()) {
      if (o.empty()) continue;
      OT_CHECK(seen.insert(o).second, nw, ": output '", o, "' is listed twice");
      if (Value* prev = g.find_value(o))
        fail(nw, ": output '", o, "' is already defined by ",
             prev->producer() ? prev->producer()->describe()
                              : (prev->has_initializer() ? "an initializer" : "a graph input"));
    }
    std::vector<std::string> outs(np.output().begin(), np.output().end());
    Node* n = g.add_node(np.op_type(), {}, outs, np.name(), np.domain());
    n->doc_string = np.doc_string();
    created.push_back(n);
  }
  // Pass 2: wire inputs and convert attributes (subgraphs now see every outer value).
  for (size_t k = 0; k < nodes.size(); ++k) {
    const auto& np = nodes[k];
    Node* n = created[k];
    std::string nw = cat(gw, n->name.empty() ? cat("node #", k, " (", n->op_type, ")") : n->describe());
    for (int i = 0; i < np.input_size(); ++i) {
      const std::string& in = np.input(i);
      if (in.empty()) {
        n->set_input(static_cast<size_t>(i), nullptr);
        continue;
      }
      Value* v = g.lookup(in);
      OT_CHECK(v, nw, ": input ", i, " '", in, "' is not defined");
      n->set_input(static_cast<size_t>(i), v);
    }
    for (const auto& ap : np.attribute()) {
      if (ap.name() == "device" && ap.type() == onnx::AttributeProto::STRING) {
        n->device = ap.s();  // placement as files before "onnxtrain.placement" wrote it
        continue;
      }
      OT_CHECK(!n->find_attr(ap.name()), nw, ": attribute '", ap.name(), "' is given twice");
      n->attributes.push_back(convert_attribute(ap, g, ctx, depth, nw));
    }
  }

  for (const auto& vi : gp.value_info()) {
    Value* v = g.find_value(vi.name());
    if (!v) continue;
    // An initializer's or input's entry adds its metadata (torch's dynamo exporter writes the
    // parameter / buffer marks there); its type and doc string came from its own definition.
    merge_value_metadata(v->metadata,
                         read_value_metadata(vi, cat(gw, "value_info '", vi.name(), "'")));
    if (v->has_initializer() || v->is_graph_input()) continue;
    v->type = convert_type(vi.type(), cat(gw, "value_info '", vi.name(), "'"));
    v->doc_string = vi.doc_string();
  }
  std::set<std::string> out_names;
  for (const auto& vi : gp.output()) {
    OT_CHECK(out_names.insert(vi.name()).second, gw, "graph output '", vi.name(), "' is listed twice");
    Value* v = g.lookup(vi.name());
    OT_CHECK(v, gw, "graph output '", vi.name(), "' is not defined");
    ValueType t = convert_type(vi.type(), cat(gw, "output '", vi.name(), "'"));
    if (t.kind != ValueType::Kind::kUnknown && v->owner() == &g) v->type = std::move(t);
    if (v->owner() == &g)
      merge_value_metadata(v->metadata, read_value_metadata(vi, cat(gw, "output '", vi.name(), "'")));
    g.add_output(v);
  }
}

std::unique_ptr<Model> convert_model(const onnx::ModelProto& mp, Ctx& ctx) {
  OT_CHECK(mp.has_graph(), ctx.file, ": not an ONNX model (no graph)");
  auto m = std::make_unique<Model>();
  m->ir_version = mp.ir_version();
  m->producer_name = mp.producer_name();
  m->producer_version = mp.producer_version();
  m->domain = mp.domain();
  m->model_version = mp.model_version();
  m->doc_string = mp.doc_string();
  for (const auto& kv : mp.metadata_props()) m->metadata.emplace_back(kv.key(), kv.value());
  for (const auto& o : mp.opset_import()) {
    OT_CHECK(o.version() >= 0, ctx.file, ": opset_import '", o.domain(), "': negative version");
    m->opsets.push_back({o.domain(), o.version()});
  }
  // Expansion may multiply the stored nodes, but not without bound (a 2 KB file whose functions
  // each call the next twice would otherwise expand to 2^30 nodes).
  int64_t stored_nodes = mp.graph().node_size();
  for (const auto& f : mp.functions()) stored_nodes += f.node_size();
  ctx.inline_budget = std::max<int64_t>(100000, 64 * stored_nodes);
  for (const auto& f : mp.functions()) {
    auto key = std::make_pair(f.domain(), f.name());
    OT_CHECK(!ctx.functions.count(key), ctx.file, ": function '", f.name(), "' is defined twice");
    ctx.functions[key] = &f;
    // Inlined bodies may use opsets only the function imports.
    for (const auto& o : f.opset_import())
      if (!m->opset_version(o.domain())) m->opsets.push_back({o.domain(), o.version()});
  }
  convert_graph(mp.graph(), *m->graph, ctx, 0);
  if (!ctx.functions.empty()) {
    try {
      m->graph->sort_topologically();  // inlined bodies land where their call was
    } catch (const Error& e) {
      fail(ctx.file, ": ", e.what());
    }
  }
  // Placement lives in Node::device and the training signature in Model::training, not in the
  // metadata (export writes both entries afresh).
  std::vector<std::pair<std::string, std::string>> metadata;
  for (auto& [k, v] : m->metadata) {
    if (k == kPlacementKey)
      decode_placement(v, *m->graph, ctx.file);
    else if (k == kTrainingKey)
      decode_training(v, *m, ctx.file);
    else
      metadata.emplace_back(std::move(k), std::move(v));
  }
  m->metadata = std::move(metadata);
  m->source_path = ctx.file;
  return m;
}

}  // namespace

std::unique_ptr<Model> import_onnx_bytes(std::string_view bytes, const std::string& display_name,
                                         const std::string& base_dir, const LoadOptions& opts) {
  OT_CHECK(!bytes.empty(), display_name, ": file is empty");
  OT_CHECK(static_cast<int64_t>(bytes.size()) <= opts.max_file_bytes, display_name, ": ",
           bytes.size(), " bytes exceeds the model size limit of ", opts.max_file_bytes);
  OT_CHECK(bytes.size() < (size_t{1} << 31), display_name, ": protobuf cannot exceed 2 GiB");
  onnx::ModelProto mp;
  OT_CHECK(mp.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())), display_name,
           ": not a valid ONNX model (protobuf parse failed: truncated or corrupt file)");
  Ctx ctx{display_name, base_dir, opts, {}, 0};
  auto m = convert_model(mp, ctx);
  if (opts.verify) verify_model(*m);
  return m;
}

Tensor import_tensor_proto(std::string_view bytes, const std::string& display_name,
                           const LoadOptions& opts) {
  OT_CHECK(bytes.size() < (size_t{1} << 31), display_name, ": protobuf cannot exceed 2 GiB");
  onnx::TensorProto tp;
  OT_CHECK(tp.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())), display_name,
           ": not a valid ONNX TensorProto (protobuf parse failed)");
  Ctx ctx{display_name, "", opts, {}, 0};
  return convert_tensor(tp, ctx, cat(display_name, ": tensor '", tp.name(), "'"));
}

std::unique_ptr<Model> import_onnx_file(const std::string& path, const LoadOptions& opts) {
  std::error_code ec;
  OT_CHECK(fs::exists(path, ec), path, ": no such file");
  OT_CHECK(!fs::is_directory(path, ec), path, ": is a directory, not an ONNX file");
  std::ifstream in(path, std::ios::binary);
  OT_CHECK(in.good(), path, ": cannot open (", std::strerror(errno), ")");
  in.seekg(0, std::ios::end);
  auto size = static_cast<int64_t>(in.tellg());
  OT_CHECK(size >= 0, path, ": cannot read size");
  OT_CHECK(size <= opts.max_file_bytes, path, ": ", size, " bytes exceeds the model size limit of ",
           opts.max_file_bytes);
  in.seekg(0);
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), size);
  OT_CHECK(in.gcount() == size, path, ": short read");
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  return import_onnx_bytes(bytes, path, dir.string(), opts);
}

}  // namespace onnxtrain::graph
