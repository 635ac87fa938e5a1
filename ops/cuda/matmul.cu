// Gemm and MatMul on cuBLAS, float32 (other dtypes run on the CPU). cuBLAS is column-major: a
// row-major (M,N) product Y = A B is computed as the column-major Y^T = B^T A^T, which reads the
// row-major buffers as they are. TF32 tensor cores follow cuda::tf32_enabled().
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ops/cuda/cuda_common.h"
#include "ops/cuda/dnn_util.cuh"

namespace onnxtrain::ops::cuda {
namespace {

using dnn::fits_int;

// c: (c_rows, c_cols) with each either 1 or the full size -> y: (M,N) = c broadcast
__global__ void broadcast_c_kernel(const float* c, float* y, int64_t m, int64_t n, int64_t c_rows,
                                   int64_t c_cols) {
  OT_GRID_STRIDE_LOOP(i, m * n) {
    const int64_t r = i / n, col = i % n;
    y[i] = c[(c_rows == 1 ? 0 : r) * c_cols + (c_cols == 1 ? 0 : col)];
  }
}

// Row-major y (M,N) = alpha * op(a) op(b) + beta * y for `batch` problems spaced by the given
// element strides (0: the operand is shared by every problem). op(a) is (M,K): a is stored (M,K),
// or (K,M) with ta; op(b) is (K,N): b is stored (K,N), or (N,K) with tb.
void row_major_gemm(cudaStream_t s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t stride_a, const float* b, int64_t stride_b, float beta,
                    float* y, int64_t batch) {
  cublasHandle_t h = cublas_handle(s);
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Column-major view: b is (N,K) [ld N] or, with tb, (K,N) [ld K]; a likewise.
  const int ldb = static_cast<int>(tb ? k : n), lda = static_cast<int>(ta ? m : k);
  const int ni = static_cast<int>(n), mi = static_cast<int>(m), ki = static_cast<int>(k);
  if (batch == 1) {
    OT_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, ni, mi, ki, &alpha, b, CUDA_R_32F, ldb, a,
                                 CUDA_R_32F, lda, &beta, y, CUDA_R_32F, ni,
                                 dnn::gemm_compute_type(), CUBLAS_GEMM_DEFAULT));
    return;
  }
  OT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, op_b, op_a, ni, mi, ki, &alpha, b, CUDA_R_32F, ldb, static_cast<long long>(stride_b), a,
      CUDA_R_32F, lda, static_cast<long long>(stride_a), &beta, y, CUDA_R_32F, ni,
      static_cast<long long>(m * n), static_cast<int>(batch), dnn::gemm_compute_type(),
      CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------- Gemm

// a: (M,K) or (K,M) with transA, b: (K,N) or (N,K) with transB, c: broadcastable to (M,N)
//   -> y: (M,N) = alpha * A' B' + beta * C
class GemmKernel final : public Kernel {
 public:
  explicit GemmKernel(const graph::Node& node)
      : where_(node.describe()),
        alpha_(node.attr_float("alpha", 1.0f)),
        beta_(node.attr_float("beta", 1.0f)),
        ta_(node.attr_int("transA", 0) != 0),
        tb_(node.attr_int("transB", 0) != 0) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* a = ctx.input(0);
    const TensorView* b = ctx.input(1);
    const TensorView* c = ctx.input(2);
    if (!a || !b || a->rank() != 2 || b->rank() != 2)
      throw DeviceFallback{where_ + ": A and B must be rank-2 (the CPU kernel reports it)"};
    dnn::require_f32(where_, {a, b, c});
    m_ = ta_ ? a->dims[1] : a->dims[0];
    k_ = ta_ ? a->dims[0] : a->dims[1];
    n_ = tb_ ? b->dims[0] : b->dims[1];
    const int64_t kb = tb_ ? b->dims[1] : b->dims[0];
    if (k_ != kb) throw DeviceFallback{where_ + ": inner dims differ (the CPU kernel reports it)"};
    if (!fits_int(m_) || !fits_int(n_) || !fits_int(k_) || !fits_int(m_ * n_))
      throw DeviceFallback{where_ + ": sizes exceed cuBLAS int range"};
    if (k_ == 0 && m_ * n_ > 0) throw DeviceFallback{where_ + ": K = 0"};
    use_c_ = c && beta_ != 0.0f;
    if (use_c_) {
      std::vector<int64_t> cd = c->dims;
      while (cd.size() < 2) cd.insert(cd.begin(), 1);
      const bool ok = c->rank() <= 2 && (cd[0] == 1 || cd[0] == m_) && (cd[1] == 1 || cd[1] == n_);
      if (!ok) throw DeviceFallback{where_ + ": C does not broadcast (the CPU kernel reports it)"};
      c_rows_ = cd[0];
      c_cols_ = cd[1];
    }
  }

  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    if (m_ * n_ == 0) return;
    cudaStream_t s = stream_of(ctx);
    if (use_c_) {
      broadcast_c_kernel<<<blocks_for(m_ * n_), 256, 0, s>>>(
          ctx.input(2)->as<float>(), y.as<float>(), m_, n_, c_rows_, c_cols_);
      OT_CUDA_CHECK_LAUNCH();
    }
    // beta = 0: cuBLAS does not read y (it may hold anything).
    row_major_gemm(s, ta_, tb_, m_, n_, k_, alpha_, ctx.input(0)->as<float>(), 0,
                   ctx.input(1)->as<float>(), 0, use_c_ ? beta_ : 0.0f, y.as<float>(), 1);
  }

 private:
  std::string where_;
  float alpha_, beta_;
  bool ta_, tb_;
  int64_t m_ = 0, n_ = 0, k_ = 0, c_rows_ = 1, c_cols_ = 1;
  bool use_c_ = false;
};

