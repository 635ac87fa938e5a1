// OT_SIMD_CLONES: a hot loop of our own CPU kernels compiled three times -- for x86-64-v4
// (AVX-512), x86-64-v3 (AVX2 + FMA) and the baseline -- with the widest the CPU runs picked once
// at load time (GCC's function multi-versioning, an ifunc). The project builds for baseline
// x86-64 so that its binaries run on any x86-64 CPU; without this our loops (BatchNormalization
// and its gradient, the optimizers) never use wider than SSE2 vectors, while oneDNN's JIT
// kernels use the CPU's widest. Measured on AMD EPYC (Zen 4), ResNet-50 64² b16, 1 thread,
// the project built with -march=native against the baseline: BatchNormalizationGrad 38.5 ->
// 26.5-29.5 ms per step, Adam 20 -> 16.6-18, BatchNormalization 12 -> 9.7-10.7.
//
// Put it on free functions (templates too) that hold the loop; lambdas called from them are
// inlined into each clone. The clones may round differently from one another where the wider
// ISA contracts a*b+c into an FMA: results are reproducible on one machine (every replica and
// every run takes the same clone), as oneDNN's are, not across CPU generations.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define OT_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OT_SIMD_CLONES
#endif
