// Run-time ISA dispatch for plain loops: BLEND_MULTIVERSION compiles a function for AVX-512,
// AVX2 and baseline x86-64, and the loader picks the best the CPU has (GCC target_clones).
// Never a build-time -march: one binary runs on every machine we have. The clones may round
// differently where the wider ISAs fuse multiply-adds.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BLEND_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define BLEND_HAVE_MULTIVERSION 1
#else
#define BLEND_MULTIVERSION
#define BLEND_HAVE_MULTIVERSION 0
#endif

namespace blend {

// Eight floats (or their bits) as one value: GCC's and clang's vector extension, which each clone
// compiles to its ISA's registers (two SSE registers on baseline x86-64) where plain loops would
// stay scalar. Casts between the two reinterpret the bits.
typedef float Floats8 __attribute__((vector_size(32)));
typedef int32_t Ints8 __attribute__((vector_size(32)));

}  // namespace blend
