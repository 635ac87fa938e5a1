// channel_block(): asks oneDNN which blocked layout it picks for a typical convolution.
#include "ops/nn/blocked_layout.h"

#include "ops/nn/nn_util.h"

namespace onnxtrain::ops {
namespace {

int64_t pick_channel_block() {
  using dnnl::convolution_forward;
  using dnnl::memory;
  const memory::dims x{1, 64, 28, 28}, w{64, 64, 3, 3}, one{1, 1}, zero{0, 0};
  const memory::desc any_x(x, memory::data_type::f32, memory::format_tag::any);
  const memory::desc any_w(w, memory::data_type::f32, memory::format_tag::any);
  try {
    convolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                dnnl::algorithm::convolution_direct, any_x, any_w, any_x, one, zero,
                                one, one);
    const memory::desc dst = convolution_forward::primitive_desc(d, nn::cpu_engine()).dst_desc();
    if (dst == memory::desc(x, memory::data_type::f32, memory::format_tag::nChw8c)) return 8;
  } catch (const dnnl::error&) {
    // no implementation: the AVX-512 layout
  }
  return 16;
}

}  // namespace

int64_t channel_block() {
  static const int64_t block = pick_channel_block();
  return block;
}

namespace nn {

dnnl::memory::desc activation_desc(std::span<const int64_t> dims, bool blocked,
                                   dnnl::memory::data_type type) {
  if (!blocked) return plain_desc(dims, type);
  const auto tag =
      channel_block() == 8 ? dnnl::memory::format_tag::nChw8c : dnnl::memory::format_tag::nChw16c;
  return dnnl::memory::desc(to_dnnl(dims), type, tag);
}

}  // namespace nn
}  // namespace onnxtrain::ops
