// OT_HOST_DEVICE: a header-only rule both the CPU kernels and the CUDA kernels (nvcc) compile.
#pragma once

#if defined(__CUDACC__)
#define OT_HOST_DEVICE __host__ __device__
#else
#define OT_HOST_DEVICE
#endif
