// Harness of the hostile-input tests: child processes under a watchdog, hostile proto builders,
// and the fixture's assertions (see hostile_harness.h).
#include "tests/hostile/hostile_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace onnxtrain::hostile {

// ---------------------------------------------------------------- bounded child processes

std::string ChildResult::describe() const {
  return cat(exited ? cat("exit code ", code) : cat("killed by signal ", signal),
             killed_for.empty() ? "" : cat(" (watchdog: ", killed_for, ")"), ", peak RSS ",
             max_rss_kb / 1024, " MiB\nstdout: ", out.substr(0, 2000),
             "\nstderr: ", err.substr(0, 4000));
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

const std::string kOnnxdump = ONNXTRAIN_BIN_DIR "/onnxdump";

long resident_kb(pid_t pid) {
  std::ifstream in(cat("/proc/", pid, "/statm"));
  long size = 0, resident = 0;
  in >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

}  // namespace

ChildResult wait_bounded(pid_t pid, int seconds) {
  ChildResult r;
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  rusage ru{};
  for (;;) {
    pid_t got = wait4(pid, &status, WNOHANG, &ru);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) {
      r.killed_for = cat("wait4 failed: ", std::strerror(errno));
      return r;
    }
    if (r.killed_for.empty()) {
      long rss = resident_kb(pid);
      auto elapsed = std::chrono::steady_clock::now() - start;
      if (rss > kMaxChildRssKb)
        r.killed_for = cat("resident memory ", rss / 1024, " MiB over the limit");
      else if (elapsed > std::chrono::seconds(seconds))
        r.killed_for = cat("still running after ", seconds, " s");
      if (!r.killed_for.empty()) kill(pid, SIGKILL);
    }
    usleep(2000);
  }
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r.max_rss_kb = ru.ru_maxrss;
  return r;
}

ChildResult run_forked(const std::function<std::string()>& body, const fs::path& scratch,
                       int seconds) {
  fs::path out_path = scratch / "child.out";
  std::error_code ec;
  fs::remove(out_path, ec);  // a child killed before writing must not report its predecessor's
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return ChildResult{false, -1, 0, 0, "fork failed", "", ""};
  if (pid == 0) {
    std::string s;
    try {
      s = body();
    } catch (...) {
      s = "body threw";
    }
    {
      std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
      out << s;
    }
    _exit(0);
  }
  ChildResult r = wait_bounded(pid, seconds);
  r.out = slurp(out_path);
  return r;
}

ChildResult run_onnxdump(const Strings& args, const fs::path& scratch) {
  fs::path out_path = scratch / "stdout.txt", err_path = scratch / "stderr.txt";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv{const_cast<char*>(kOnnxdump.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, kOnnxdump.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return ChildResult{false, -1, 0, 0, cat("spawn failed: ", std::strerror(rc)), "", ""};
  ChildResult r = wait_bounded(pid, kChildSeconds);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

std::string load_outcome(const std::function<void()>& load) {
  try {
    load();
    return "O";
  } catch (const Error& e) {
    return std::string("E") + e.what();
  } catch (const std::exception& e) {
    return std::string("X") + e.what();
  }
}

// ---------------------------------------------------------------- hostile protos

std::string raw_floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void set_tensor_type(onnx::ValueInfoProto* vi, const std::string& name, int elem_type,
                     const std::vector<int64_t>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, const Strings& inputs,
                          const Strings& outputs, const std::string& name,
                          const std::string& domain) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  n->set_domain(domain);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

onnx::GraphProto* add_graph_attr(onnx::NodeProto* n, const std::string& name) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  return a->mutable_g();
}

onnx::TensorProto* add_initializer(onnx::GraphProto* g, const std::string& name, int dtype,
                                   const std::vector<int64_t>& dims) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(dtype);
  for (int64_t d : dims) t->add_dims(d);
  return t;
}

onnx::ModelProto empty_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("hostile_test");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  m.mutable_graph()->set_name("g");
  return m;
}

