// bfloat16 <-> float32 for our C kernels (included by int4_x86.c, attention_x86.c and norm_x86.c).
#ifndef SPECLANE_BF16_H
#define SPECLANE_BF16_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE __m256 load_bf16(const uint16_t *p) {  // 8 bfloat16 -> 8 float32 (exact: a 16-bit shift)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

INLINE float from_bf16(uint16_t h) {  // one bfloat16 -> float32 (exact)
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

INLINE uint16_t to_bf16(float f) {  // round to nearest even, as torch does; NaN stays NaN
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

#endif
