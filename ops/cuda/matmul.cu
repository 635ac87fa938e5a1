// Gemm and MatMul on cuBLAS, float32, and bf16 / f16 (mixed precision: every operand in the one
// low dtype, products accumulated in float32 on tensor cores, Y rounded once); other dtypes run
// on the CPU. cuBLAS is column-major: a row-major (M,N) product Y = A B is computed as the
// column-major Y^T = B^T A^T, which reads the row-major buffers as they are. TF32 tensor cores
// for float32 follow cuda::tf32_enabled().
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ops/cuda/cuda_common.h"
#include "ops/cuda/dnn_util.cuh"
#include "ops/cuda/eltwise_util.cuh"

namespace onnxtrain::ops::cuda {
namespace {

using dnn::fits_int;

// The dtypes these kernels run: float32, and bf16 / f16 with every operand of that dtype.
using GemmT = Types<float, __half, __nv_bfloat16>;

// cuBLAS's name of a GemmT dtype.
cudaDataType_t cublas_dtype(DataType t) {
  return t == DataType::kBFloat16 ? CUDA_R_16BF : t == DataType::kFloat16 ? CUDA_R_16F : CUDA_R_32F;
}

// Throws DeviceFallback unless every given tensor has the first one's dtype, one of GemmT.
DataType require_gemm_dtype(const std::string& where, std::initializer_list<const TensorView*> ts) {
  const DataType t = (*ts.begin())->dtype;
  for (const TensorView* v : ts)
    if (v && (v->dtype != t || !has_dtype(GemmT{}, t)))
      throw DeviceFallback{where + ": CUDA kernel handles float32, bf16 and f16 operands of one "
                           "dtype, got " + std::string(graph::dtype_short_name(v->dtype))};
  return t;
}

// float32 on TF32 (or plain FMA) math; bf16 / f16 accumulate in float32 on tensor cores.
cublasComputeType_t compute_type(DataType t) {
  return t == DataType::kFloat ? dnn::gemm_compute_type() : CUBLAS_COMPUTE_32F;
}

// c: (c_rows, c_cols) with each either 1 or the full size -> y: (M,N) = c broadcast
template <typename T>
__global__ void broadcast_c_kernel(const T* c, T* y, int64_t m, int64_t n, int64_t c_rows,
                                   int64_t c_cols) {
  OT_GRID_STRIDE_LOOP(i, m * n) {
    const int64_t r = i / n, col = i % n;
    y[i] = c[(c_rows == 1 ? 0 : r) * c_cols + (c_cols == 1 ? 0 : col)];
  }
}

// Row-major y (M,N) = alpha * op(a) op(b) + beta * y for `batch` problems spaced by the given
// element strides (0: the operand is shared by every problem). op(a) is (M,K): a is stored (M,K),
// or (K,M) with ta; op(b) is (K,N): b is stored (K,N), or (N,K) with tb. Every operand has
// dtype t (GemmT); alpha and beta are float32 (the compute type's scalars).
void row_major_gemm(cudaStream_t s, DataType t, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                    float alpha, const void* a, int64_t stride_a, const void* b, int64_t stride_b,
                    float beta, void* y, int64_t batch) {
  const cudaDataType_t dt = cublas_dtype(t);
  const cublasComputeType_t ct = compute_type(t);
  cublasHandle_t h = cublas_handle(s);
  // bf16 / f16: partial sums (split-K) are reduced in float32, not in Y's dtype, which would round
  // Y more than once (cuBLAS allows that by default); cublas_handle() resets the mode per call.
  if (t != DataType::kFloat)
    OT_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Column-major view: b is (N,K) [ld N] or, with tb, (K,N) [ld K]; a likewise.
  const int ldb = static_cast<int>(tb ? k : n), lda = static_cast<int>(ta ? m : k);
  const int ni = static_cast<int>(n), mi = static_cast<int>(m), ki = static_cast<int>(k);
  if (batch == 1) {
    OT_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, ni, mi, ki, &alpha, b, dt, ldb, a, dt, lda,
                                 &beta, y, dt, ni, ct, CUBLAS_GEMM_DEFAULT));
    return;
  }
  OT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, op_b, op_a, ni, mi, ki, &alpha, b, dt, ldb, static_cast<long long>(stride_b), a, dt, lda,
      static_cast<long long>(stride_a), &beta, y, dt, ni, static_cast<long long>(m * n),
      static_cast<int>(batch), ct, CUBLAS_GEMM_DEFAULT));
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
    dtype_ = require_gemm_dtype(where_, {a, b, c});
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
      dispatch_types(GemmT{}, dtype_, [&]<typename T>() {
        broadcast_c_kernel<T><<<blocks_for(m_ * n_), 256, 0, s>>>(
            ctx.input(2)->as<T>(), y.as<T>(), m_, n_, c_rows_, c_cols_);
        OT_CUDA_CHECK_LAUNCH();
      });
    }
    // beta = 0: cuBLAS does not read y (it may hold anything). In bf16 / f16 the bias is added
    // in float32 inside the product (beta * C) and Y rounded once, like the CPU's oneDNN Gemm.
    row_major_gemm(s, dtype_, ta_, tb_, m_, n_, k_, alpha_, ctx.input(0)->data, 0,
                   ctx.input(1)->data, 0, use_c_ ? beta_ : 0.0f, y.data, 1);
  }

 private:
  std::string where_;
  float alpha_, beta_;
  bool ta_, tb_;
  DataType dtype_ = DataType::kFloat;
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
    dtype_ = require_gemm_dtype(where_, {a, b});
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
    row_major_gemm(s, dtype_, false, false, m_, n_, k_, 1.0f, ctx.input(0)->data, stride_a_,
                   ctx.input(1)->data, stride_b_, 0.0f, y.data, batch_);
  }

 private:
  std::string where_;
  DataType dtype_ = DataType::kFloat;
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
