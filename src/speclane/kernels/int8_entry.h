// The int8-group kernels' entry points (included by int8_x86.c and int8_q8_x86.c, which
// differ in their arithmetic and their weights' layout, not in how they are called).
#ifndef SPECLANE_INT8_ENTRY_H
#define SPECLANE_INT8_ENTRY_H

#include <immintrin.h>
#include <stdint.h>

#include "int8_packed.h"  // tile_bytes, pair_values

#define ROWS_IN_PARALLEL 32  // int8_rows_of: fewer rows run on the calling thread

// out [count][K] float32: the weight rows ids[0..count) as the kernels multiply by them,
// q * scale + minimum per group of G (two roundings, as torch's q.float() * scale +
// minimum): an embedding's lookup and the output head's exact refinement. q: [N/16][K][16]
// int8, in quads [N/16][K/4][64] (byte 4c + i of quad k: column c, input 4k + i), or in
// fewer bits (int8_packed.h; ``format``); scale and minimum [N/16][K/G][16], float16 where
// half. Returns -1 (and writes nothing) where an id is outside [0, N), else 0.
static int int8_rows_of(const int8_t *q, int quads, int format, const void *scale, const void *minimum, int half,
                        const int64_t *ids, int count, int N, int K, int G, float *out) {
    const int groups = K / G;
    for (int i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= N) return -1;
    // Rows in parallel where there are many (the head's refinement: 32 candidates a row of the tick).
    #pragma omp parallel for schedule(static) if (count >= ROWS_IN_PARALLEL)
    for (int i = 0; i < count; i++) {
        const size_t tile = (size_t)(ids[i] / 16), lane = (size_t)(ids[i] % 16);
        const uint8_t *base = (const uint8_t *)q + tile * tile_bytes(format, K);
        float *y = out + (size_t)i * K;
        for (int g = 0; g < groups; g++) {
            const size_t at = (tile * groups + g) * 16 + lane;
            const float s = half ? _cvtsh_ss(((const uint16_t *)scale)[at]) : ((const float *)scale)[at];
            const float m = !minimum ? 0.0f : half ? _cvtsh_ss(((const uint16_t *)minimum)[at]) : ((const float *)minimum)[at];
            if (!quads && FORMAT_BITS(format) == 8 && G % 8 == 0) {
                // The int8 layout, 8 inputs at a time: the dword holding each one's byte (16 bytes
                // an input), the byte shifted to the top and back (sign-extended); the same two
                // roundings as below.
                const __m256i offsets = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
                const __m128i up = _mm_cvtsi32_si128(24 - 8 * (int)(lane & 3));
                const uint8_t *column = base + (lane & ~(size_t)3);
                for (int k = g * G; k < (g + 1) * G; k += 8) {
                    const __m256i words = _mm256_i32gather_epi32((const int *)(column + (size_t)k * 16), offsets, 1);
                    __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sll_epi32(words, up), 24)),
                                             _mm256_set1_ps(s));
                    if (minimum) w = _mm256_add_ps(w, _mm256_set1_ps(m));
                    _mm256_storeu_ps(y + k, w);
                }
                continue;
            }
            for (int k = g * G; k < (g + 1) * G; k += 2) {  // G is even: inputs k and k + 1 together
                int8_t pair[32];  // the pair's values in the int8 layout's order (int8_packed.h)
                if (!quads) _mm256_storeu_si256((__m256i *)pair, pair_values(base, format, k));
                for (int j = 0; j < 2; j++) {
                    const int value = quads ? (int8_t)base[(size_t)((k + j) / 4) * 64 + 4 * lane + (k + j) % 4]
                                            : pair[16 * j + lane];
                    const float w = (float)value * s;
                    y[k + j] = minimum ? w + m : w;
                }
            }
        }
    }
    return 0;
}

// The entry points of a kernel file that defines matmul(half, x, q, scale, minimum, y, M, N,
// K, G, format) (half: float16 scales and minimums, else float32; format: int8_packed.h's);
// QUADS: its weights' layout (int8_rows_of).
#define INT8_ENTRY_POINTS(QUADS)                                                                                        \
    /* y = x @ W^T. x: [M][K] bfloat16, y: [M][N] bfloat16; G divides K, 16 divides N (the caller checks and */      \
    /* passes contiguous tensors). minimum: NULL where the weight has none; format: q's (int8_packed.h). */          \
    void int8_matmul(const uint16_t *x, const int8_t *q, const float *scale, const float *minimum, uint16_t *y,       \
                     int M, int N, int K, int G, int format) {                                                        \
        matmul(0, x, q, scale, minimum, y, M, N, K, G, format);                                                       \
    }                                                                                                                 \
    /* int8_matmul with float16 scales and minimums (the same bits for the same values). */                           \
    void int8_matmul_h(const uint16_t *x, const int8_t *q, const uint16_t *scale, const uint16_t *minimum,            \
                       uint16_t *y, int M, int N, int K, int G, int format) {                                         \
        matmul(1, x, q, scale, minimum, y, M, N, K, G, format);                                                       \
    }                                                                                                                 \
    /* int8_matmul and int8_matmul_h with op.h's arguments: x, q, scale, minimum, y, M, N, K, G, format. */           \
    void int8_matmul_op(const int64_t *a) {                                                                           \
        int8_matmul(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), (int)a[5], (int)a[6],       \
                    (int)a[7], (int)a[8], (int)a[9]);                                                                 \
    }                                                                                                                 \
    void int8_matmul_h_op(const int64_t *a) {                                                                         \
        int8_matmul_h(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), (int)a[5], (int)a[6],     \
                      (int)a[7], (int)a[8], (int)a[9]);                                                               \
    }                                                                                                                 \
    int int8_rows(const int8_t *q, const void *scale, const void *minimum, int half, const int64_t *ids, int count,   \
                  int N, int K, int G, int format, float *out) {                                                      \
        return int8_rows_of(q, QUADS, format, scale, minimum, half, ids, count, N, K, G, out);                        \
    }

#endif
