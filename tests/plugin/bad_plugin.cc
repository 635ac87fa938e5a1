// Small custom-op libraries for the loader's error cases, one MODULE per BAD_PLUGIN_KIND:
//   1 no entry point          2 built against another op API version
//   3 clashes with a built-in (ai.onnx Relu)
//   4 registers my.test4.Square, then clashes with the example's my.ops.ScaledTanh
//   5 registers my.test5.Square, then its register function throws
//   6 a valid library whose op my.test.Square has no gradient rule
//   7 registers my.test7.Square at load time with ONNXTRAIN_REGISTER_OP
#include <memory>
#include <stdexcept>

#include "ops/plugin_api.h"

namespace bad_plugin {
namespace {

using onnxtrain::ops::InferenceContext;
using onnxtrain::ops::Kernel;
using onnxtrain::ops::KernelContext;
using onnxtrain::ops::OpRegistry;
using onnxtrain::ops::OpSchema;

// x: (any) f32 -> y: same; y = x * x
class SquareKernel final : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const auto* x = ctx.input(0);
    auto& y = ctx.output(0, x->dims);
    for (int64_t i = 0; i < x->numel(); ++i)
      y.as<float>()[i] = x->as<float>()[i] * x->as<float>()[i];
  }
};

OpSchema square(const char* domain, const char* op_type) {
  OpSchema s;
  s.domain = domain;
  s.op_type = op_type;
  s.infer = [](InferenceContext& ctx) {
    ctx.output_types.resize(1);
    ctx.output_types[0] = *ctx.input_type(0);
  };
  s.cpu_kernel = [](const onnxtrain::graph::Node&) -> std::unique_ptr<Kernel> {
    return std::make_unique<SquareKernel>();
  };
  return s;
}

[[maybe_unused]] void register_ops(OpRegistry& r) {
#if BAD_PLUGIN_KIND == 3
  r.add(square("", "Relu"));
#elif BAD_PLUGIN_KIND == 4
  r.add(square("my.test4", "Square"));
  r.add(square("my.ops", "ScaledTanh"));
#elif BAD_PLUGIN_KIND == 5
  r.add(square("my.test5", "Square"));
  throw std::runtime_error("boom: the register function failed on purpose");
#else
  r.add(square("my.test", "Square"));
#endif
}

}  // namespace
}  // namespace bad_plugin

#if BAD_PLUGIN_KIND == 7
ONNXTRAIN_REGISTER_OP(bad_plugin_static) {
  return bad_plugin::square("my.test7", "Square");
}
#endif

#if BAD_PLUGIN_KIND == 1
extern "C" __attribute__((visibility("default"))) int not_the_entry_point() {
  return 0;
}
#elif BAD_PLUGIN_KIND == 2
// What a library built against a newer op API would hand over.
extern "C" __attribute__((visibility("default"))) const onnxtrain::ops::OpLibraryInfo*
onnxtrain_op_library() {
  static const onnxtrain::ops::OpLibraryInfo info{onnxtrain::ops::kOpApiVersion + 1, 0, "future",
                                                  nullptr};
  return &info;
}
#else
ONNXTRAIN_OP_LIBRARY("bad plugin", bad_plugin::register_ops)
#endif