onnx::ModelProto add_model() {
  onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {4});
  add_initializer(g, "w", onnx::TensorProto::FLOAT, {4})->set_raw_data(raw_floats({1, 2, 3, 4}));
  add_node(g, "Add", {"x", "w"}, {"y"}, "add");
  set_tensor_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {4});
  return m;
}

onnx::ModelProto external_model(const char* location, const char* offset, const char* length,
                                const std::vector<int64_t>& dims) {
  onnx::ModelProto m = add_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_raw_data();
  w->clear_dims();
  for (int64_t d : dims) w->add_dims(d);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add_kv = [&](const char* key, const char* value) {
    if (!value) return;
    auto* kv = w->add_external_data();
    kv->set_key(key);
    kv->set_value(value);
  };
  add_kv("location", location);
  add_kv("offset", offset);
  add_kv("length", length);
  return m;
}

onnx::FunctionProto* add_function(onnx::ModelProto& m, const std::string& name) {
  if (m.opset_import_size() < 2) {
    auto* op = m.add_opset_import();
    op->set_domain("local");
    op->set_version(1);
  }
  auto* f = m.add_functions();
  f->set_name(name);
  f->set_domain("local");
  f->add_input("a");
  f->add_output("b");
  auto* op = f->add_opset_import();
  op->set_domain("");
  op->set_version(17);
  return f;
}

onnx::ModelProto rich_model() {
  onnx::ModelProto m = add_model();
  auto* g = m.mutable_graph();
  g->mutable_node(0)->set_output(0, "s");
  g->mutable_output(0)->set_name("out");
  set_tensor_type(g->add_input(), "cond", onnx::TensorProto::BOOL, {});
  auto* k = add_initializer(g, "k", onnx::TensorProto::INT64, {2});
  k->add_int64_data(1);
  k->add_int64_data(2);
  auto* c = add_node(g, "Constant", {}, {"half"}, "c");
  auto* value = c->add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  value->mutable_t()->add_dims(1);
  value->mutable_t()->add_float_data(0.5f);
  add_node(g, "Mul", {"s", "half"}, {"m"}, "mul");
  auto* iff = add_node(g, "If", {"cond"}, {"r"}, "if");
  auto* then_g = add_graph_attr(iff, "then_branch");
  then_g->set_name("then");
  add_node(then_g, "Identity", {"m"}, {"t1"}, "then_id");
  then_g->add_output()->set_name("t1");
  auto* else_g = add_graph_attr(iff, "else_branch");
  else_g->set_name("else");
  add_node(else_g, "Neg", {"m"}, {"e1"}, "else_neg");
  else_g->add_output()->set_name("e1");
  add_node(g, "Double", {"r"}, {"out"}, "call", "local");
  set_tensor_type(g->add_value_info(), "s", onnx::TensorProto::FLOAT, {4});
  auto* f = add_function(m, "Double");
  auto* body = f->add_node();
  body->set_op_type("Add");
  body->add_input("a");
  body->add_input("a");
  body->add_output("b");
  return m;
}

namespace {

// Fills `g` (at subgraph depth `level`) with an If whose then_branch nests down to `levels`.
void fill_if_chain(onnx::GraphProto* g, int level, int levels) {
  g->set_name(cat("level", level));
  std::string out = cat("y", level);
  if (level == levels) {
    add_node(g, "Identity", {"x"}, {out}, cat("id", level));
  } else {
    auto* n = add_node(g, "If", {"cond"}, {out}, cat("if", level));
    fill_if_chain(add_graph_attr(n, "then_branch"), level + 1, levels);
    auto* else_g = add_graph_attr(n, "else_branch");
    else_g->set_name(cat("else", level));
    add_node(else_g, "Identity", {"x"}, {cat("e", level)}, cat("else_id", level));
    else_g->add_output()->set_name(cat("e", level));
  }
  g->add_output()->set_name(out);
}

}  // namespace