// ---------------------------------------------------------------- MatMul

// a: (..., M, K) or (K), b: (..., K, N) or (K) -> y: (broadcast(...), M, N), 1-D dims dropped.
// Batch dims broadcast when one operand is shared by every problem (its batch dims all 1: stride
// 0); a mix of broadcast and full dims on one operand runs on the CPU.
class MatMulKernel final : public Kernel {
 public:
  explicit MatMulKernel(const graph::Node& node) : where_(node.describe()) {}

  void prepare(KernelContext& ctx) override {
    const TensorView* a = ctx.input(0);
    const TensorView* b = ctx.input(1);
    if (!a || !b || a->rank() < 1 || b->rank() < 1)
      throw DeviceFallback{where_ + ": MatMul operands must have rank >= 1"};
    dnn::require_f32(where_, {a, b});
    std::vector<int64_t> ad = a->dims, bd = b->dims;
    if (ad.size() == 1) ad.insert(ad.begin(), 1);
    if (bd.size() == 1) bd.push_back(1);
    m_ = ad[ad.size() - 2];
    k_ = ad.back();
    n_ = bd.back();
    if (bd[bd.size() - 2] != k_)
      throw DeviceFallback{where_ + ": inner dims differ (the CPU kernel reports it)"};
    std::vector<int64_t> a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
    const size_t r = std::max(a_batch.size(), b_batch.size());
    while (a_batch.size() < r) a_batch.insert(a_batch.begin(), 1);
    while (b_batch.size() < r) b_batch.insert(b_batch.begin(), 1);
    std::vector<int64_t> batch(r);
    for (size_t i = 0; i < r; ++i) {
      if (a_batch[i] != b_batch[i] && a_batch[i] != 1 && b_batch[i] != 1)
        throw DeviceFallback{where_ + ": batch dims do not broadcast (the CPU kernel reports it)"};
      batch[i] = a_batch[i] == 1 ? b_batch[i] : a_batch[i];
    }
    batch_ = dnn::product(batch);
    const bool a_full = a_batch == batch, b_full = b_batch == batch;
    const bool a_shared = dnn::product(a_batch) == 1, b_shared = dnn::product(b_batch) == 1;
    if (!(a_full || a_shared) || !(b_full || b_shared))
      throw DeviceFallback{where_ + ": mixed batch broadcasting"};
    stride_a_ = a_shared ? 0 : m_ * k_;
    stride_b_ = b_shared ? 0 : k_ * n_;
    // A shared B: the batch folds into M, one GEMM over (batch*M, K) rows.
    if (batch_ > 1 && stride_b_ == 0 && stride_a_ != 0) {
      m_ *= batch_;
      batch_ = 1;
    }
    if (!fits_int(m_) || !fits_int(n_) || !fits_int(k_) || !fits_int(batch_) || !fits_int(m_ * n_))
      throw DeviceFallback{where_ + ": sizes exceed cuBLAS int range"};
  }

  void run(KernelContext& ctx) override {
    TensorView& y = ctx.output(0);
    if (y.numel() == 0) return;
    cudaStream_t s = stream_of(ctx);
    if (k_ == 0) {  // empty sum
      OT_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), s));
      return;
    }
    row_major_gemm(s, false, false, m_, n_, k_, 1.0f, ctx.input(0)->as<float>(), stride_a_,
                   ctx.input(1)->as<float>(), stride_b_, 0.0f, y.as<float>(), batch_);
  }

 private:
  std::string where_;
  int64_t m_ = 0, n_ = 0, k_ = 0, batch_ = 1, stride_a_ = 0, stride_b_ = 0;
};

}  // namespace

ONNXTRAIN_REGISTER_KERNEL(gemm_cuda, "", "Gemm", kCuda) {
  return std::make_unique<GemmKernel>(n);
}
ONNXTRAIN_REGISTER_KERNEL(matmul_cuda, "", "MatMul", kCuda) {
  return std::make_unique<MatMulKernel>(n);
}

}  // namespace onnxtrain::ops::cuda
