// Learning-rate schedules and their spec parser (lr_schedule.h).
#include "runtime/lr_schedule.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <vector>

#include "graph/error.h"

namespace onnxtrain::runtime {

float lr_at(const LrSchedule& s, int64_t step) {
  OT_CHECK(step >= 0, "lr schedule: step must be >= 0, got ", step);
  const double base = s.base_lr;
  if (step < s.warmup_steps)
    return static_cast<float>(base * static_cast<double>(step + 1) /
                              static_cast<double>(s.warmup_steps));
  const int64_t t = step - std::max<int64_t>(s.warmup_steps, 0);
  switch (s.kind) {
    case LrSchedule::Kind::kConstant:
      return s.base_lr;
    case LrSchedule::Kind::kStep: {
      OT_CHECK(s.step_size >= 1, "lr schedule: step decay needs step_size >= 1, got ", s.step_size);
      return static_cast<float>(
          base * std::pow(static_cast<double>(s.gamma), static_cast<double>(t / s.step_size)));
    }
    case LrSchedule::Kind::kCosine: {
      OT_CHECK(s.total_steps > s.warmup_steps, "lr schedule: cosine decay needs total_steps (",
               s.total_steps, ") greater than warmup_steps (", s.warmup_steps, ")");
      const double p = std::min(
          1.0, static_cast<double>(t) / static_cast<double>(s.total_steps - s.warmup_steps));
      return static_cast<float>(s.min_lr +
                                (base - s.min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * p)));
    }
  }
  return s.base_lr;
}

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep)
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

class SpecParser {
 public:
  explicit SpecParser(const std::string& spec) : spec_(spec) {}

  [[noreturn]] void error(const std::string& part, const std::string& why) const {
    fail("lr schedule '", spec_, "': ", part.empty() ? "" : "'" + part + "': ", why,
         " (expected [warmup:N,]constant | step:SIZE[:GAMMA] | cosine[:TOTAL[:MIN_LR]])");
  }

  int64_t integer(const std::string& part, const std::string& text, int64_t min) const {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno == ERANGE)
      error(part, "'" + text + "' is not an integer");
    if (v < min) error(part, cat(v, " is below the minimum ", min));
    return v;
  }

  float number(const std::string& part, const std::string& text) const {
    char* end = nullptr;
    errno = 0;
    const float v = std::strtof(text.c_str(), &end);
    if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
      error(part, "'" + text + "' is not a finite number");
    return v;
  }

  LrSchedule parse(float base_lr) const {
    if (!(std::isfinite(base_lr) && base_lr > 0))
      fail("lr schedule '", spec_, "': base learning rate must be > 0, got ", base_lr);
    LrSchedule s;
    s.base_lr = base_lr;
    const std::vector<std::string> parts = split(spec_, ',');
    if (parts.size() > 2) error("", "at most one warmup and one decay, separated by one comma");
    bool have_decay = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string& part = parts[i];
      const std::vector<std::string> f = split(part, ':');
      if (f[0] == "warmup") {
        if (i != 0) error(part, "the warmup must come first");
        if (f.size() != 2) error(part, "expected warmup:N");
        s.warmup_steps = integer(part, f[1], 1);
        continue;
      }
      if (have_decay) error(part, "only one decay schedule");
      have_decay = true;
      if (f[0] == "constant") {
        if (f.size() != 1) error(part, "constant takes no arguments");
        s.kind = LrSchedule::Kind::kConstant;
      } else if (f[0] == "step") {
        if (f.size() < 2 || f.size() > 3) error(part, "expected step:SIZE[:GAMMA]");
        s.kind = LrSchedule::Kind::kStep;
        s.step_size = integer(part, f[1], 1);
        if (f.size() == 3) s.gamma = number(part, f[2]);
        if (!(s.gamma > 0)) error(part, cat("gamma must be > 0, got ", s.gamma));
      } else if (f[0] == "cosine") {
        if (f.size() > 3) error(part, "expected cosine[:TOTAL[:MIN_LR]]");
        s.kind = LrSchedule::Kind::kCosine;
        if (f.size() >= 2) s.total_steps = integer(part, f[1], 0);
        if (f.size() == 3) s.min_lr = number(part, f[2]);
        if (s.min_lr < 0 || s.min_lr > base_lr)
          error(part, cat("min_lr must lie in [0, base lr ", base_lr, "], got ", s.min_lr));
      } else {
        error(part, f[0].empty() ? "empty schedule" : "unknown schedule '" + f[0] + "'");
      }
    }
    if (s.kind == LrSchedule::Kind::kCosine && s.total_steps != 0 &&
        s.total_steps <= s.warmup_steps)
      error("", cat("cosine TOTAL (", s.total_steps, ") must exceed the warmup (", s.warmup_steps,
                    ")"));
    return s;
  }

 private:
  const std::string& spec_;
};

}  // namespace

LrSchedule parse_lr_schedule(const std::string& spec, float base_lr) {
  return SpecParser(spec).parse(base_lr);
}

}  // namespace onnxtrain::runtime
