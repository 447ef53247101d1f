/* kvlab's kernels' eight-lane vectors: float and int32 lanes in the compiler's vector types (GCC and
   Clang), whatever instructions -march gives them, and the loads, stores and sums the kernels share
   (paged_attention.cpp, greedy_pick.cpp). */
#pragma once

#include <stdint.h>
#include <string.h>

/* Every function taking or returning these types is static inline: none crosses the library's boundary,
   so how a CPU without AVX would pass them between libraries concerns none (the loader's -Wno-psabi). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8f load8(const float* p) { v8f v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float* p, v8f v) { memcpy(p, &v, sizeof v); }
static inline float sum8(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
