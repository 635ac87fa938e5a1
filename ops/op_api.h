// The public op API: what an op registers (type/shape inference, kernels per device, gradient
// rule) and what a kernel sees at run time (KernelContext, with the step's collectives from
// ops/collectives.h). Every built-in op, collectives included, and every custom-op library
// compiles against exactly this header; the runtime implements KernelContext, so kernels never
// include runtime/. Bump kOpApiVersion on any incompatible change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/error.h"
#include "graph/ir.h"
#include "graph/tensor.h"
#include "ops/collectives.h"

namespace onnxtrain::ops {

// 3: KernelContext::subgraph (control-flow ops run their graph attributes through the runtime).
// 4: OpSchema::inplace, KernelContext::random_seed.
// 5: device kernels: KernelContext::host_constant, OpRegistry::add_kernel.
// 6: KernelContext::collectives, KernelContext::defer_completion (collective ops are op kernels).
// 7: OpSchema::packed_inputs.
// 8: OpSchema::view.
inline constexpr int kOpApiVersion = 8;

// The layout OpSchema::packed_inputs asks for, shared by the runtime that places the buffers and
// the kernels that use them as one block: present input k starts packed_input_bytes(bytes of
// each present input before it) after the first one.
inline constexpr size_t kPackedInputAlign = 64;
inline constexpr size_t packed_input_bytes(size_t bytes) {
  return (bytes + kPackedInputAlign - 1) / kPackedInputAlign * kPackedInputAlign;
}

using graph::DataType;

enum class DeviceKind { kCpu = 0, kCuda = 1 };

// A typed view of a tensor the runtime owns: dtype, concrete dims, and a device pointer.
struct TensorView {
  DataType dtype = DataType::kUndefined;
  std::vector<int64_t> dims;
  void* data = nullptr;
  // String tensors (CPU only) keep their elements here instead of `data`.
  std::vector<std::string>* strings = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * graph::dtype_bits(dtype) / 8; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// A graph attribute of the running node (If's branches, Loop's body) made executable by the
// runtime, which plans it like a model: one cached plan per input-shape signature.
class Subgraph {
 public:
  virtual ~Subgraph() = default;
  // Runs the body with inputs[i] bound to its graph input i; values the body captures from
  // enclosing graphs are read as they are at this step. Returns the body's outputs in order.
  virtual std::vector<graph::Tensor> run(std::span<const graph::Tensor> inputs) = 0;
};

// What a kernel sees while it runs. Inputs are read-only; outputs are allocated by the runtime
// from the plan (static shapes) or on request (shapes known only at run time).
class KernelContext {
 public:
  virtual ~KernelContext() = default;
  virtual const graph::Node& node() const = 0;
  // ai.onnx opset version the model imports (kernels use it for version-dependent semantics).
  virtual int64_t opset() const = 0;
  virtual int num_inputs() const = 0;
  // nullptr for an omitted optional input or an index past the end.
  virtual const TensorView* input(int i) const = 0;
  // True when input i holds the same contents at the same address in every run of this plan
  // (an initializer nothing writes, a folded value). Its data is readable already in
  // prepare(), so a kernel may pre-pack it once (oneDNN weight reorders).
  virtual bool input_is_constant(int i) const = 0;
  // Input i on the host when it is constant (input_is_constant), else nullptr. A device kernel's
  // input(i) points at device memory; shape-like inputs (axes, a Reshape target, pads) are read
  // here instead, in prepare() or run(). On the CPU it is input(i).
  virtual const TensorView* host_constant(int i) const {
    return input_is_constant(i) ? input(i) : nullptr;
  }
  virtual int num_outputs() const = 0;
  // True when output i is requested by the graph (not an omitted optional output).
  virtual bool has_output(int i) const = 0;
  // Output i with the given dims: the planned buffer when dims match the plan, a fresh buffer
  // otherwise. Throws for an omitted output.
  virtual TensorView& output(int i, std::span<const int64_t> dims) = 0;
  // Output i with the dims the plan inferred; throws if the plan could not infer them.
  virtual TensorView& output(int i) = 0;
  // Scratch memory on the kernel's device (device memory for a CUDA kernel), 64-byte (CPU) /
  // 256-byte (CUDA) aligned, valid until run() returns. On the CPU every node of a plan shares
  // one workspace (its size is the largest request, not the sum: issue #18), so nothing may
  // read it after run() returns -- a deferred completion uses persistent_scratch(). A larger
  // request in the same run() may move it, so request the total once. A request from prepare()
  // sizes the workspace before the first run.
  virtual void* scratch(size_t bytes) = 0;
  // Scratch owned by this node and kept across runs, for work that outlives run() (AllReduce's
  // packed buffer, read by its deferred completion).
  virtual void* persistent_scratch(size_t bytes) { return scratch(bytes); }
  virtual DeviceKind device() const = 0;
  // The device stream (cudaStream_t on CUDA, nullptr on CPU). CUDA kernels enqueue their work on
  // it and return without synchronizing; the runtime orders steps by the stream.
  virtual void* stream() const = 0;
  // Threads this kernel may use (intra-op budget).
  virtual int num_threads() const = 0;
  // Runs fn(begin, end) over [0, n) split across the intra-op threads; grain = minimum chunk.
  virtual void parallel_for(int64_t n, int64_t grain,
                            const std::function<void(int64_t, int64_t)>& fn) const = 0;
  // The node's graph attribute `attr` (If's then_branch, Loop's body), ready to run. Contexts
  // that cannot run subgraphs (host-side folding) throw.
  virtual Subgraph& subgraph(const std::string& attr) {
    fail(node().describe(), ": cannot run subgraph '", attr, "' in this context");
  }
  // The run's random seed, or 0 when the caller set none. A trainer sets one per step (from
  // --seed, the global step and the replica), so kernels that draw random numbers (Dropout)
  // draw the same ones when a run resumes from a checkpoint.
  virtual uint64_t random_seed() const { return 0; }
  // The step's collectives: the replica's communicator in data-parallel training, nullptr when
  // the session has none (a single replica, inference, host-side folding).
  virtual Collectives* collectives() const { return nullptr; }
  // collectives(), or throws "<node>: no communicator ..." when there is none.
  Collectives& require_collectives() const {
    Collectives* c = collectives();
    OT_CHECK(c, node().describe(),
             ": no communicator (collective ops run only in a data-parallel session)");
    return *c;
  }
  // For asynchronous kernels (AllReduce): the kernel's outputs are complete only once `finish`
  // ran. The runtime calls it on the session's thread before the first node that reads one of
  // those outputs runs, or at the end of the run, in issue order; an Error it throws fails the
  // run. One per run() of a kernel. Contexts without an executor run `finish` at once.
  virtual void defer_completion(std::function<void()> finish) { finish(); }
};

// Thrown by a device kernel's factory or prepare() for a case it does not handle (a dtype, a
// rank, an attribute): the runtime runs the node's CPU kernel instead, staging its inputs and
// outputs through host memory, and lists the node in the plan's fallback count. Not an Error:
// it never reaches a user.
struct DeviceFallback {
  std::string reason;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Once per plan, with the planned input/output shapes known (ctx.input(i)->dims valid, data
  // pointers not yet): create oneDNN primitives / cuDNN descriptors, size workspaces.
  virtual void prepare(KernelContext& ctx) {}
  // Every step.
  virtual void run(KernelContext& ctx) = 0;
};

// Type and shape inference. Input types carry concrete dims at plan time and may carry
// symbolic/unknown dims when passes call it; constant inputs (initializers, folded values)
// are available as tensors so shape-computing inputs (Reshape's shape) can be read.
struct InferenceContext {
  const graph::Node& node;
  int64_t opset = 0;
  std::vector<const graph::ValueType*> input_types;  // nullptr for omitted inputs
  std::vector<const graph::Tensor*> input_values;    // nullptr unless constant
  std::vector<graph::ValueType> output_types;        // to fill, one per node output
  // Optional: values fully determined by the input types (Shape, Size, Constant). The planner
  // treats them as constants, which is how exporter shape subgraphs fold away.
  std::vector<std::optional<graph::Tensor>> output_values;
  // Elements of small int vectors (and scalars) as dims: known values and the symbols of the
  // graph's symbolic dims, e.g. Concat(Shape(x)[0], [16], [96]) = [batch, 16, 96]. Filled by
  // ops::run_inference for the shape-subgraph ops (ops/infer.h); Reshape reads its target from
  // it, so a dynamic-batch export's views keep every dim but the batch static. nullptr / nullopt
  // where unknown. Callers that do not track them leave the inputs empty.
  std::vector<const graph::Shape*> input_dim_values = {};
  std::vector<std::optional<graph::Shape>> output_dim_values = {};
  // The ai.onnx opset the model imports (what KernelContext::opset() returns); 0 = `opset`.
  // ai.onnxtrain grad ops that copy a forward op's semantics read it through onnx_opset().
  int64_t default_opset = 0;
  int64_t onnx_opset() const { return default_opset > 0 ? default_opset : opset; }

