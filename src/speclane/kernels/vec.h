// The build's float vector and the five operations on it that the matmul kernels share
// (included by int4_x86.c and int8_x86.c): 16 floats under AVX-512, 8 under AVX2.
#ifndef SPECLANE_VEC_H
#define SPECLANE_VEC_H

#include "bf16.h"  // INLINE, immintrin.h

#ifdef __AVX512F__
#define VW 16  // floats per vector: one vector covers a tile's 16 columns
typedef __m512 vec;
INLINE vec v_zero(void) { return _mm512_setzero_ps(); }
INLINE vec v_bcast(const float *p) { return _mm512_set1_ps(*p); }
INLINE vec v_fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
INLINE vec v_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void v_store(float *p, vec v) { _mm512_storeu_ps(p, v); }
#else
#define VW 8
typedef __m256 vec;
INLINE vec v_zero(void) { return _mm256_setzero_ps(); }
INLINE vec v_bcast(const float *p) { return _mm256_broadcast_ss(p); }
INLINE vec v_fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
INLINE vec v_load(const float *p) { return _mm256_loadu_ps(p); }
INLINE void v_store(float *p, vec v) { _mm256_storeu_ps(p, v); }
#endif

#endif
