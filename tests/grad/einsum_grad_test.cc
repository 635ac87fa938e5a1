// Einsum: the forward against a naive reference (every assignment of the letters, float64) for
// matrix products, attention-style contractions, diagonals, broadcast "...", implicit outputs and
// three operands; the gradient rule against finite differences; one-line errors naming the node.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/ir.h"
#include "graph/tensor.h"
#include "runtime/session.h"
#include "tests/grad/gradcheck.h"

namespace onnxtrain {
namespace {

using graph::Attribute;
using graph::DataType;
using graph::Tensor;
using testing::GradCase;
using testing::GradInput;

struct EinsumCase {
  std::string equation;
  std::vector<std::vector<int64_t>> dims;
};

std::unique_ptr<graph::Model> einsum_model(const EinsumCase& c, DataType dt) {
  auto m = std::make_unique<graph::Model>();
  m->set_opset("", 17);
  graph::Graph& g = *m->graph;
  std::vector<graph::Value*> ins;
  for (size_t i = 0; i < c.dims.size(); ++i)
    ins.push_back(g.add_input("x" + std::to_string(i),
                              graph::ValueType::tensor(dt, graph::make_shape(c.dims[i]))));
  graph::Node* n = g.add_node("Einsum", ins, {"y"}, "einsum");
  n->set_attr(Attribute::make_string("equation", c.equation));
  g.add_output(n->output(0));
  return m;
}

std::vector<Tensor> inputs_of(const EinsumCase& c, uint64_t seed, DataType dt) {
  std::vector<Tensor> t;
  for (size_t i = 0; i < c.dims.size(); ++i)
    t.push_back(testing::random_tensor(dt, c.dims[i], seed + i));
  return t;
}

// numpy's einsum, the slow way: every assignment of values to the letters (and the broadcast
// "..." dims, at most two here: labels '0' and '1', right-aligned), summing the product of the
// operands into the output element it names. Letters only; `out` must be explicit.
std::vector<double> naive_einsum(const EinsumCase& c, const std::vector<Tensor>& x,
                                 const std::string& out_term, std::vector<int64_t>* out_dims) {
  std::string eq;
  for (char ch : c.equation)
    if (ch != ' ') eq += ch;
  std::vector<std::string> terms;
  const std::string lhs = eq.substr(0, eq.find("->"));
  for (size_t b = 0;;) {
    const size_t comma = lhs.find(',', b);
    terms.push_back(lhs.substr(b, comma - b));
    if (comma == std::string::npos) break;
    b = comma + 1;
  }
  // Expand "..." into '0'/'1' labels right-aligned to the widest.
  size_t widest = 0;
  std::vector<size_t> ell(terms.size(), 0);
  auto letters = [](const std::string& t) {
    size_t n = 0;
    for (char ch : t) n += std::isalpha(static_cast<unsigned char>(ch)) ? 1 : 0;
    return n;
  };
  for (size_t i = 0; i < terms.size(); ++i) {
    ell[i] = c.dims[i].size() - letters(terms[i]);
    widest = std::max(widest, ell[i]);
  }
  auto expand = [&](const std::string& t, size_t n) {
    std::string r;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] != '.') {
        r += t[i];
        continue;
      }
      for (size_t j = widest - n; j < widest; ++j) r += static_cast<char>('0' + j);
      i += 2;
    }
    return r;
  };
  for (size_t i = 0; i < terms.size(); ++i) terms[i] = expand(terms[i], ell[i]);
  const std::string out = expand(out_term, widest);
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t p = 0; p < terms[i].size(); ++p)
      size[terms[i][p]] = std::max(size[terms[i][p]], c.dims[i][p]);
  std::vector<char> labels;
  for (const auto& [ch, n] : size) labels.push_back(ch);
  out_dims->clear();
  for (char ch : out) out_dims->push_back(size[ch]);
  int64_t out_n = 1;
  for (int64_t d : *out_dims) out_n *= d;
  std::vector<double> y(static_cast<size_t>(out_n), 0.0);
  std::map<char, int64_t> at;
  for (char ch : labels) at[ch] = 0;
  for (const auto& [ch, n] : size)
    if (n == 0) return y;  // an empty sum
  for (;;) {
    double prod = 1;
    for (size_t i = 0; i < terms.size(); ++i) {
      int64_t flat = 0;
      for (size_t p = 0; p < terms[i].size(); ++p)
        flat = flat * c.dims[i][p] + (c.dims[i][p] == 1 ? 0 : at[terms[i][p]]);  // broadcast 1
      prod *= x[i].data_as<double>()[flat];
    }
    int64_t o = 0;
    for (size_t p = 0; p < out.size(); ++p) o = o * (*out_dims)[p] + at[out[p]];
    y[static_cast<size_t>(o)] += prod;
    size_t k = 0;
    for (; k < labels.size(); ++k) {
      if (++at[labels[k]] < size[labels[k]]) break;
      at[labels[k]] = 0;
    }
    if (k == labels.size()) break;
  }
  return y;
}

