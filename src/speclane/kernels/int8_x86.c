// Weight-only int8-group matmul for x86-64: bfloat16 activations, float32 accumulation,
// bfloat16 output. Built twice by build.py and loaded by int8_cpu.py: for AVX-512 and for
// AVX2 + FMA + F16C. It runs the GGUF types whose values do not fit our int4 kernel's
// 0..15 (Q8_0, Q6_K, Q5_0, Q5_1, Q5_K): each keeps its own integers, widened to int8.
//
// The arithmetic: a weight is w = q * scale + minimum (q an int8, one float32 scale and
// minimum per G input columns, a "group"; G is 32 or 16), so a group's share of an output is
//     scale * sum(x[k] * q[k]) + minimum * sum(x[k]).
// A product of a bfloat16 input (8 significant bits) and an int8 (8 bits) is exact in
// float32; the sums round. Every output element is one fixed sequence of operations,
// whatever the number of rows M, the thread split and the build:
//     acc = 0;  per group:  d = 0;  for k in the group, in order:  d = fma(x[k], q[k], d)
//                           acc = fma(scale, d, acc);  [acc = fma(minimum, sum_x, acc)]
// with sum_x the group's inputs added left to right in float32 (only where the weight has
// minimums). Each output column is one vector lane, so a row's result does not depend on
// the other rows of its call (batch invariance) nor on the build (AVX-512 and AVX2 do the
// same lane operations). Unlike the int4 kernel the inputs are not rounded to a grid: no
// kernel here adds a group in an order of its own, so none is needed.
//
// Layout (int8_cpu.pack): q [N/16][K][16] int8 (lane j of input column k: column n0+j),
// scale and minimum [N/16][K/G][16] float32 (minimum may be NULL: no minimum term).
// int8_matmul_h takes them in float16 instead: where every scale and minimum is a float16
// (Q8_0, Q5_0 and Q5_1 store theirs so) it keeps half the bytes, and widening a float16 to
// float32 is exact, so both entry points compute the same bits.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "vec.h"  // vec, VW, v_zero / v_bcast / v_fma / v_load / v_store
#include "q4.h"  // input_buffer_for: the calling thread's scratch
#include "int8_entry.h"  // int8_rows_of, INT8_ENTRY_POINTS
#include "op.h"

#define LANES 16  // output columns per packed tile
#define UNROLL _Pragma("GCC unroll 16")

