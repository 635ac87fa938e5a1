// Lane planning: how a set of reduced axes becomes one or more [outer, n, inner] stages.
#include "ops/reduce/reduce_engine.h"

#include "ops/shape_util.h"

namespace onnxtrain::ops::reduce {

namespace {

int64_t product(std::span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

}  // namespace

Lanes lanes_around(std::span<const int64_t> dims, int64_t axis) {
  const auto a = static_cast<size_t>(axis);
  return Lanes{product(dims.first(a)), dims[a], product(dims.subspan(a + 1))};
}

Lanes lanes_split(std::span<const int64_t> dims, int64_t axis) {
  const auto a = static_cast<size_t>(axis);
  return Lanes{product(dims.first(a)), product(dims.subspan(a)), 1};
}

ReducePlan plan_reduce(std::span<const int64_t> dims, std::span<const int64_t> axes, bool keepdims,
                       const std::string& where) {
  const auto rank = static_cast<int64_t>(dims.size());
  std::vector<bool> reduced(dims.size(), false);
  for (int64_t a : axes) {
    const auto k = static_cast<size_t>(normalize_axis(a, rank, where));
    OT_CHECK(!reduced[k], where, ": axis ", a, " is listed twice");
    reduced[k] = true;
  }
  ReducePlan plan;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (!reduced[k])
      plan.out_dims.push_back(dims[k]);
    else if (keepdims)
      plan.out_dims.push_back(1);
  }
  // Groups: runs of kept / reduced dims merged; size-1 dims belong to neither and vanish.
  struct Group {
    int64_t size;
    bool reduced;
  };
  std::vector<Group> groups;
  auto push = [&groups](Group g) {
    if (!groups.empty() && groups.back().reduced == g.reduced)
      groups.back().size *= g.size;
    else
      groups.push_back(g);
  };
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] != 1) push({dims[k], reduced[k]});
    if (reduced[k]) plan.reduced_count *= dims[k];
  }
  auto total = [&groups](size_t begin, size_t end) {
    int64_t p = 1;
    for (size_t g = begin; g < end; ++g) p *= groups[g].size;
    return p;
  };
  for (;;) {
    size_t pick = groups.size();
    for (size_t g = 0; g < groups.size(); ++g)
      if (groups[g].reduced && (pick == groups.size() || groups[g].size > groups[pick].size))
        pick = g;
    if (pick == groups.size()) break;
    plan.stages.push_back(Lanes{total(0, pick), groups[pick].size, total(pick + 1, groups.size())});
    std::vector<Group> rest;
    std::swap(rest, groups);
    rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(pick));
    for (const Group& g : rest) push(g);
  }
  if (plan.stages.empty()) plan.stages.push_back(Lanes{total(0, groups.size()), 1, 1});
  return plan;
}

}  // namespace onnxtrain::ops::reduce
