// ops/nn/dnnl_reorder: our plain <-> two-blocked loop against oneDNN's reorder, bit for bit,
// both directions, padding included; and which pairs it takes.
#include "ops/nn/dnnl_reorder.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace onnxtrain::ops::nn {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// Buffer of desc's size filled with a pattern (or a constant byte).
std::vector<uint8_t> filled(const memory::desc& d, int seed, int constant = -1) {
  std::vector<uint8_t> b(d.get_size());
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = constant >= 0 ? static_cast<uint8_t>(constant) : static_cast<uint8_t>(i * 7 + seed);
  return b;
}

// from -> to by ours and by oneDNN; destinations pre-filled with garbage so padding that ours
// leaves unwritten would show.
void expect_same_as_onednn(const memory::desc& from, const memory::desc& to) {
  std::optional<TwoBlockReorder> ours = TwoBlockReorder::plan(from, to);
  ASSERT_TRUE(ours.has_value());
  std::vector<uint8_t> src = filled(from, 3);
  if (from.data.format_desc.blocking.inner_nblks != 0) {
    // A blocked source's padding is zero (as oneDNN writes it): let oneDNN make one.
    std::vector<uint8_t> plain_src = filled(to, 3);
    memory ps(to, engine(), plain_src.data()), bs(from, engine(), src.data());
    dnnl::stream s(engine());
    dnnl::reorder(ps, bs).execute(s, ps, bs);
    s.wait();
  }
  std::vector<uint8_t> want = filled(to, 0, 0xAB), got = filled(to, 0, 0xCD);
  memory m_src(from, engine(), src.data()), m_want(to, engine(), want.data());
  dnnl::stream s(engine());
  dnnl::reorder(m_src, m_want).execute(s, m_src, m_want);
  s.wait();
  ours->run(src.data(), got.data());
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size()));
}

TEST(DnnlReorder, TwoBlockedWeightsMatchOneDnnBothWays) {
  struct Case {
    memory::dims dims;
    tag blocked;
  };
  const Case cases[] = {
      {{64, 64, 3, 3}, tag::OIhw16i16o},      // forward weights
      {{512, 2048, 1, 1}, tag::OIhw16i16o},   // a 1x1, the slow oneDNN direction
      {{128, 64, 3, 3}, tag::IOhw16o16i},     // backward-data weights
      {{64, 128, 1, 1}, tag::OIhw16o16i},
      {{20, 3, 7, 7}, tag::OIhw16i16o},       // padded: 20 -> 32 outputs, 3 -> 16 inputs
      {{3, 40, 2, 5}, tag::IOhw16o16i},       // padded the other way, non-square window
      {{8, 36, 5}, tag::OIw16i16o},           // 1-D convolution
      {{24, 40, 3, 3, 3}, tag::OIdhw16i16o},  // 3-D convolution
      {{2, 32, 48, 3, 3}, tag::gOIhw16i16o},  // grouped: blocks on dims 1 and 2
      {{40, 24}, tag::AB16b16a},              // matrix
  };
  for (const Case& c : cases) {
    for (memory::data_type dt : {memory::data_type::f32, memory::data_type::bf16}) {
      SCOPED_TRACE(::testing::Message() << "dims[0]=" << c.dims[0] << " ndims=" << c.dims.size()
                                        << " type=" << static_cast<int>(dt));
      const memory::desc blocked(c.dims, dt, c.blocked);
      memory::dims strides(c.dims.size(), 1);
      for (int k = static_cast<int>(c.dims.size()) - 2; k >= 0; --k)
        strides[k] = strides[k + 1] * c.dims[k + 1];
      const memory::desc row_major(c.dims, dt, strides);
      expect_same_as_onednn(row_major, blocked);
      expect_same_as_onednn(blocked, row_major);
    }
  }
}

TEST(DnnlReorder, OtherPairsAreLeftToOneDnn) {
  const memory::dims d{16, 32, 3, 3};
  const memory::desc plain(d, memory::data_type::f32, tag::abcd);
  // One blocked dim (activations), plain to plain, a strided (transposed) plain view, a change
  // of data type, a shape mismatch.
  EXPECT_FALSE(TwoBlockReorder::plan(plain, memory::desc(d, memory::data_type::f32, tag::nChw16c)));
  EXPECT_FALSE(TwoBlockReorder::plan(plain, memory::desc(d, memory::data_type::f32, tag::acdb)));
  const memory::desc io_view(d, memory::data_type::f32, memory::dims{9, 144, 3, 1});
  EXPECT_FALSE(TwoBlockReorder::plan(io_view, memory::desc(d, memory::data_type::f32,
                                                           tag::OIhw16i16o)));
  EXPECT_FALSE(TwoBlockReorder::plan(memory::desc(d, memory::data_type::bf16, tag::OIhw16i16o),
                                     plain));
  EXPECT_FALSE(TwoBlockReorder::plan(memory::desc({16, 32, 1, 1}, memory::data_type::f32,
                                                  tag::OIhw16i16o),
                                     plain));
  // The Reorder wrapper: towards blocked always oneDNN's; towards plain ours where oneDNN would
  // use its generic kernel. Either way the result is oneDNN's, bit for bit.
  const memory::desc blocked(d, memory::data_type::f32, tag::OIhw16i16o);
  EXPECT_FALSE(Reorder(plain, blocked).own());
  std::vector<uint8_t> src = filled(blocked, 5), want = filled(plain, 0, 1),
                       got = filled(plain, 0, 2);
  {
    std::vector<uint8_t> p = filled(plain, 5);
    memory mp(plain, engine(), p.data()), mb(blocked, engine(), src.data());
    dnnl::stream s(engine());
    dnnl::reorder(mp, mb).execute(s, mp, mb);
    s.wait();
  }
  dnnl::stream s(engine());
  memory mb(blocked, engine(), src.data()), mw(plain, engine(), want.data()),
      mg(plain, engine(), got.data());
  dnnl::reorder(mb, mw).execute(s, mb, mw);
  Reorder(blocked, plain).execute(s, mb, mg);
  s.wait();
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size()));
}

}  // namespace
}  // namespace onnxtrain::ops::nn
