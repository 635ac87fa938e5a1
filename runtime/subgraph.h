// Control-flow bodies at run time: a SubgraphRunner is what KernelContext::subgraph hands to an
// If / Loop kernel — it plans the body against the enclosing plan (captured outer values are
// read from its bindings) and caches one nested Plan per input-shape signature.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/ir.h"
#include "ops/op_api.h"

namespace onnxtrain::runtime {

class Plan;

class SubgraphRunner final : public ops::Subgraph {
 public:
  SubgraphRunner(Plan& parent, const graph::Graph& body, std::string where);
  ~SubgraphRunner() override;
  std::vector<graph::Tensor> run(std::span<const graph::Tensor> inputs) override;

 private:
  Plan& parent_;
  const graph::Graph& body_;
  std::string where_;                                   // "If 'n0' then_branch", for errors
  std::vector<int> capture_slots_;                      // the parent's slot of each captured value
  std::map<std::string, std::unique_ptr<Plan>> plans_;  // by input + capture signature
};

}  // namespace onnxtrain::runtime
