// Run-time ISA dispatch for the backend's own loops. oneDNN picks its kernels at run time; our
// loops do the same: BLEND_MULTIVERSION (core/multiversion.h) compiles a function for AVX-512,
// AVX2 and baseline x86-64 and the loader picks the best the CPU has. Never a build-time
// -march: the same binary runs on AMD (AVX-512 + BF16) and Intel (AMX) machines.
#pragma once

#include "core/multiversion.h"

#if BLEND_HAVE_MULTIVERSION
#define BLEND_HAVE_AVX512_DISPATCH 1
#define BLEND_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx2")))
#else
#define BLEND_HAVE_AVX512_DISPATCH 0
#define BLEND_TARGET_AVX512
#endif

namespace blend::cpu {

// True when the AVX-512 kernels may run (the CPU has AVX-512F/BW/DQ/VL and they were compiled
// in) and the test hook below has not turned them off.
bool use_avx512();
// Tests: force the portable kernels, to check them against the vector ones.
void set_force_portable_kernels(bool force);

}  // namespace blend::cpu
