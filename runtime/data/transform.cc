// InputAdapter and the image operations it uses. The adapter decides once (at construction)
// what each example needs, so apply() is a straight pass over the data on the prefetch thread.
#include "runtime/data/transform.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "graph/error.h"

namespace onnxtrain::runtime {
namespace {

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + ")";
}

int64_t product(const std::vector<int64_t>& dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
}

// An image view of a shape: (C,H,W) as is, (H,W) as one channel; anything else is a vector.
bool as_image(const std::vector<int64_t>& s, int64_t& c, int64_t& h, int64_t& w) {
  if (s.size() == 3) {
    c = s[0], h = s[1], w = s[2];
    return true;
  }
  if (s.size() == 2) {
    c = 1, h = s[0], w = s[1];
    return true;
  }
  return false;
}

bool channels_adaptable(int64_t from, int64_t to) {
  return from == to || (from == 1 && to == 3) || (from == 3 && to == 1);
}

// Per-channel values: one value for all channels, or exactly one per channel.
std::vector<float> per_channel(const std::vector<float>& v, int64_t channels, bool strict,
                               const char* what, const std::string& data_name) {
  if (v.size() == 1 || static_cast<int64_t>(v.size()) == channels)
    return v.size() == 1 ? std::vector<float>(static_cast<size_t>(channels), v[0]) : v;
  OT_CHECK(!strict, data_name, ": normalization ", what, " has ", v.size(),
           " values but the model input has ", channels, " channels (give 1 or ", channels, ")");
  float avg = std::accumulate(v.begin(), v.end(), 0.0f) / static_cast<float>(v.size());
  return std::vector<float>(static_cast<size_t>(channels), avg);
}

}  // namespace

