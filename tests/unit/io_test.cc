// ONNX import/export: round trips of every dtype and attribute kind, typed data fields,
// external data, local-function inlining, the device annotation, and atomic writes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "graph/compare.h"
#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/onnx_value_metadata.h"
#include "graph/printer.h"
#include "onnx/checker.h"
#include "onnx/onnx_pb.h"

namespace onnxtrain::graph {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / cat("onnxtrain_io_", ::getpid(), "_", name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::unique_ptr<Model> roundtrip(const Model& m) {
  return import_onnx_bytes(export_onnx_bytes(m), "roundtrip.onnx", "");
}

std::unique_ptr<Model> small_model() {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  Graph& g = *m->graph;
  Value* x = g.add_input("x", ValueType::tensor(DataType::kFloat, Shape{Dim::symbol("N"), Dim::known(4)}));
  Value* w = g.add_initializer("w", Tensor::from_vector<float>(DataType::kFloat, {4, 2},
                                                               {1, 2, 3, 4, 5, 6, 7, 8}));
  Value* b = g.add_initializer("b", Tensor::from_vector<float>(DataType::kFloat, {2}, {0.5f, -0.5f}));
  Node* mm = g.add_node("MatMul", {x, w}, {"xw"}, "mm");
  Node* add = g.add_node("Add", {mm->output(0), b}, {"y"}, "add");
  add->output(0)->type = ValueType::tensor(DataType::kFloat, Shape{Dim::symbol("N"), Dim::known(2)});
  g.add_output(add->output(0));
  return m;
}

TEST(OnnxIO, SmallModelRoundTripsAndPassesChecker) {
  auto m = small_model();
  std::string bytes = export_onnx_bytes(*m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(bytes));
  EXPECT_NO_THROW(onnx::checker::check_model(proto));
  auto back = roundtrip(*m);
  std::string why;
  EXPECT_TRUE(models_equal(*m, *back, &why)) << why;
  EXPECT_EQ(back->graph->find_value("w")->initializer().data_as<float>()[7], 8.f);
}

// ValueInfoProto.metadata_props (field 4, ONNX 1.16; this build's onnx.proto predates it):
// what torch's dynamo exporter writes for every initializer (parameter or buffer) is read on
// import -- from value_info entries of initializers too -- written back on export, and a
// malformed entry is a one-line error naming the value.
TEST(OnnxIO, ValueMetadataRoundTrips) {
  const std::string kind = "pkg.torch.export.graph_signature.InputSpec.kind";
  auto m = small_model();
  Graph& g = *m->graph;
  g.find_value("x")->metadata = {{kind, "USER_INPUT"}};
  g.find_value("w")->metadata = {{kind, "PARAMETER"}, {"pkg.torch.onnx.original_node_name", "p_w"}};
  g.find_value("b")->metadata = {{kind, "BUFFER"}};
  g.find_value("xw")->metadata = {{"note", "an intermediate"}};
  g.find_value("y")->metadata = {{"note", "the output"}};
  const std::string bytes = export_onnx_bytes(*m);
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(bytes));
  EXPECT_NO_THROW(onnx::checker::check_model(proto));
  auto back = import_onnx_bytes(bytes, "meta.onnx", "");
  std::string why;
  EXPECT_TRUE(models_equal(*m, *back, &why)) << why;
  EXPECT_EQ(back->graph->find_value("b")->metadata, g.find_value("b")->metadata);
  EXPECT_EQ(back->graph->find_value("w")->metadata.size(), 2u);
  // A changed entry is a difference.
  back->graph->find_value("b")->metadata = {{kind, "PARAMETER"}};
  EXPECT_FALSE(models_equal(*m, *back, &why));
  EXPECT_NE(why.find("'b': metadata differs"), std::string::npos) << why;
  // Cloning keeps it (the trainer writes the trained model from a clone of the original).
  EXPECT_EQ(m->clone()->graph->find_value("w")->metadata, g.find_value("w")->metadata);

  // A value described twice (its input entry and a value_info entry) keeps each key once.
  onnx::ModelProto twice = proto;
  onnx::ValueInfoProto* again = twice.mutable_graph()->add_value_info();
  again->set_name("x");
  write_value_metadata({{kind, "USER_INPUT"}, {"note", "extra"}}, again);
  auto merged = import_onnx_bytes(twice.SerializeAsString(), "twice.onnx", "");
  EXPECT_EQ(merged->graph->find_value("x")->metadata,
            (std::vector<std::pair<std::string, std::string>>{{kind, "USER_INPUT"}, {"note", "extra"}}));

  // Field 4 that is not a key/value pair.
  onnx::ModelProto bad = proto;
  for (auto& vi : *bad.mutable_graph()->mutable_value_info())
    if (vi.name() == "b") vi.mutable_unknown_fields()->AddVarint(4, 7);
  try {
    import_onnx_bytes(bad.SerializeAsString(), "bad.onnx", "");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("value_info 'b': metadata_props entry 1 is not a "
                                         "key/value pair"),
              std::string::npos)
        << e.what();
  }
}