  const graph::ValueType* input_type(size_t i) const {
    return i < input_types.size() ? input_types[i] : nullptr;
  }
  const graph::Tensor* input_value(size_t i) const {
    return i < input_values.size() ? input_values[i] : nullptr;
  }
  const graph::Shape* input_dim_value(size_t i) const {
    return i < input_dim_values.size() ? input_dim_values[i] : nullptr;
  }
  // "Conv 'name': " prefix for errors.
  std::string where() const;
};

using InferFn = std::function<void(InferenceContext&)>;
using KernelFactory = std::function<std::unique_ptr<Kernel>(const graph::Node&)>;

// What an op's gradient rule sees. Autodiff calls the rule once for every forward node on a
// path from a trainable parameter to the loss, in reverse topological order. The rule reads
// the gradients of the node's outputs and emits backward nodes (standard ONNX ops where they
// exist, ai.onnxtrain grad ops such as ConvGrad otherwise) that compute the gradients of the
// inputs autodiff asks for. Shapes of emitted values need not be set: autodiff infers each node
// as it is emitted (a rule may read its type), and at plan time every dim is concrete.
// Rules must not depend on static shapes (the batch dim is usually symbolic): read shapes at
// run time with Shape, or use ai.onnxtrain.SumToShapeOf for broadcast reductions.
class GradientBuilder {
 public:
  virtual ~GradientBuilder() = default;
  virtual const graph::Node& node() const = 0;
  // ai.onnx opset version the model imports.
  virtual int64_t opset() const = 0;
  // Forward values (backward nodes may read them; autodiff keeps them alive).
  graph::Value* input(int i) const { return node().input(static_cast<size_t>(i)); }
  graph::Value* output(int i) const { return node().output(static_cast<size_t>(i)); }
  int num_inputs() const { return static_cast<int>(node().inputs().size()); }
  int num_outputs() const { return static_cast<int>(node().outputs().size()); }
  // dLoss/d(output i), same shape and dtype as output i; nullptr when no gradient reaches it
  // (an output that does not lead to the loss). At least one output has a gradient.
  virtual graph::Value* output_grad(int i) const = 0;
  // True when autodiff wants dLoss/d(input i): a float input on a path from a trainable
  // parameter. Integer inputs (indices, shapes) never need one.
  virtual bool needs_input_grad(int i) const = 0;
  // Records dLoss/d(input i) (same shape and dtype as input i). Ignored for inputs that need
  // no gradient. Autodiff sums the contributions of every use of a value.
  virtual void set_input_grad(int i, graph::Value* grad) = 0;
  // Emits a backward node and returns its num_outputs outputs (fresh names derived from the
  // forward node's name). A nullptr input is an omitted optional input.
  virtual std::vector<graph::Value*> emit(const std::string& op_type,
                                          const std::vector<graph::Value*>& inputs,
                                          int num_outputs,
                                          std::vector<graph::Attribute> attributes = {},
                                          const std::string& domain = "") = 0;
  graph::Value* emit1(const std::string& op_type, const std::vector<graph::Value*>& inputs,
                      std::vector<graph::Attribute> attributes = {},
                      const std::string& domain = "") {
    return emit(op_type, inputs, 1, std::move(attributes), domain)[0];
  }
  // A constant value (an initializer that is never trained), e.g. a scalar 1 or an axes list.
  virtual graph::Value* constant(graph::Tensor value, const std::string& name_hint) = 0;
};

// Domain of onnxtrain's own ops (grad ops, SGD, AllReduce, ...).
inline constexpr const char* kOnnxtrainDomain = "ai.onnxtrain";
// Domain of ONNX's training ops (Adam, Momentum, Adagrad, Gradient), opset 1.
inline constexpr const char* kPreviewTrainingDomain = "ai.onnx.preview.training";

using GradientFn = std::function<void(GradientBuilder&)>;

struct OpSchema {
  std::string domain;  // "" = ai.onnx
  std::string op_type;
  int since_version = 1;  // first opset this registration serves (inclusive)
  int until_version = 1 << 30;  // last opset it serves (inclusive)
  InferFn infer;
  KernelFactory cpu_kernel;
  KernelFactory cuda_kernel;
  // Reverse-mode rule; empty for ops that are not differentiable (autodiff then names the op
  // when it lies on a path to the loss).
  GradientFn gradient;
  // True when the op's result may be computed once at plan time from constant inputs.
  bool foldable = true;
  // The input whose buffer output `output` of `node` may share (the kernel reads element i of
  // every input before it writes element i of that output), or -1. The runtime uses it to
  // update training state in place (an optimizer writes the new weight over the old one).
  std::function<int(const graph::Node& node, int output)> inplace;
  // True when `node` works on its present inputs as one block (AllReduce: a gradient bucket
  // reduced in place). The runtime then places them back to back in the packed layout above,
  // each output k over input k, when it can: every input is an intermediate read by no later
  // node and every output a same-sized intermediate. Otherwise the buffers are placed as usual,
  // and the kernel, which compares the pointers, packs a copy itself.
  std::function<bool(const graph::Node& node)> packed_inputs;
  // True when output 0, whenever it has as many bytes as input 0, holds input 0's elements
  // unchanged and in order (a relabeling of the shape: Reshape, Flatten, Squeeze, Unsqueeze,
  // Identity always; SumToShapeOf when nothing is summed), and every kernel of the op then skips
  // its copy when the two buffers are one. The runtime may place such an output over its input
  // (a view: no copy, one buffer live as long as both values).
  bool view = false;
};

// The process-wide registry. Keyed by (domain, op_type, opset range); device kernels attach to
// an existing entry through add_kernel (ONNXTRAIN_REGISTER_KERNEL), from their own files.
class OpRegistry {
 public:
  static OpRegistry& global();
  // Throws when the (domain, op_type) range overlaps an existing registration.
  void add(OpSchema schema);
  const OpSchema* find(const std::string& domain, const std::string& op_type, int64_t opset) const;
  OpSchema* mutable_find(const std::string& domain, const std::string& op_type, int64_t opset);
  std::vector<const OpSchema*> all() const;
  // Attaches a kernel for `device` to every registration of (domain, op_type) whose opset range
  // meets [since, until]. Device kernels register from their own files' static registrars, which
  // may run before the op's: the request waits and is applied on the next lookup, where one that
  // matches no registration throws Error naming it.
  void add_kernel(const std::string& domain, const std::string& op_type, DeviceKind device,
                  KernelFactory factory, int since = 1, int until = 1 << 30);

