// The op registry: one entry per (domain, op_type, opset range).
#include <algorithm>
#include <mutex>

#include "ops/op_api.h"

namespace onnxtrain::ops {

namespace {
bool same_domain(const std::string& a, const std::string& b) {
  auto norm = [](const std::string& d) { return d == "ai.onnx" ? std::string() : d; };
  return norm(a) == norm(b);
}
}  // namespace

std::string InferenceContext::where() const { return node.describe(); }

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = new OpRegistry();  // never destroyed: used by static registrars
  return *registry;
}

void OpRegistry::add(OpSchema schema) {
  OT_CHECK(!schema.op_type.empty(), "op registry: registration without an op_type");
  OT_CHECK(schema.since_version <= schema.until_version, "op registry: ", schema.op_type,
           ": empty opset range");
  for (const auto& s : schemas_) {
    bool overlap = same_domain(s->domain, schema.domain) && s->op_type == schema.op_type &&
                   s->since_version <= schema.until_version &&
                   schema.since_version <= s->until_version;
    OT_CHECK(!overlap, "op registry: ", schema.domain.empty() ? "" : schema.domain + ".",
             schema.op_type, " (opset ", schema.since_version, "..", schema.until_version,
             ") is already registered");
  }
  schemas_.push_back(std::make_unique<OpSchema>(std::move(schema)));
}

namespace {
std::mutex& pending_mutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
}  // namespace

void OpRegistry::add_kernel(const std::string& domain, const std::string& op_type,
                            DeviceKind device, KernelFactory factory, int since, int until) {
  OT_CHECK(factory, "op registry: ", op_type, ": empty kernel factory");
  std::lock_guard<std::mutex> lock(pending_mutex());
  pending_.push_back({domain, op_type, device, std::move(factory), since, until});
}

void OpRegistry::apply_pending() const {
  std::lock_guard<std::mutex> lock(pending_mutex());
  if (pending_.empty()) return;
  std::vector<PendingKernel> todo;
  todo.swap(pending_);
  for (PendingKernel& k : todo) {
    int matched = 0;
    for (const auto& s : schemas_) {
      if (!same_domain(s->domain, k.domain) || s->op_type != k.op_type ||
          s->until_version < k.since || k.until < s->since_version)
        continue;
      (k.device == DeviceKind::kCuda ? s->cuda_kernel : s->cpu_kernel) = k.factory;
      ++matched;
    }
    OT_CHECK(matched > 0, "op registry: a ", k.device == DeviceKind::kCuda ? "CUDA" : "CPU",
             " kernel for ", k.domain.empty() ? "" : k.domain + ".", k.op_type,
             " matches no registered op");
  }
}

OpSchema* OpRegistry::mutable_find(const std::string& domain, const std::string& op_type,
                                   int64_t opset) {
  apply_pending();
  for (auto& s : schemas_)
    if (same_domain(s->domain, domain) && s->op_type == op_type && s->since_version <= opset &&
        opset <= s->until_version)
      return s.get();
  return nullptr;
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& op_type,
                                 int64_t opset) const {
  return const_cast<OpRegistry*>(this)->mutable_find(domain, op_type, opset);
}

std::vector<const OpSchema*> OpRegistry::all() const {
  apply_pending();
  std::vector<const OpSchema*> out;
  for (const auto& s : schemas_) out.push_back(s.get());
  std::sort(out.begin(), out.end(), [](const OpSchema* a, const OpSchema* b) {
    return std::tie(a->domain, a->op_type, a->since_version) <
           std::tie(b->domain, b->op_type, b->since_version);
  });
  return out;
}

}  // namespace onnxtrain::ops