TEST(OnnxIO, EveryDtypeAndAttributeKindRoundTrips) {
  auto m = std::make_unique<Model>();
  m->set_opset("", 17);
  m->set_opset("ai.onnxtrain", 1);
  m->metadata = {{"k", "v"}};
  m->doc_string = "doc";
  Graph& g = *m->graph;
  for (int t = 1; t <= 22; ++t) {
    auto dt = static_cast<DataType>(t);
    Tensor ten(dt, {3});
    if (dt == DataType::kString) ten.mutable_strings() = {"a", "", "ccc"};
    else
      for (size_t i = 0; i < ten.nbytes(); ++i) ten.mutable_data()[i] = std::byte(i * 37 + t);
    g.add_initializer(cat("t", t), ten);
  }
  Value* in = g.add_input("in", ValueType::tensor(DataType::kFloat));  // rank unknown
  Node* n = g.add_node("Custom", {in, nullptr, g.find_value("t1")}, {"o1", "", "o3"}, "c",
                       "ai.onnxtrain");
  n->device = "cuda:1";
  n->set_attr(Attribute::make_float("f", 0.25f));
  n->set_attr(Attribute::make_int("i", -7));
  n->set_attr(Attribute::make_string("s", std::string("a\0b", 3)));
  n->set_attr(Attribute::make_tensor("t", Tensor::from_vector<int64_t>(DataType::kInt64, {2}, {4, 5})));
  n->set_attr(Attribute::make_floats("fs", {1.5f, -2.f}));
  n->set_attr(Attribute::make_ints("is", {1, 2, 3}));
  n->set_attr(Attribute::make_strings("ss", {"x", "y"}));
  Attribute ts;
  ts.name = "ts";
  ts.type = AttrType::kTensors;
  ts.value = std::vector<Tensor>{Tensor(DataType::kDouble, {1}), Tensor(DataType::kBool, {2})};
  n->set_attr(ts);
  Attribute tp;
  tp.name = "tp";
  tp.type = AttrType::kTypeProto;
  ValueType seq;
  seq.kind = ValueType::Kind::kSequence;
  seq.elem = std::make_shared<ValueType>(ValueType::tensor(DataType::kInt32, make_shape({2})));
  tp.value = seq;
  n->set_attr(tp);
  auto body = std::make_unique<Graph>("body", &g);
  Node* inner = body->add_node("Identity", {in}, {"inner_out"});
  body->add_output(inner->output(0));
  n->set_attr(Attribute::make_graph("g", std::move(body)));
  n->output(0)->type = seq;
  g.add_output(n->output(0));
  g.add_output(n->output(2));

  auto back = roundtrip(*m);
  std::string why;
  EXPECT_TRUE(models_equal(*m, *back, &why)) << why;
  Node* bn = back->graph->nodes()[0].get();
  EXPECT_EQ(bn->device, "cuda:1");
  EXPECT_EQ(bn->input(1), nullptr);
  EXPECT_EQ(bn->output(1), nullptr);
  EXPECT_EQ(bn->find_attr("s")->s().size(), 3u);
  EXPECT_EQ(back->graph->find_value("t8")->initializer().strings()[2], "ccc");
  // A second trip is a fixed point of the bytes too.
  EXPECT_EQ(export_onnx_bytes(*back), export_onnx_bytes(*roundtrip(*back)));
}