#ifdef __AVX512F__
#define ROW_BLOCK 8  // rows sharing a tile's widened weights: 8 partial + 8 running sums
#define TILES_ONE_ROW 4  // a one-row call's tiles per rows_tile: 4 chains of one vector each
// Blocks of 2-6 rows: tiles per rows_tile so that each has at least 8 chains (1-3 rows 4
// tiles, 4-6 rows 2; 2 tiles of 7 rows would need 31 registers). One tile a call left a
// 2-row call of the lm head at 1.9x the time of a one-row call (2 chains, bound by the
// multiply-add's latency).
#define FEW_ROWS 6
#define TILES_FOR(R) ((R) <= 3 ? 4 : 2)
INLINE vec v_int8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
INLINE vec v_half(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
#else
#define ROW_BLOCK 3  // a tile is two vectors: 6 partial + 6 running sums + 2 weights + a broadcast
#define TILES_ONE_ROW 4  // a one-row call's tiles per rows_tile: 8 chains (the running sums spill, once a group)
#define FEW_ROWS 1  // 16 registers: more rows take one tile a call (two vectors: 2R chains)
#define TILES_FOR(R) TILES_ONE_ROW
INLINE vec v_int8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
INLINE vec v_half(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#endif
// A scale or minimum vector: float32, or float16 widened (exact) where ``half``.
INLINE vec v_param(const void *base, size_t at, const int half) {
    return half ? v_half((const uint16_t *)base + at) : v_load((const float *)base + at);
}
#define NV (LANES / VW)

typedef struct {
    const int8_t *q;
    const void *scale, *minimum;  // float32, or float16 where the call is int8_matmul_h's
    int n, k, group;
} q8_weight;

// R rows (R <= ROW_BLOCK) of one 16-column tile; R and HALF (float16 scales and minimums)
// are compile-time constants once inlined.
// R rows (R <= ROW_BLOCK) of TT adjacent 16-column tiles; R, TT and HALF (float16 scales
// and minimums) are compile-time constants once inlined. One row has one dependent chain of
// multiply-adds per vector of columns: TT tiles side by side give the core TT times as many
// independent chains to overlap (the lm head's one-row step, a 49152 x 576 int8 weight, is
// otherwise bound by the multiply-add's latency), and no column's operations change.
INLINE void rows_tile(const int R, const int TT, const int HALF, const q8_weight *w, const float *x, const float *sums,
                      int tile0, uint16_t *y) {
    const int K = w->k, N = w->n, G = w->group, groups = K / G;
    vec acc[TILES_ONE_ROW][ROW_BLOCK][NV];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) acc[t][r][v] = v_zero();
    for (int g = 0; g < groups; g++) {
        vec d[TILES_ONE_ROW][ROW_BLOCK][NV];
        UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) d[t][r][v] = v_zero();
        for (int k = g * G; k < (g + 1) * G; k++) {
            UNROLL for (int t = 0; t < TT; t++) {
                const int8_t *q = w->q + (size_t)(tile0 + t) * K * LANES;
                vec wq[NV];
                UNROLL for (int v = 0; v < NV; v++) wq[v] = v_int8(q + (size_t)k * LANES + VW * v);
                UNROLL for (int r = 0; r < R; r++) {
                    const vec xv = v_bcast(x + (size_t)r * K + k);
                    UNROLL for (int v = 0; v < NV; v++) d[t][r][v] = v_fma(xv, wq[v], d[t][r][v]);
                }
            }
        }
        UNROLL for (int t = 0; t < TT; t++) {
            const size_t at = ((size_t)(tile0 + t) * groups + g) * LANES;
            UNROLL for (int v = 0; v < NV; v++) {
                const vec s = v_param(w->scale, at + VW * v, HALF);
                UNROLL for (int r = 0; r < R; r++) acc[t][r][v] = v_fma(s, d[t][r][v], acc[t][r][v]);
            }
            if (w->minimum) {
                UNROLL for (int v = 0; v < NV; v++) {
                    const vec m = v_param(w->minimum, at + VW * v, HALF);
                    UNROLL for (int r = 0; r < R; r++) acc[t][r][v] = v_fma(m, v_bcast(sums + (size_t)r * groups + g), acc[t][r][v]);
                }
            }
        }
    }
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) {
        float out[LANES];
        UNROLL for (int v = 0; v < NV; v++) v_store(out + VW * v, acc[t][r][v]);
        UNROLL for (int j = 0; j < LANES; j += 8)
            store_bf16(y + (size_t)r * N + (size_t)(tile0 + t) * LANES + j, _mm256_loadu_ps(out + j));
    }
}

#define ANY_ROWS_TILE(name, HALF)                                                                               \
    static void name(int R, const q8_weight *w, const float *x, const float *sums, int tile, uint16_t *y) {       \
        switch (R) { /* a compile-time R per case: the sums stay in registers */                                 \
        case 1: rows_tile(1, 1, HALF, w, x, sums, tile, y); break;                                               \
        case 2: rows_tile(2, 1, HALF, w, x, sums, tile, y); break;                                               \
        MORE_CASES(HALF)                                                                                         \
        default: rows_tile(ROW_BLOCK, 1, HALF, w, x, sums, tile, y); break;                                      \
        }                                                                                                        \
    }                                                                                                            \
    static void name##_few_rows(int R, const q8_weight *w, const float *x, const float *sums, int tile, uint16_t *y) { \
        switch (R) { /* TILES_FOR(R) tiles from ``tile`` */                                                      \
        case 1: rows_tile(1, TILES_FOR(1), HALF, w, x, sums, tile, y); break;                                    \
        FEW_CASES(HALF)                                                                                          \
        }                                                                                                        \
    }