onnx::ModelProto nested_if_model(int levels) {
  onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  set_tensor_type(g->add_input(), "cond", onnx::TensorProto::BOOL, {});
  set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {1});
  fill_if_chain(g, 0, levels);
  g->set_name("g");
  return m;
}

onnx::ModelProto model_with_w(int dtype, const std::vector<int64_t>& dims) {
  onnx::ModelProto m = add_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_raw_data();
  w->clear_dims();
  w->set_data_type(dtype);
  for (int64_t d : dims) w->add_dims(d);
  return m;
}

std::vector<float> floats_of(const graph::Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

// ---------------------------------------------------------------- fixture

void Hostile::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  root_ = fs::temp_directory_path() / cat("onnxtrain_hostile_", getpid(), "_", info->name());
  fs::remove_all(root_);
  dir_ = root_ / "model";
  fs::create_directories(dir_);
  fs::create_directories(root_ / "outside");
  // Data a loader that followed an escaping path would read "successfully".
  write_file(root_ / "secret.bin", raw_floats({9, 9, 9, 9}));
  write_file(root_ / "x", raw_floats({9, 9, 9, 9}));
  write_file(root_ / "outside" / "secret.bin", raw_floats({9, 9, 9, 9}));
  write_file(dir_ / "w.bin", raw_floats({1, 2, 3, 4}));
}

void Hostile::TearDown() {
  std::error_code ec;
  fs::remove_all(root_, ec);
}

void Hostile::write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

std::string Hostile::write_model(const onnx::ModelProto& m, const std::string& name) {
  std::string bytes;
  EXPECT_TRUE(m.SerializeToString(&bytes));
  write_file(dir_ / name, bytes);
  return (dir_ / name).string();
}

ChildResult Hostile::api_load(const std::string& path, const graph::LoadOptions& opts) {
  return run_forked([&] { return load_outcome([&] { graph::import_onnx_file(path, opts); }); },
                    root_);
}

void Hostile::expect_rejected(const std::string& path, const Strings& fragments,
                              const graph::LoadOptions& opts, bool run_cli) {
  SCOPED_TRACE(path);
  ChildResult api = api_load(path, opts);
  std::string msg;
  if (!api.exited || api.code != 0 || !api.within_limits()) {
    ADD_FAILURE() << "API load crashed or ran out of bounds: " << api.describe();
  } else if (api.out.empty() || api.out[0] != 'E') {
    ADD_FAILURE() << "expected onnxtrain::Error, got: " << api.out;
  } else {
    msg = api.out.substr(1);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message does not start with the file: " << msg;
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
  if (run_cli) expect_cli_error(path, fragments, msg);
}

void Hostile::expect_cli_error(const std::string& path, const Strings& fragments,
                               const std::string& api_msg) {
  SCOPED_TRACE("onnxdump " + path);
  ChildResult r = run_onnxdump({path}, root_);
  ASSERT_TRUE(r.exited) << r.describe();
  EXPECT_TRUE(r.within_limits()) << r.describe();
  EXPECT_EQ(r.code, 1) << r.describe();
  EXPECT_EQ(r.out, "") << "no partial output on error";
  const std::string prefix = "onnxdump: error: ";
  EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "stderr is not exactly one line: " << r.err;
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  for (const auto& f : fragments)
    EXPECT_NE(r.err.find(f), std::string::npos) << "'" << f << "' not in: " << r.err;
  if (!api_msg.empty()) {
    EXPECT_EQ(r.err, prefix + api_msg + "\n");
  }
}

void Hostile::expect_cli_ok(const std::string& path) {
  ChildResult r = run_onnxdump({path}, root_);
  EXPECT_TRUE(r.exited && r.code == 0 && r.within_limits()) << r.describe();
  EXPECT_FALSE(r.out.empty());
  EXPECT_EQ(r.err, "");
}

}  // namespace onnxtrain::hostile