Tensor run_einsum(const EinsumCase& c, const std::vector<Tensor>& x) {
  runtime::SessionOptions so;
  so.threads = 2;
  runtime::InferenceSession s(einsum_model(c, x[0].dtype()), so);
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < x.size(); ++i) feeds["x" + std::to_string(i)] = x[i];
  return s.run(feeds).at(0);
}

TEST(Einsum, ForwardEqualsANaiveReference) {
  // {equation, operand dims, the output written out for the reference}
  const std::vector<std::pair<EinsumCase, std::string>> cases = {
      {{"ij,jk->ik", {{3, 4}, {4, 5}}}, "ik"},
      {{"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}}, "bik"},
      {{"ibnd,jbnd->bnij", {{5, 2, 3, 4}, {6, 2, 3, 4}}}, "bnij"},  // XLNet's attention scores
      {{"bnij,jbnd->ibnd", {{2, 3, 5, 6}, {6, 2, 3, 4}}}, "ibnd"},
      {{"ij->ji", {{3, 4}}}, "ji"},
      {{"ij->i", {{3, 4}}}, "i"},
      {{"ij->", {{3, 4}}}, ""},
      {{"i,i", {{5}, {5}}}, ""},            // implicit output: a scalar
      {{"ij,jk", {{3, 4}, {4, 2}}}, "ik"},  // implicit: letters used once, sorted
      {{"ba,ac", {{3, 4}, {4, 2}}}, "bc"},
      {{"i,j->ij", {{3}, {4}}}, "ij"},         // outer product
      {{"ii->i", {{4, 4}}}, "i"},              // diagonal
      {{"...ii->...i", {{2, 3, 3}}}, "...i"},  // batch diagonal
      {{"bii,bi->b", {{2, 3, 3}, {2, 3}}}, "b"},
      {{"...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}}, "...ik"},  // broadcast batch dims
      {{"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}}, "il"},
      {{"bi,ij,bj->b", {{3, 4}, {4, 5}, {3, 5}}}, "b"},          // bilinear form
      {{"ij,k->jk", {{3, 4}, {2}}}, "jk"},                       // i summed in one operand alone
      {{" bI J , bJK -> bIK ", {{2, 3, 4}, {2, 4, 5}}}, "bIK"},  // spaces, upper case
      {{"ij,jk->ik", {{3, 0}, {0, 5}}}, "ik"},                   // an empty contraction: zeros
  };
  for (const auto& [c, out] : cases) {
    SCOPED_TRACE(c.equation);
    const std::vector<Tensor> x = inputs_of(c, 5, DataType::kDouble);
    std::vector<int64_t> dims;
    const std::vector<double> want = naive_einsum(c, x, out, &dims);
    const Tensor got = run_einsum(c, x);
    ASSERT_EQ(got.dims(), dims);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got.data_as<double>()[i], want[i], 1e-12) << "element " << i;
    // float32 through oneDNN's sgemm: the same within float32 rounding.
    std::vector<Tensor> xf;
    for (const Tensor& t : x) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(t.data_as<double>()[i]);
      xf.push_back(Tensor::from_vector(DataType::kFloat, t.dims(), v));
    }
    const Tensor gf = run_einsum(c, xf);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(gf.data_as<float>()[i], want[i], 1e-5) << "float32 element " << i;
  }
}

void check(const EinsumCase& e, uint64_t seed) {
  GradCase c;
  c.op_type = "Einsum";
  c.opset = 17;
  c.label = "Einsum " + e.equation;
  c.attributes = {Attribute::make_string("equation", e.equation)};
  for (const Tensor& t : inputs_of(e, seed, DataType::kDouble)) c.inputs.push_back(GradInput{t});
  SCOPED_TRACE(c.label);
  EXPECT_GT(testing::check_gradient(c).elements_checked, 0);
}

TEST(EinsumGrad, Contractions) {
  check({"ij,jk->ik", {{3, 4}, {4, 5}}}, 11);
  check({"ibnd,jbnd->bnij", {{4, 2, 3, 2}, {5, 2, 3, 2}}}, 13);
  check({"bnij,jbnd->ibnd", {{2, 3, 4, 5}, {5, 2, 3, 2}}}, 15);
  check({"ij->ji", {{3, 4}}}, 17);
  check({"ij->", {{3, 4}}}, 19);
  check({"i,i", {{5}, {5}}}, 21);
  check({"ij,jk", {{3, 4}, {4, 2}}}, 23);
  check({"i,j->ij", {{3}, {4}}}, 25);
  check({"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 2}}}, 27);
  check({"bi,ij,bj->b", {{3, 4}, {4, 5}, {3, 5}}}, 29);
  // i and k only in their own operand: their gradients are the same at every index.
  check({"ij,k->jk", {{3, 4}, {2}}}, 31);
  check({"ijk,j->k", {{2, 3, 4}, {3}}}, 33);
  // Broadcast "..." dims: the size-1 dims of the first operand and the missing leading dim of
  // the second sum their gradients back.
  check({"...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}}, 35);
  check({"...i,i->...", {{2, 3}, {3}}}, 37);
  // A diagonal in the operand whose gradient is not asked for: W's of "ii,ij".
  GradCase d;
  d.op_type = "Einsum";
  d.label = "Einsum ii,ij->j (diagonal operand unchecked)";
  d.attributes = {Attribute::make_string("equation", "ii,ij->j")};
  d.inputs = {testing::unchecked(testing::rnd({3, 3}, 39)), GradInput{testing::rnd({3, 4}, 40)}};
  SCOPED_TRACE(d.label);
  EXPECT_GT(testing::check_gradient(d).elements_checked, 0);
}

void expect_error(const EinsumCase& c, const std::string& part) {
  try {
    run_einsum(c, inputs_of(c, 1, DataType::kDouble));
    ADD_FAILURE() << c.equation << ": no error, expected: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("einsum"), std::string::npos) << e.what();
  }
}

TEST(Einsum, BadEquationsAreOneLineErrorsNamingTheNode) {
  expect_error({"ij,jk->ik", {{3, 4}}}, "2 operand term(s) for 1 input(s)");
  expect_error({"ij->ik", {{3, 4}}}, "output subscript 'k' is in no operand");
  expect_error({"ij->ii", {{3, 4}}}, "output subscript 'i' repeats");
  expect_error({"i1,j->ij", {{3, 4}, {2}}}, "unexpected '1'");
  expect_error({"ij,jk->ik", {{3, 4}, {5, 2}}}, "subscript 'j'");
  expect_error({"ijk->i", {{3, 4}}}, "input 0 has rank 2 but its subscripts 'ijk' name 3");
  expect_error({"......i->i", {{3, 4}}}, "'...' appears twice");
  // The gradient of an operand with a repeated letter: refused, naming the node.
  GradCase c;
  c.op_type = "Einsum";
  c.label = "Einsum ii->i";
  c.attributes = {Attribute::make_string("equation", "ii->i")};
  c.inputs = {GradInput{testing::rnd({3, 3}, 3)}};
  try {
    testing::check_gradient(c);
    ADD_FAILURE() << "no error for the gradient of a diagonal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("subscript 'i' repeats in 'ii' (a diagonal)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace onnxtrain