#if FEW_ROWS > 1
#define FEW_CASES(HALF)                                                                                          \
    case 2: rows_tile(2, TILES_FOR(2), HALF, w, x, sums, tile, y); break;                                        \
    case 3: rows_tile(3, TILES_FOR(3), HALF, w, x, sums, tile, y); break;                                        \
    case 4: rows_tile(4, TILES_FOR(4), HALF, w, x, sums, tile, y); break;                                        \
    case 5: rows_tile(5, TILES_FOR(5), HALF, w, x, sums, tile, y); break;                                        \
    case 6: rows_tile(6, TILES_FOR(6), HALF, w, x, sums, tile, y); break;
#else
#define FEW_CASES(HALF)
#endif
#if ROW_BLOCK > 3
#define MORE_CASES(HALF)                                                                                         \
    case 3: rows_tile(3, 1, HALF, w, x, sums, tile, y); break;                                                   \
    case 4: rows_tile(4, 1, HALF, w, x, sums, tile, y); break;                                                   \
    case 5: rows_tile(5, 1, HALF, w, x, sums, tile, y); break;                                                   \
    case 6: rows_tile(6, 1, HALF, w, x, sums, tile, y); break;                                                   \
    case 7: rows_tile(7, 1, HALF, w, x, sums, tile, y); break;
#else
#define MORE_CASES(HALF)
#endif
ANY_ROWS_TILE(rows_tile_f32, 0)
ANY_ROWS_TILE(rows_tile_f16, 1)

typedef void (*tile_fn)(int, const q8_weight *, const float *, const float *, int, uint16_t *);
typedef tile_fn few_rows_fn;  // TILES_FOR(R) tiles a call (R <= FEW_ROWS)

static void matmul(tile_fn any_rows_tile, few_rows_fn few_rows, const uint16_t *x, const int8_t *q, const void *scale, const void *minimum,
                   uint16_t *y, int M, int N, int K, int G) {
    const int groups = K / G;
    const size_t n = (size_t)M * K;
    const size_t x_floats = (n + 15) / 16 * 16;
    float *x32 = input_buffer_for(x_floats + (size_t)M * groups);
    float *sums = x32 + x_floats;
    for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x32 + i, load_bf16(x + i));
    for (size_t i = n / 8 * 8; i < n; i++) x32[i] = from_bf16(x[i]);
    if (minimum)
        for (int r = 0; r < M; r++)
            for (int g = 0; g < groups; g++) {
                float s = 0.0f;  // left to right: -ffp-contract=off and no -ffast-math keep this order
                for (int k = g * G; k < (g + 1) * G; k++) s += x32[(size_t)r * K + k];
                sums[(size_t)r * groups + g] = s;
            }
    const q8_weight w = {q, scale, minimum, N, K, G};
    const int tiles = N / LANES;
    // TILES_ONE_ROW tiles at a time: the full blocks of ROW_BLOCK rows one tile a call (a
    // tile's weights stay in L1 from one block to the next), then a last block of at most
    // FEW_ROWS rows TILES_FOR(R) tiles a call (see rows_tile); the last few tiles one at a
    // time. (TILES_FOR(R) divides TILES_ONE_ROW.)
    // schedule(dynamic): a thread slowed by another process on its core takes fewer tiles instead of
    // holding the others at the barrier; a tile's outputs are one thread's, so the split never changes a bit.
    const int last = M % ROW_BLOCK, full = M - last;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < tiles; t += TILES_ONE_ROW) {
        const int end = t + TILES_ONE_ROW < tiles ? t + TILES_ONE_ROW : tiles;
        for (int u = t; u < end; u++)
            for (int r0 = 0; r0 < full; r0 += ROW_BLOCK) any_rows_tile(ROW_BLOCK, &w, x32 + (size_t)r0 * K, sums + (size_t)r0 * groups, u, y + (size_t)r0 * N);
        if (last == 0) continue;
        const float *xr = x32 + (size_t)full * K, *sr = sums + (size_t)full * groups;
        uint16_t *yr = y + (size_t)full * N;
        if (last <= FEW_ROWS && end == t + TILES_ONE_ROW)
            for (int u = t; u < end; u += TILES_FOR(last)) few_rows(last, &w, xr, sr, u, yr);
        else
            for (int u = t; u < end; u++) any_rows_tile(last, &w, xr, sr, u, yr);
    }
}

INT8_ENTRY_POINTS(0)