Normalization parse_normalization(const std::string& mean, const std::string& std) {
  auto parse = [](const std::string& text, const char* what) {
    std::vector<float> out;
    size_t start = 0;
    for (;;) {
      size_t comma = text.find(',', start);
      std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
      size_t used = 0;
      float v = 0;
      try {
        v = std::stof(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      OT_CHECK(!item.empty() && used == item.size() && std::isfinite(v), what, " '", text, "': '",
               item, "' is not a number (expected e.g. 0.5 or 0.485,0.456,0.406)");
      out.push_back(v);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  };
  OT_CHECK(!mean.empty() && !std.empty(), "normalization needs both --mean and --std");
  return {parse(mean, "--mean"), parse(std, "--std")};
}

void resize_bilinear(const float* src, int64_t channels, int64_t height, int64_t width, float* dst,
                     int64_t out_height, int64_t out_width) {
  // Per output row/column: the two source indices and the weight of the second.
  auto taps = [](int64_t in, int64_t out, std::vector<int64_t>& i0, std::vector<int64_t>& i1,
                 std::vector<float>& frac) {
    double scale = static_cast<double>(in) / static_cast<double>(out);
    for (int64_t o = 0; o < out; ++o) {
      double x = std::clamp((static_cast<double>(o) + 0.5) * scale - 0.5, 0.0,
                            static_cast<double>(in - 1));
      auto lo = static_cast<int64_t>(x);
      i0.push_back(lo);
      i1.push_back(std::min(lo + 1, in - 1));
      frac.push_back(static_cast<float>(x - static_cast<double>(lo)));
    }
  };
  std::vector<int64_t> y0, y1, x0, x1;
  std::vector<float> fy, fx;
  taps(height, out_height, y0, y1, fy);
  taps(width, out_width, x0, x1, fx);
  for (int64_t c = 0; c < channels; ++c) {
    const float* plane = src + c * height * width;
    float* out = dst + c * out_height * out_width;
    for (int64_t oy = 0; oy < out_height; ++oy) {
      const float* r0 = plane + y0[oy] * width;
      const float* r1 = plane + y1[oy] * width;
      float wy = fy[oy];
      for (int64_t ox = 0; ox < out_width; ++ox) {
        float top = r0[x0[ox]] + (r0[x1[ox]] - r0[x0[ox]]) * fx[ox];
        float bottom = r1[x0[ox]] + (r1[x1[ox]] - r1[x0[ox]]) * fx[ox];
        out[oy * out_width + ox] = top + (bottom - top) * wy;
      }
    }
  }
}

void rgb_to_luma(const float* rgb, int64_t pixels, float* luma) {
  const float* r = rgb;
  const float* g = rgb + pixels;
  const float* b = rgb + 2 * pixels;
  for (int64_t i = 0; i < pixels; ++i) luma[i] = 0.299f * r[i] + 0.587f * g[i] + 0.114f * b[i];
}

InputAdapter::InputAdapter(std::vector<int64_t> data_shape, std::vector<int64_t> model_shape,
                           Normalization norm, const std::string& data_name, bool strict_norm)
    : model_shape_(std::move(model_shape)) {
  for (int64_t d : data_shape)
    OT_CHECK(d > 0, data_name, ": example shape ", shape_text(data_shape),
             " has a non-positive dim");
  for (int64_t d : model_shape_)
    OT_CHECK(d > 0, data_name, ": model input shape ", shape_text(model_shape_),
             " must be concrete and positive (without the batch dim)");
  in_numel_ = product(data_shape);
  out_numel_ = product(model_shape_);
  auto mismatch = [&](const std::string& why) {
    fail(data_name, ": examples of shape ", shape_text(data_shape), " do not fit the model input ",
         shape_text(model_shape_), ": ", why);
  };
  int64_t dc = 1, dh = 1, dw = in_numel_, mc = 1, mh = 1, mw = out_numel_;
  bool data_image = as_image(data_shape, dc, dh, dw);
  bool model_image = as_image(model_shape_, mc, mh, mw);
  in_c_ = dc, in_h_ = dh, in_w_ = dw;
  if (data_image && model_image) {
    if (!channels_adaptable(dc, mc))
      mismatch(cat(dc, " channels cannot become ", mc, " (1->3 and 3->1 are supported)"));
    out_c_ = mc, out_h_ = mh, out_w_ = mw;
    adapt_ = dc != mc || dh != mh || dw != mw;
  } else if (in_numel_ == out_numel_) {
    // Same size, at least one side a vector: flatten or reshape, channels are the data's.
    out_c_ = dc, out_h_ = dh, out_w_ = dw;
  } else if (data_image && model_shape_.size() == 1 && mw == 3 * dh * dw && dc == 1) {
    out_c_ = 3, out_h_ = dh, out_w_ = dw, adapt_ = true;  // gray image -> flat RGB vector
  } else if (data_image && model_shape_.size() == 1 && mw == dh * dw && dc == 3) {
    out_c_ = 1, out_h_ = dh, out_w_ = dw, adapt_ = true;  // RGB image -> flat luma vector
  } else {
    std::string why = " (the model input is neither a vector nor (C,H,W))";
    if (!data_image) why = " (only image-shaped (C,H,W) data is resized)";
    if (data_image && model_shape_.size() == 1)
      why = " (a vector input is only filled by flattening)";
    mismatch(cat(in_numel_, " values per example vs ", out_numel_, why));
  }
  if (!norm.empty()) {
    OT_CHECK(!norm.mean.empty() && !norm.std.empty(), data_name,
             ": normalization needs both mean and std");
    mean_ = per_channel(norm.mean, out_c_, strict_norm, "mean", data_name);
    std::vector<float> sd = per_channel(norm.std, out_c_, strict_norm, "std", data_name);
    for (float s : sd) {
      OT_CHECK(std::isfinite(s) && s > 0, data_name, ": normalization std ", s, " must be > 0");
      inv_std_.push_back(1.0f / s);
    }
  }
}

InputAdapter InputAdapter::for_dataset(const Dataset& data, std::span<const int64_t> model_input,
                                       const std::optional<Normalization>& override) {
  if (data.is_named()) return InputAdapter();
  return InputAdapter(data.example_shape(), {model_input.begin(), model_input.end()},
                      override ? *override : data.default_normalization(), data.name(),
                      override.has_value());
}

void InputAdapter::apply(const float* in, float* out) const {
  if (!adapt_) {
    std::copy_n(in, out_numel_, out);
  } else {
    // Channel adaptation at the source size, then resize straight into `out`.
    std::vector<float> tmp;
    const float* src = in;
    int64_t plane = in_h_ * in_w_;
    bool resize = in_h_ != out_h_ || in_w_ != out_w_;
    if (in_c_ != out_c_) {
      tmp.resize(static_cast<size_t>(out_c_ * plane));
      if (in_c_ == 3)
        rgb_to_luma(in, plane, tmp.data());
      else
        for (int64_t c = 0; c < out_c_; ++c) std::copy_n(in, plane, tmp.data() + c * plane);
      src = tmp.data();
    }
    if (resize)
      resize_bilinear(src, out_c_, in_h_, in_w_, out, out_h_, out_w_);
    else
      std::copy_n(src, out_numel_, out);
  }
  if (mean_.empty()) return;
  int64_t plane = out_numel_ / out_c_;
  for (int64_t c = 0; c < out_c_; ++c) {
    float m = mean_[static_cast<size_t>(c)], s = inv_std_[static_cast<size_t>(c)];
    float* p = out + c * plane;
    for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - m) * s;
  }
}

std::string InputAdapter::describe() const {
  std::ostringstream os;
  auto sep = [&] {
    if (os.tellp() > 0) os << ", ";
  };
  if (in_c_ != out_c_) os << in_c_ << "->" << out_c_ << " channels";
  if (adapt_ && (in_h_ != out_h_ || in_w_ != out_w_)) {
    sep();
    os << "resize " << in_h_ << "x" << in_w_ << "->" << out_h_ << "x" << out_w_;
  }
  if (!mean_.empty()) {
    sep();
    os << "normalize mean=(";
    for (size_t i = 0; i < mean_.size(); ++i) os << (i ? "," : "") << mean_[i];
    os << ") std=(";
    for (size_t i = 0; i < inv_std_.size(); ++i) os << (i ? "," : "") << 1.0f / inv_std_[i];
    os << ")";
  }
  return os.str();
}

}  // namespace onnxtrain::runtime
