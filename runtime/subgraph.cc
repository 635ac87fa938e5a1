// SubgraphRunner: If / Loop bodies planned against the enclosing plan (see subgraph.h).
#include "runtime/subgraph.h"

#include "graph/error.h"
#include "runtime/plan.h"

namespace onnxtrain::runtime {
namespace {

void append_signature(std::string& sig, graph::DataType dt, const std::vector<int64_t>& dims) {
  sig += graph::dtype_short_name(dt);
  for (int64_t d : dims) sig += "," + std::to_string(d);
  sig += ";";
}

}  // namespace

SubgraphRunner::SubgraphRunner(Plan& parent, const graph::Graph& body, std::string where)
    : parent_(parent), body_(body), where_(std::move(where)) {
  for (const graph::Value* v : body.captured_values()) {
    auto it = parent.slot_index_.find(v);
    OT_CHECK(it != parent.slot_index_.end(), where_, ": captured value '", v->name(),
             "' is not available in the enclosing graph");
    capture_slots_.push_back(it->second);
  }
}

SubgraphRunner::~SubgraphRunner() = default;

std::vector<graph::Tensor> SubgraphRunner::run(std::span<const graph::Tensor> inputs) {
  const auto& body_inputs = body_.inputs();
  OT_CHECK(inputs.size() == body_inputs.size(), where_, ": the body takes ", body_inputs.size(),
           " inputs, got ", inputs.size());
  std::map<std::string, const graph::Tensor*> bound;
  std::string sig;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bound[body_inputs[i]->name()] = &inputs[i];
    append_signature(sig, inputs[i].dtype(), inputs[i].dims());
  }
  // Captured dims are baked into a plan too (they may change between runs of the parent).
  sig += "|";
  for (int s : capture_slots_) {
    const ops::TensorView& v = parent_.slots_[s].bind.view;
    append_signature(sig, v.dtype, v.dims);
  }
  auto it = plans_.find(sig);
  if (it == plans_.end()) {
    // A loop whose carried shapes change every iteration would otherwise grow without bound.
    constexpr size_t kMaxCachedPlans = 16;
    if (plans_.size() >= kMaxCachedPlans) plans_.clear();
    it =
        plans_.emplace(sig, std::make_unique<Plan>(parent_.session_, body_, &parent_, bound)).first;
  }
  return it->second->run(bound);
}

}  // namespace onnxtrain::runtime
