// The int4 weight layout's shared pieces (included by int4_x86.c and int4_amx.c).
//
// packed: [N/16][K/2][16] bytes, byte j of pair p = q[n0+j][2p] | q[n0+j][2p+1] << 4;
// scale, minimum: [N/16][K/32][16] float16. See int4_x86.c for the arithmetic.
#ifndef SPECLANE_Q4_H
#define SPECLANE_Q4_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define Q4_GROUP 32  // input columns per (scale, minimum) pair: the .c files' GROUP

// The inputs as the int4 arithmetic reads them: each group of 32 rounded (to nearest, ties
// to even) to a multiple of 2^(E - GRID_BITS), E the exponent of the group's largest
// magnitude. Why: every product x q is then a multiple of that step (q is an integer) and
// below 2^(E + 5), so a group's sum of 32 is an integer multiple under 2^(E + 10) — under
// 2^24 steps, exact in float32 in any order of addition. Whatever adds the products (two
// FMAs per pair, vdpbf16ps, an AMX tile unit whose order is not documented) gets the same
// bits. The cost: an input whose exponent is at least E - 7 is unchanged (a bfloat16 has 8
// significant bits); a smaller one is rounded to the step, an error of at most 2^(E - 15)
// (a bfloat16's own rounding is up to 2^-8 of its value), and a rounded input is still a
// bfloat16. The range where that holds: a group whose largest is below 2^-112 is set to
// zero (its step would be below float32's normal range, where vdpbf16ps and the tile unit
// flush and FMAs do not: the kernels would differ); one whose largest is 2^119 or more, or
// infinite or NaN, is passed as it is (the constant below would overflow), and there the
// kernels' sums are not exact: they may differ. Activations live far inside that range.
#define GRID_BITS 14

INLINE void round_group(const uint16_t *x, uint16_t *out) {
    __m256 v[4];
    const int exponent = (int)(load_group_max_bits(x, v) >> 23);  // biased
    if (exponent < 127 - 112) {  // below 2^-112, zero and subnormals included
        memset(out, 0, Q4_GROUP * sizeof(uint16_t));
        return;
    }
    if (exponent > 127 + 118) {  // 2^119 and above, Inf, NaN
        memcpy(out, x, Q4_GROUP * sizeof(uint16_t));
        return;
    }
    // 1.5 * 2^(E + 9): x + c lies in [2^(E+9), 2^(E+10)), where float32's step is 2^(E-14).
    const __m256 c = _mm256_castsi256_ps(_mm256_set1_epi32((int)(((uint32_t)(exponent + 23 - GRID_BITS) << 23) | 0x400000u)));
    for (int i = 0; i < 4; i++) store_bf16(out + 8 * i, _mm256_sub_ps(_mm256_add_ps(v[i], c), c));  // exact in bfloat16
}


// The sum of 32 bfloat16 inputs in one fixed order (the same code in every build):
// x[i] + x[i+16], then halves folded 8, 4, 2, 1.
INLINE float group_sum(const uint16_t *x) {
    const __m256 c = _mm256_add_ps(_mm256_add_ps(load_bf16(x), load_bf16(x + 16)),
                                   _mm256_add_ps(load_bf16(x + 8), load_bf16(x + 24)));
    const __m128 d = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    const __m128 e = _mm_add_ps(d, _mm_movehl_ps(d, d));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

// A call's inputs as its loops read them: rounded (round_group) into rounded [M][K], and
// each row's group sums of the rounded inputs into sums [M][K/32]. Rows are split between
// threads from 8 rows on (a row's results do not depend on the split).
static void prepare_inputs(const uint16_t *x, uint16_t *rounded, float *sums, int M, int K) {
    const int groups = K / Q4_GROUP;
    #pragma omp parallel for schedule(static) if (M >= 8)
    for (int r = 0; r < M; r++)
        for (int g = 0; g < groups; g++) {
            const size_t at = (size_t)r * K + (size_t)g * Q4_GROUP;
            round_group(x + at, rounded + at);
            sums[(size_t)r * groups + g] = group_sum(rounded + at);
        }
}

// A call's scratch (the inputs' group sums, and what else a kernel keeps per row) lives in
// a buffer of the calling thread's that grows to the largest call and is kept: a prefill's
// calls would otherwise each map and fault in a fresh ~0.5 MB, and a one-row call would pay
// an allocation that is a good part of its own cost. A thread's buffer is freed when the
// thread exits (a thread-specific key's destructor).
typedef struct {
    float *data;
    size_t floats;
} input_buffer;

static pthread_key_t buffer_key;
static pthread_once_t buffer_key_once = PTHREAD_ONCE_INIT;

static void free_buffer(void *p) {
    input_buffer *buffer = p;
    free(buffer->data);
    free(buffer);
}

static void create_buffer_key(void) {
    if (pthread_key_create(&buffer_key, free_buffer)) abort();
}

// Out of memory for a few MB aborts: the process could not go on anyway, and this call
// has no way to report it.
static float *input_buffer_for(size_t floats) {
    pthread_once(&buffer_key_once, create_buffer_key);
    input_buffer *buffer = pthread_getspecific(buffer_key);
    if (!buffer) {
        if (!(buffer = calloc(1, sizeof *buffer)) || pthread_setspecific(buffer_key, buffer)) abort();
    }
    if (floats > buffer->floats) {
        free(buffer->data);
        buffer->floats = (floats + 15) / 16 * 16;
        if (!(buffer->data = aligned_alloc(64, buffer->floats * sizeof(float)))) abort();
    }
    return buffer->data;
}

#ifdef __AVX512BF16__
// 0..15 as bfloat16 (exact), twice: vpermw reads an index's low 5 bits (see unpack_pair).
static const uint16_t Q_BF16[32] __attribute__((aligned(64))) = {
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
INLINE __m512i unpack_pair_bf16(const uint8_t *bytes) {
    // Byte b = q0 | q1 << 4 in each lane; b | b << 12 holds q1 in its high word and q0 (with
    // q1's low bit above it, at bit 4: hence the table's second copy) in its low word.
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    return _mm512_permutexvar_epi16(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)), _mm512_load_si512(Q_BF16));
}
#endif

#endif
