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

// to_bf16 for 8 floats, in the low 16 bits of each 32-bit lane (NaN stays NaN).
INLINE __m256i to_bf16_8(__m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    return _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(is_nan));
}

INLINE __m128i pack_bf16_8(__m256 f) {  // 8 float32 -> 8 bfloat16 (to_bf16's bits), packed
    const __m256i h = to_bf16_8(f);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08));
}

INLINE void store_bf16(uint16_t *p, __m256 f) { _mm_storeu_si128((__m128i *)p, pack_bf16_8(f)); }
#ifdef __AVX512F__
INLINE void store_bf16_16(uint16_t *p, __m512 f) {  // 16 float32 -> 16 bfloat16, as store_bf16 rounds
    store_bf16(p, _mm512_castps512_ps256(f));
    store_bf16(p + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
}
#endif

// 32 bfloat16 inputs into v[0..3] as float32, and the bits of their largest magnitude:
// for floats without their sign, integer order is magnitude order, and infinities and NaNs
// sort above every finite value (a group's scan in grid.h and q8_inputs.h).
INLINE uint32_t load_group_max_bits(const uint16_t *x, __m256 v[4]) {
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        v[i] = load_bf16(x + 8 * i);
        m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(v[i]), magnitude));
    }
    m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
    return (uint32_t)_mm256_cvtsi256_si32(m);
}

INLINE __m256 round_bf16_8(__m256 f) {  // float32 -> nearest bfloat16 -> float32
    return _mm256_castsi256_ps(_mm256_slli_epi32(to_bf16_8(f), 16));
}

#ifdef __AVX512F__
// to_bf16 for 16 floats, in the low 16 bits of each 32-bit lane (NaN stays NaN).
INLINE __m512i to_bf16_16(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), rounded, nan);
}
#endif

#endif