 private:
  struct PendingKernel {
    std::string domain, op_type;
    DeviceKind device;
    KernelFactory factory;
    int since, until;
  };
  void apply_pending() const;
  std::vector<std::unique_ptr<OpSchema>> schemas_;
  mutable std::vector<PendingKernel> pending_;
};

// Static registration: ONNXTRAIN_REGISTER_OP(relu) { return OpSchema{...}; }
struct OpRegistrar {
  explicit OpRegistrar(OpSchema (*make)()) { OpRegistry::global().add(make()); }
};
#define ONNXTRAIN_REGISTER_OP(id)                                               \
  static ::onnxtrain::ops::OpSchema onnxtrain_make_op_##id();                   \
  static ::onnxtrain::ops::OpRegistrar onnxtrain_registrar_##id(&onnxtrain_make_op_##id); \
  static ::onnxtrain::ops::OpSchema onnxtrain_make_op_##id()

// Static device-kernel registration, e.g. in a .cu file:
//   ONNXTRAIN_REGISTER_KERNEL(relu_cuda, "", "Relu", kCuda) { return std::make_unique<K>(n); }
#define ONNXTRAIN_REGISTER_KERNEL(id, domain, op_type, device)                              \
  static std::unique_ptr<::onnxtrain::ops::Kernel> onnxtrain_make_kernel_##id(             \
      const ::onnxtrain::graph::Node& n);                                                   \
  static const bool onnxtrain_kernel_registered_##id = [] {                                 \
    ::onnxtrain::ops::OpRegistry::global().add_kernel(                                      \
        domain, op_type, ::onnxtrain::ops::DeviceKind::device, &onnxtrain_make_kernel_##id); \
    return true;                                                                            \
  }();                                                                                      \
  static std::unique_ptr<::onnxtrain::ops::Kernel> onnxtrain_make_kernel_##id(             \
      [[maybe_unused]] const ::onnxtrain::graph::Node& n)

}  // namespace onnxtrain::ops