TEST(OnnxIO, TypedDataFieldsAreRead) {
  onnx::ModelProto mp;
  mp.set_ir_version(8);
  mp.add_opset_import()->set_version(17);
  auto* g = mp.mutable_graph();
  g->set_name("g");
  auto* f = g->add_initializer();
  f->set_name("f");
  f->set_data_type(onnx::TensorProto::FLOAT);
  f->add_dims(2);
  f->add_float_data(1.5f);
  f->add_float_data(-3.f);
  auto* h = g->add_initializer();
  h->set_name("h");
  h->set_data_type(onnx::TensorProto::FLOAT16);
  h->add_dims(1);
  h->add_int32_data(0x3c00);  // 1.0 in half precision
  auto* i8 = g->add_initializer();
  i8->set_name("i8");
  i8->set_data_type(onnx::TensorProto::INT8);
  i8->add_dims(2);
  i8->add_int32_data(-5);
  i8->add_int32_data(7);
  auto* u64 = g->add_initializer();
  u64->set_name("u64");
  u64->set_data_type(onnx::TensorProto::UINT64);
  u64->add_uint64_data(uint64_t{1} << 63);  // scalar
  auto* out = g->add_output();
  out->set_name("f");
  auto m = import_onnx_bytes(mp.SerializeAsString(), "typed.onnx", "");
  const Graph& ig = *m->graph;
  EXPECT_EQ(ig.find_value("f")->initializer().data_as<float>()[1], -3.f);
  EXPECT_EQ(ig.find_value("h")->initializer().data_as<uint16_t>()[0], 0x3c00);
  EXPECT_EQ(ig.find_value("i8")->initializer().data_as<int8_t>()[0], -5);
  EXPECT_EQ(ig.find_value("u64")->initializer().data_as<uint64_t>()[0], uint64_t{1} << 63);
  EXPECT_EQ(ig.find_value("u64")->initializer().rank(), 0);
}

TEST(OnnxIO, ExternalDataWritesNextToModelAndReadsBack) {
  fs::path dir = temp_dir("ext");
  auto m = small_model();
  SaveOptions so;
  so.external_data_threshold = 16;  // w (32 bytes) goes out, b (8 bytes) stays inline
  export_onnx_file(*m, (dir / "m.onnx").string(), so);
  ASSERT_TRUE(fs::exists(dir / "m.onnx.data"));
  EXPECT_EQ(fs::file_size(dir / "m.onnx.data"), 32u);
  auto back = import_onnx_file((dir / "m.onnx").string());
  std::string why;
  EXPECT_TRUE(graphs_equal(*m->graph, *back->graph, &why)) << why;
  // The raw protobuf really points at the data file.
  onnx::ModelProto mp;
  std::ifstream in(dir / "m.onnx", std::ios::binary);
  ASSERT_TRUE(mp.ParseFromIstream(&in));
  EXPECT_EQ(mp.graph().initializer(0).data_location(), onnx::TensorProto::EXTERNAL);
  EXPECT_EQ(mp.graph().initializer(1).data_location(), onnx::TensorProto::DEFAULT);
  // Bytes without a folder cannot resolve external data.
  std::string bytes((std::istreambuf_iterator<char>(std::ifstream(dir / "m.onnx", std::ios::binary).rdbuf())),
                    std::istreambuf_iterator<char>());
  EXPECT_THROW(import_onnx_bytes(bytes, "mem.onnx", ""), Error);
  fs::remove_all(dir);
}

TEST(OnnxIO, FailedExportLeavesExistingFileIntact) {
  fs::path dir = temp_dir("atomic");
  auto m = small_model();
  std::string path = (dir / "m.onnx").string();
  export_onnx_file(*m, path);
  auto size = fs::file_size(path);
  EXPECT_THROW(export_onnx_file(*m, dir.string()), Error);  // a directory
  EXPECT_THROW(export_onnx_file(*m, (dir / "missing" / "m.onnx").string()), Error);
  EXPECT_EQ(fs::file_size(path), size);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "m.onnx") << "stray temporary file " << e.path();
  fs::remove_all(dir);
}

