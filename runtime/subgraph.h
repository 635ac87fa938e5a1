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

// Values that `body` (and the subgraphs nested in it) reads but that belong to an enclosing
// graph, in first-use order without duplicates.
std::vector<const graph::Value*> captured_values(const graph::Graph& body);

class SubgraphRunner final : public ops::Subgraph {
 public:
  SubgraphRunner(Plan& parent, const graph::Graph& body, std::string where);
  ~SubgraphRunner() override;
  std::vector<graph::Tensor> run(std::span<const graph::Tensor> inputs) override;

 private:
  Plan& parent_;
  const graph::Graph& body_;
  std::string where_;  // "If 'n0' then_branch", for errors
  std::vector<int> capture_slots_;  // the parent's slot of each captured value
  std::map<std::string, std::unique_ptr<Plan>> plans_;  // by input + capture signature
};

}  // namespace onnxtrain::runtime
