// The C++ side of `import onnxtrain` (python/onnxtrain/__init__.py holds the Keras-like API):
//   _train(args, quiet) -> (epochs, stopped_by_signal): onnxtrain's own command line
//       (tools/train_args.h) run in-process, the GIL released while it trains; epochs is one
//       dict per finished epoch (the metrics JSON's fields).
//   _run(model, inputs, threads) -> {output name: ndarray}: the model forward on NumPy arrays.
//   _inputs(model) -> [(name, dtype, dims)]: the inputs a caller must feed (no initializer).
// onnxtrain errors become RuntimeError, command-line errors ValueError, with onnxtrain's message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/onnx_io.h"
#include "graph/tensor.h"
#include "passes/passes.h"
#include "runtime/device/device.h"
#include "runtime/session.h"
#include "tools/inference_prep.h"
#include "tools/train_args.h"
#include "tools/train_loop.h"

namespace py = pybind11;

namespace onnxtrain::python {
namespace {

using graph::DataType;
using graph::Tensor;

// NumPy arrays through NumPy's Python API and the buffer protocol (not pybind11's numpy.h, whose
// dtype struct offsets predate NumPy 2): dtypes by name, data by py::buffer.
struct NumpyType {
  const char* name;
  DataType dtype;
};
constexpr NumpyType kNumpyTypes[] = {
    {"float32", DataType::kFloat}, {"float64", DataType::kDouble}, {"float16", DataType::kFloat16},
    {"int64", DataType::kInt64},   {"int32", DataType::kInt32},    {"int8", DataType::kInt8},
    {"uint8", DataType::kUInt8},   {"bool", DataType::kBool},
};

Tensor to_tensor(const std::string& name, const py::handle& obj) {
  py::module_ np = py::module_::import("numpy");
  py::object a = np.attr("ascontiguousarray")(obj);
  const std::string type = py::cast<std::string>(a.attr("dtype").attr("name"));
  DataType dtype = DataType::kUndefined;
  for (const NumpyType& t : kNumpyTypes)
    if (type == t.name) dtype = t.dtype;
  if (dtype == DataType::kUndefined)
    throw py::type_error("input '" + name + "': NumPy dtype " + type +
                         " is not supported (float32/64/16, int64/32/8, uint8, bool)");
  Tensor t(dtype, py::cast<std::vector<int64_t>>(a.attr("shape")));
  const py::buffer_info info = py::buffer(a).request();
  OT_CHECK(static_cast<size_t>(info.size * info.itemsize) == t.nbytes(), "input '", name, "': ",
           info.size * info.itemsize, " bytes for ", t.nbytes());
  if (t.nbytes()) std::memcpy(t.mutable_data(), info.ptr, t.nbytes());
  return t;
}

py::object to_numpy(const Tensor& t) {
  const char* type = nullptr;
  for (const NumpyType& n : kNumpyTypes)
    if (t.dtype() == n.dtype) type = n.name;
  if (!type)
    throw std::runtime_error(cat("output dtype ", graph::dtype_short_name(t.dtype()),
                                 " has no NumPy equivalent here"));
  py::object a = py::module_::import("numpy").attr("empty")(py::cast(t.dims()), type);
  const py::buffer_info info = py::buffer(a).request(true);
  if (t.nbytes()) std::memcpy(info.ptr, t.data(), t.nbytes());
  return a;
}

py::object optional_number(const std::optional<double>& v) {
  return v ? py::object(py::float_(*v)) : py::object(py::none());
}

py::tuple train(const std::vector<std::string>& args, bool quiet) {
  std::vector<const char*> argv = {"onnxtrain"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  tools::Args a;
  try {
    a = tools::parse_train_args(static_cast<int>(argv.size()), argv.data());
  } catch (const tools::UsageError& e) {
    throw py::value_error(e.what());
  }
  std::FILE* devnull = quiet ? std::fopen("/dev/null", "w") : nullptr;
  a.config.log = devnull ? devnull : stdout;
  a.config.live = false;
  tools::TrainResult r;
  try {
    py::gil_scoped_release release;
    r = tools::run_training(a.config);
  } catch (...) {
    if (devnull) std::fclose(devnull);
    throw;
  }
  if (devnull) std::fclose(devnull);
  std::fflush(stdout);
  py::list epochs;
  for (const tools::EpochMetrics& m : r.epochs) {
    py::dict d;
    d["epoch"] = m.epoch;
    d["steps"] = m.steps;
    d["seconds"] = m.seconds;
    d["samples_per_sec"] = static_cast<double>(m.examples) / std::max(m.seconds, 1e-9);
    d["loss"] = m.loss;
    d["accuracy"] = optional_number(m.accuracy);
    d["val_loss"] = optional_number(m.val_loss);
    d["val_accuracy"] = optional_number(m.val_accuracy);
    epochs.append(d);
  }
  return py::make_tuple(epochs, r.stopped_by_signal);
}

py::dict run(const std::string& path, const py::dict& inputs, int threads,
             const std::string& conv_algorithm, const std::string& precision,
             bool allow_emulation) {
  const std::optional<passes::ConvAlgorithm> algo = passes::parse_conv_algorithm(conv_algorithm);
  OT_CHECK(algo, "conv_algorithm '", conv_algorithm, "': expected direct or winograd");
  const std::optional<graph::DataType> dtype = runtime::parse_precision(precision);
  OT_CHECK(dtype, "precision '", precision, "': expected fp32, bf16 or fp16");
  std::map<std::string, Tensor> feeds;
  for (const auto& [k, v] : inputs) {
    const std::string name = py::str(k);
    feeds[name] = to_tensor(name, v);
  }
  std::vector<Tensor> outs;
  std::vector<std::string> names;
  {
    py::gil_scoped_release release;
    std::unique_ptr<graph::Model> model = graph::import_onnx_file(path);
    for (const graph::Value* v : model->graph->outputs()) names.push_back(v->name());
    std::string missing;
    for (const graph::Value* v : model->graph->inputs())
      if (!v->has_initializer() && !feeds.count(v->name()))
        missing += cat(missing.empty() ? "" : ", ", "'", v->name(), "'");
    OT_CHECK(missing.empty(), path, ": missing inputs: ", missing);
    runtime::SessionOptions opts;
    opts.device = runtime::cpu_device();
    opts.threads = threads;
    tools::prepare_inference(*model, *opts.device,
                             {.precision = *dtype, .allow_emulation = allow_emulation,
                              .conv_algorithm = *algo},
                             path);
    runtime::InferenceSession session(std::move(model), opts);
    outs = session.run(feeds);
  }
  py::dict result;
  for (size_t i = 0; i < outs.size(); ++i) result[py::str(names[i])] = to_numpy(outs[i]);
  return result;
}

py::list inputs(const std::string& path) {
  std::unique_ptr<graph::Model> model = graph::import_onnx_file(path);
  py::list out;
  for (const graph::Value* v : model->graph->inputs()) {
    if (v->has_initializer()) continue;
    py::list dims;
    if (v->type.is_tensor() && v->type.shape)
      for (const graph::Dim& d : *v->type.shape)
        dims.append(d.is_known() ? py::object(py::int_(d.value)) : py::object(py::none()));
    out.append(py::make_tuple(v->name(), std::string(graph::dtype_short_name(v->type.dtype)), dims));
  }
  return out;
}

}  // namespace
}  // namespace onnxtrain::python

PYBIND11_MODULE(_onnxtrain, m) {
  m.doc() = "onnxtrain's C++ runtime (use the onnxtrain package's Trainer and run)";
  m.def("_train", &onnxtrain::python::train, py::arg("args"), py::arg("quiet") = false);
  m.def("_run", &onnxtrain::python::run, py::arg("model"), py::arg("inputs"),
        py::arg("threads") = 0, py::arg("conv_algorithm") = "direct",
        py::arg("precision") = "fp32", py::arg("allow_emulation") = false);
  m.def("_inputs", &onnxtrain::python::inputs, py::arg("model"));
  m.attr("usage") = onnxtrain::tools::kTrainUsage;
#ifdef ONNXTRAIN_VERSION
  m.attr("__version__") = ONNXTRAIN_VERSION;
#endif
}
