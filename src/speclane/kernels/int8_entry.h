// The int8-group kernels' entry points (included by int8_x86.c and int8_q8_x86.c, which
// differ in their arithmetic and their weights' layout, not in how they are called).
#ifndef SPECLANE_INT8_ENTRY_H
#define SPECLANE_INT8_ENTRY_H

#include <immintrin.h>
#include <stdint.h>

#include "int8_packed.h"  // tile_bytes, pair_values

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
    for (int i = 0; i < count; i++) {
        const size_t tile = (size_t)(ids[i] / 16), lane = (size_t)(ids[i] % 16);
        const uint8_t *base = (const uint8_t *)q + tile * tile_bytes(format, K);
        float *y = out + (size_t)i * K;
        for (int g = 0; g < groups; g++) {
            const size_t at = (tile * groups + g) * 16 + lane;
            const float s = half ? _cvtsh_ss(((const uint16_t *)scale)[at]) : ((const float *)scale)[at];
            const float m = !minimum ? 0.0f : half ? _cvtsh_ss(((const uint16_t *)minimum)[at]) : ((const float *)minimum)[at];
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
