// A call's inputs on a grid, and the calling thread's scratch (included by q4.h and the
// int8-group kernel, int8_x86.c).
//
// The grid: each group of 32 inputs rounded (to nearest, ties to even) to a multiple of
// 2^(E - bits), E the exponent of the group's largest magnitude. Why: every product x q
// with an integer q is then a multiple of that step, so where the kernel's q and ``bits``
// keep a group's sum under 2^24 steps (int4: q in 0..15 and 14 bits, q4.h; int8: |q| <=
// 128 and 11 bits, int8_x86.c) the sum is exact in float32 in any order of addition, and
// in int32 as integers. Whatever adds the products (FMAs one by one, vdpbf16ps, vpdpwssd
// on the inputs in steps, an AMX tile unit whose order is not documented) gets the same
// bits. The cost: an input whose exponent is at least E - (bits - 7) is unchanged (a
// bfloat16 has 8 significant bits); a smaller one is rounded to the step, an error of at
// most 2^(E - bits - 1) (a bfloat16's own rounding is up to 2^-8 of its value), and a
// rounded input is still a bfloat16. The range where that holds: a group whose largest is
// below 2^-112 is set to zero (a step below float32's normal range, where vdpbf16ps and the
// tile unit flush and FMAs do not, would make the kernels differ); one whose largest is
// 2^(105 + bits) or more, or infinite or NaN, is passed as it is (round_group's constant
// would overflow), and there the kernels' sums are not exact: they may differ, and the
// integer paths step aside (inputs_in_steps). Activations live far inside that range.
#ifndef SPECLANE_GRID_H
#define SPECLANE_GRID_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define GRID_GROUP 32  // inputs sharing a step

// Whether a group whose largest has biased exponent ``exponent`` is outside the grid's
// range at the top (2^(105 + bits) and above, Inf, NaN).
INLINE int above_grid(int exponent, int bits) { return exponent > 127 + 104 + bits; }

INLINE void round_group(const uint16_t *x, uint16_t *out, const int bits) {
    __m256 v[4];
    const int exponent = (int)(load_group_max_bits(x, v) >> 23);  // biased
    if (exponent < 127 - 112) {  // below 2^-112, zero and subnormals included
        memset(out, 0, GRID_GROUP * sizeof(uint16_t));
        return;
    }
    if (above_grid(exponent, bits)) {
        memcpy(out, x, GRID_GROUP * sizeof(uint16_t));
        return;
    }
    // 1.5 * 2^(E + 23 - bits): x + c lies in [2^(E+23-bits), 2^(E+24-bits)), where float32's step is 2^(E-bits).
    const __m256 c = _mm256_castsi256_ps(_mm256_set1_epi32((int)(((uint32_t)(exponent + 23 - bits) << 23) | 0x400000u)));
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

// Whether every group of n rounded inputs lies on the grid (none above its range): a
// kernel whose integer path needs the whole call on it checks first.
static inline int inputs_on_grid(const uint16_t *rounded, size_t n, const int bits) {
    for (size_t at = 0; at < n; at += GRID_GROUP) {
        __m256 v[4];
        if (above_grid((int)(load_group_max_bits(rounded + at, v) >> 23), bits)) return 0;
    }
    return 1;
}

// A call's inputs as its loops read them: rounded (round_group) into rounded [M][K], and,
// where ``sums`` is not NULL, each row's group sums of the rounded inputs into sums
// [M][K/32]. Rows are split between threads from 8 rows on (a row's results do not depend
// on the split).
static inline void prepare_inputs(const uint16_t *x, uint16_t *rounded, float *sums, int M, int K, const int bits) {
    const int groups = K / GRID_GROUP;
    #pragma omp parallel for schedule(static) if (M >= 8)
    for (int r = 0; r < M; r++)
        for (int g = 0; g < groups; g++) {
            const size_t at = (size_t)r * K + (size_t)g * GRID_GROUP;
            round_group(x + at, rounded + at, bits);
            if (sums) sums[(size_t)r * groups + g] = group_sum(rounded + at);
        }
}

// The rounded inputs in steps (int16: below 2^(bits + 1) steps, bits <= 14) and each
// group's step, for the integer paths; returns 0 where a group is above the grid's range
// (round_group passed it as it is), and the call then takes a float path.
static inline int inputs_in_steps(const uint16_t *rounded, int16_t *x, float *step, int M, int K, const int bits) {
    const int groups = K / GRID_GROUP;
    for (int r = 0; r < M; r++)
        for (int g = 0; g < groups; g++) {
            const size_t at = (size_t)r * K + (size_t)g * GRID_GROUP;
            __m256 v[4];
            const int exponent = (int)(load_group_max_bits(rounded + at, v) >> 23);  // biased
            if (above_grid(exponent, bits)) return 0;
            // A zeroed group (below 2^-112) is all zeros: any step will do.
            const int e = exponent < 127 - 112 ? 127 : exponent;
            const uint32_t step_bits = (uint32_t)(e - bits) << 23, inverse_bits = (uint32_t)(254 - e + bits) << 23;
            memcpy(step + (size_t)r * groups + g, &step_bits, sizeof step_bits);
            float inverse;
            memcpy(&inverse, &inverse_bits, sizeof inverse);
            const __m256 scale = _mm256_set1_ps(inverse);
            for (int i = 0; i < 4; i += 2) {  // exact: integers below 2^(bits + 1)
                const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale)), hi = _mm256_cvtps_epi32(_mm256_mul_ps(v[i + 1], scale));
                const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
                _mm256_storeu_si256((__m256i *)(x + at + 8 * i), packed);
            }
        }
    return 1;
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

#endif