TEST(OnnxIO, LocalFunctionsAreInlined) {
  onnx::ModelProto mp;
  mp.set_ir_version(8);
  mp.add_opset_import()->set_version(17);
  auto* op = mp.add_opset_import();
  op->set_domain("my");
  op->set_version(1);
  // my.Scale(X) = Mul(X, Constant(alpha)) with alpha a reference attribute; my.Twice calls it.
  auto* fn = mp.add_functions();
  fn->set_name("Scale");
  fn->set_domain("my");
  fn->add_input("X");
  fn->add_output("Y");
  fn->add_attribute("alpha");
  fn->add_opset_import()->set_version(17);
  auto* c = fn->add_node();
  c->set_op_type("Constant");
  c->add_output("a");
  auto* ca = c->add_attribute();
  ca->set_name("value_float");
  ca->set_type(onnx::AttributeProto::FLOAT);
  ca->set_ref_attr_name("alpha");
  auto* mul = fn->add_node();
  mul->set_op_type("Mul");
  mul->add_input("X");
  mul->add_input("a");
  mul->add_output("Y");
  auto* fn2 = mp.add_functions();
  fn2->set_name("Twice");
  fn2->set_domain("my");
  fn2->add_input("X");
  fn2->add_output("Y");
  auto* call = fn2->add_node();
  call->set_op_type("Scale");
  call->set_domain("my");
  call->add_input("X");
  call->add_output("Y");
  auto* alpha = call->add_attribute();
  alpha->set_name("alpha");
  alpha->set_type(onnx::AttributeProto::FLOAT);
  alpha->set_f(2.f);

  auto* g = mp.mutable_graph();
  g->set_name("g");
  auto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(1);
  auto* n = g->add_node();
  n->set_op_type("Twice");
  n->set_domain("my");
  n->set_name("t");
  n->add_input("x");
  n->add_output("y");
  g->add_output()->set_name("y");

  auto m = import_onnx_bytes(mp.SerializeAsString(), "fn.onnx", "");
  const Graph& ig = *m->graph;
  ASSERT_EQ(ig.num_nodes(), 2u);
  EXPECT_EQ(ig.nodes()[0]->op_type, "Constant");
  EXPECT_FLOAT_EQ(ig.nodes()[0]->attr_float("value_float", 0), 2.f);
  EXPECT_EQ(ig.nodes()[1]->op_type, "Mul");
  EXPECT_EQ(ig.nodes()[1]->input(0)->name(), "x");
  EXPECT_EQ(ig.nodes()[1]->output(0)->name(), "y");

  // A function that calls itself is refused with its name.
  call->set_op_type("Twice");
  try {
    import_onnx_bytes(mp.SerializeAsString(), "rec.onnx", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("function 'Twice'"), std::string::npos) << e.what();
  }
}

TEST(OnnxIO, MissingFileAndDirectoryErrors) {
  try {
    import_onnx_file("/nonexistent/model.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/model.onnx: no such file");
  }
  EXPECT_THROW(import_onnx_file(fs::temp_directory_path().string()), Error);
}

TEST(OnnxIO, RealPyTorchExportsRoundTrip) {
  // Fixtures exported by PyTorch 1.13 (tests/data/make_torch_fixtures.py).
  for (const char* name : {"torch_small_cnn.onnx", "torch_small_cnn_train.onnx"}) {
    std::string path = cat(ONNXTRAIN_SOURCE_DIR, "/tests/data/", name);
    auto m = import_onnx_file(path);
    EXPECT_EQ(m->producer_name, "pytorch");
    ASSERT_EQ(m->graph->inputs().size(), 1u);
    EXPECT_EQ(format_type(m->graph->inputs()[0]->type), "[batch,1,8,8] f32");
    auto back = roundtrip(*m);
    std::string why;
    EXPECT_TRUE(models_equal(*m, *back, &why)) << name << ": " << why;
    onnx::ModelProto proto;
    ASSERT_TRUE(proto.ParseFromString(export_onnx_bytes(*back)));
    EXPECT_NO_THROW(onnx::checker::check_model(proto)) << name;
  }
}

}  // namespace
}  // namespace onnxtrain::graph
