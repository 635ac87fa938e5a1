// IR -> ONNX protobuf. Tensors are written as raw_data (strings as string_data); large
// initializers optionally go to one external data file next to the model.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "graph/error.h"
#include "graph/file_io.h"
#include "graph/onnx_io.h"
#include "graph/onnx_placement.h"
#include "graph/onnx_value_metadata.h"
#include "onnx/onnx_pb.h"

namespace onnxtrain::graph {
namespace {

namespace fs = std::filesystem;

struct ExternalWriter {
  std::string file_name;  // relative to the model folder
  OutputFile* out = nullptr;
  int64_t threshold = 0;
  int64_t offset = 0;
};

void fill_type(const ValueType& t, onnx::TypeProto* tp) {
  auto fill_shape = [](const std::optional<Shape>& s, onnx::TensorShapeProto* sp) {
    for (const Dim& d : *s) {
      auto* dp = sp->add_dim();
      if (d.is_known()) dp->set_dim_value(d.value);
      else if (!d.param.empty()) dp->set_dim_param(d.param);
    }
  };
  switch (t.kind) {
    case ValueType::Kind::kTensor: {
      auto* tt = tp->mutable_tensor_type();
      tt->set_elem_type(static_cast<int32_t>(t.dtype));
      if (t.shape) fill_shape(t.shape, tt->mutable_shape());
      break;
    }
    case ValueType::Kind::kSparseTensor: {
      auto* tt = tp->mutable_sparse_tensor_type();
      tt->set_elem_type(static_cast<int32_t>(t.dtype));
      if (t.shape) fill_shape(t.shape, tt->mutable_shape());
      break;
    }
    case ValueType::Kind::kSequence:
      if (t.elem) fill_type(*t.elem, tp->mutable_sequence_type()->mutable_elem_type());
      else tp->mutable_sequence_type();
      break;
    case ValueType::Kind::kOptional:
      if (t.elem) fill_type(*t.elem, tp->mutable_optional_type()->mutable_elem_type());
      else tp->mutable_optional_type();
      break;
    case ValueType::Kind::kMap:
      tp->mutable_map_type()->set_key_type(static_cast<int32_t>(t.map_key));
      if (t.elem) fill_type(*t.elem, tp->mutable_map_type()->mutable_value_type());
      break;
    case ValueType::Kind::kUnknown:
      break;
  }
}

void fill_value_info(const Value& v, onnx::ValueInfoProto* vi) {
  vi->set_name(v.name());
  if (!v.doc_string.empty()) vi->set_doc_string(v.doc_string);
  if (v.type.kind != ValueType::Kind::kUnknown) fill_type(v.type, vi->mutable_type());
  write_value_metadata(v.metadata, vi);
}

void fill_tensor(const Tensor& t, const std::string& name, onnx::TensorProto* tp,
                 ExternalWriter* ext) {
  tp->set_name(name);
  tp->set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.dims()) tp->add_dims(d);
  if (t.dtype() == DataType::kString) {
    for (const auto& s : t.strings()) tp->add_string_data(s);
    return;
  }
  auto nbytes = static_cast<int64_t>(t.nbytes());
  if (ext && ext->out && ext->threshold > 0 && nbytes >= ext->threshold) {
    // 4 KiB alignment so the data file can be memory-mapped per tensor.
    int64_t pad = (4096 - ext->offset % 4096) % 4096;
    static const char zeros[4096] = {};
    ext->out->write(zeros, pad);
    ext->offset += pad;
    ext->out->write(reinterpret_cast<const char*>(t.data()), nbytes);
    tp->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* kv = tp->add_external_data();
      kv->set_key(k);
      kv->set_value(v);
    };
    add("location", ext->file_name);
    add("offset", std::to_string(ext->offset));
    add("length", std::to_string(nbytes));
    ext->offset += nbytes;
    return;
  }
  tp->set_raw_data(reinterpret_cast<const char*>(t.data()), static_cast<size_t>(nbytes));
}

void fill_graph(const Graph& g, onnx::GraphProto* gp, ExternalWriter* ext);

void fill_attribute(const Attribute& a, onnx::AttributeProto* ap, ExternalWriter* ext) {
  ap->set_name(a.name);
  if (!a.doc_string.empty()) ap->set_doc_string(a.doc_string);
  if (!a.ref_attr_name.empty()) ap->set_ref_attr_name(a.ref_attr_name);
  ap->set_type(static_cast<onnx::AttributeProto::AttributeType>(a.type));
  switch (a.type) {
    case AttrType::kFloat: ap->set_f(a.f()); break;
    case AttrType::kInt: ap->set_i(a.i()); break;
    case AttrType::kString: ap->set_s(a.s()); break;
    case AttrType::kTensor: fill_tensor(a.t(), "", ap->mutable_t(), nullptr); break;
    case AttrType::kGraph: fill_graph(a.g(), ap->mutable_g(), ext); break;
    case AttrType::kFloats:
      for (float f : a.floats()) ap->add_floats(f);
      break;
    case AttrType::kInts:
      for (int64_t i : a.ints()) ap->add_ints(i);
      break;
    case AttrType::kStrings:
      for (const auto& s : a.strings()) ap->add_strings(s);
      break;
    case AttrType::kTensors:
      for (const auto& t : a.tensors()) fill_tensor(t, "", ap->add_tensors(), nullptr);
      break;
    case AttrType::kGraphs:
      for (const auto& sg : a.graphs()) fill_graph(*sg, ap->add_graphs(), ext);
      break;
    case AttrType::kTypeProto: fill_type(a.tp(), ap->mutable_tp()); break;
    case AttrType::kTypeProtos:
      for (const auto& t : a.tps()) fill_type(t, ap->add_type_protos());
      break;
    default: fail("attribute '", a.name, "': cannot export type ", attr_type_name(a.type));
  }
}

void fill_graph(const Graph& g, onnx::GraphProto* gp, ExternalWriter* ext) {
  gp->set_name(g.name);
  if (!g.doc_string.empty()) gp->set_doc_string(g.doc_string);
  for (const Value* v : g.inputs()) fill_value_info(*v, gp->add_input());
  for (const Value* v : g.initializers())
    fill_tensor(v->initializer(), v->name(), gp->add_initializer(), ext);
  for (const auto& n : g.nodes()) {
    auto* np = gp->add_node();
    for (const Value* in : n->inputs()) np->add_input(in ? in->name() : "");
    for (const Value* out : n->outputs()) np->add_output(out ? out->name() : "");
    if (!n->name.empty()) np->set_name(n->name);
    np->set_op_type(n->op_type);
    if (!n->domain.empty()) np->set_domain(n->domain);
    if (!n->doc_string.empty()) np->set_doc_string(n->doc_string);
    for (const auto& a : n->attributes) fill_attribute(a, np->add_attribute(), ext);
  }
  for (const Value* v : g.outputs()) fill_value_info(*v, gp->add_output());
  for (const auto& v : g.values()) {
    if (v->is_graph_input() || v->is_graph_output()) continue;
    if (v->has_initializer()) {  // only its metadata (the initializer has its type)
      if (v->metadata.empty()) continue;
      onnx::ValueInfoProto* vi = gp->add_value_info();
      vi->set_name(v->name());
      write_value_metadata(v->metadata, vi);
      continue;
    }
    if (v->type.kind == ValueType::Kind::kUnknown && v->doc_string.empty() && v->metadata.empty())
      continue;
    fill_value_info(*v, gp->add_value_info());
  }
}

onnx::ModelProto to_proto(const Model& m, ExternalWriter* ext) {
  onnx::ModelProto mp;
  mp.set_ir_version(m.ir_version);
  for (const auto& o : m.opsets) {
    auto* op = mp.add_opset_import();
    op->set_domain(o.domain);
    op->set_version(o.version);
  }
  if (!m.producer_name.empty()) mp.set_producer_name(m.producer_name);
  if (!m.producer_version.empty()) mp.set_producer_version(m.producer_version);
  if (!m.domain.empty()) mp.set_domain(m.domain);
  if (m.model_version) mp.set_model_version(m.model_version);
  if (!m.doc_string.empty()) mp.set_doc_string(m.doc_string);
  // Node::device and Model::training go to their entries, written afresh from the model.
  for (const auto& [k, v] : m.metadata) {
    if (k == kPlacementKey || k == kTrainingKey) continue;
    auto* kv = mp.add_metadata_props();
    kv->set_key(k);
    kv->set_value(v);
  }
  if (std::string placement = encode_placement(*m.graph); !placement.empty()) {
    auto* kv = mp.add_metadata_props();
    kv->set_key(kPlacementKey);
    kv->set_value(std::move(placement));
  }
  if (std::string training = encode_training(m); !training.empty()) {
    auto* kv = mp.add_metadata_props();
    kv->set_key(kTrainingKey);
    kv->set_value(std::move(training));
  }
  fill_graph(*m.graph, mp.mutable_graph(), ext);
  return mp;
}

std::string serialize(const onnx::ModelProto& mp, const std::string& what) {
  OT_CHECK(mp.ByteSizeLong() < (size_t{1} << 31), what,
           ": model exceeds protobuf's 2 GiB limit; save with external data");
  std::string bytes;
  OT_CHECK(mp.SerializeToString(&bytes), what, ": protobuf serialization failed");
  return bytes;
}

}  // namespace

std::string export_onnx_bytes(const Model& m) { return serialize(to_proto(m, nullptr), "export"); }

void export_onnx_file(const Model& m, const std::string& path, const SaveOptions& opts) {
  fs::path p(path);
  OT_CHECK(!fs::is_directory(p), path, ": is a directory");
  if (opts.external_data_threshold <= 0) {
    write_file(path, serialize(to_proto(m, nullptr), path));
    return;
  }
  ExternalWriter ext;
  ext.file_name = opts.external_data_file.empty() ? p.filename().string() + ".data"
                                                  : opts.external_data_file;
  OT_CHECK(fs::path(ext.file_name).filename() == ext.file_name, path,
           ": external data file name '", ext.file_name, "' must be a plain file name");
  // The data file first, then the model that names it (both through file_io's one writer).
  OutputFile data((p.parent_path() / ext.file_name).string());
  ext.out = &data;
  ext.threshold = opts.external_data_threshold;
  const std::string bytes = serialize(to_proto(m, &ext), path);
  data.commit();
  write_file(path, bytes);
}

}  // namespace onnxtrain::graph
