// Weight-only int8-group matmul for x86-64: bfloat16 activations, float32 accumulation,
// bfloat16 output. Built three times by build.py and loaded by int8_cpu.py: for AVX-512
// with VNNI, for plain AVX-512 and for AVX2 + FMA + F16C. It runs the GGUF types whose
// values do not fit our int4 kernel's 0..15 (Q8_0, Q6_K, Q5_0, Q5_1, Q5_K): each keeps its
// own integers, widened to int8.
//
// The arithmetic: a weight is w = q * scale + minimum (q an int8, one float32 scale and
// minimum per G input columns, a "group"; G is 32 or 16), so a group's share of an output is
//     scale * sum(x[k] * q[k]) + minimum * sum(x[k]).
// The inputs are first rounded to their grid (grid.h, GRID_BITS below: an input 5 or more
// binades below its 32-input block's largest loses its low bits, an error of at most
// 2^-12 of that largest), on which a group's sum of products is exact in float32 and in
// int32, in any order. Every output element is one fixed sequence of operations,
// whatever the number of rows M, the thread split, the path and the build:
//     acc = 0;  per group:  d = sum(x[k] q[k]) (exact);  acc = fma(scale, d, acc);
//                           [acc = fma(minimum, sum_x, acc)]
// with sum_x the group's rounded inputs added left to right in float32 (only where the
// weight has minimums). The float path adds d by FMAs one input at a time; the VNNI build's
// integer path (rows_tile_int) adds the inputs in steps times q by vpdpwssd, two inputs an
// instruction, and scales the exact int32 by the step (a power of two): the same d. Each
// output column is one vector lane, so a row's result does not depend on the other rows of
// its call (batch invariance) nor on the build.
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
#include "grid.h"  // prepare_inputs, inputs_in_steps, input_buffer_for
#include "int8_entry.h"  // int8_rows_of, INT8_ENTRY_POINTS
#include "op.h"

#define LANES 16  // output columns per packed tile
#define UNROLL _Pragma("GCC unroll 16")
#define MAX_BLOCK 12  // the most rows of one tile call on either path (accumulator arrays' size)
// The grid (grid.h): |x| < 2^(E + 1) is below 2^12 steps of 2^(E - 11) and |q| <= 128 =
// 2^7, so a product is at most 2^19 steps and a group's sum of at most 32 at most 2^24:
// exact in float32 (and in int32).
#define GRID_BITS 11

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
#ifdef __AVX512VNNI__
#define INTEGER_PATH 1
// Rows sharing a tile's widened weights on the integer path: 12 int32 partial sums + 12
// running sums + the pair's weights + a broadcast of 32 registers.
#define INT_ROW_BLOCK 12
#else
#define INTEGER_PATH 0
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

// A call's inputs as the tiles read them, from row 0 of a block of rows.
typedef struct {
    const float *x;       // [rows][ld] the rounded inputs in float32 (the float path)
    const int16_t *xi;    // [rows][ld] the rounded inputs in steps (the integer path)
    const float *step;    // [rows][ld / 32] each 32 inputs' step (the integer path)
    const float *sums;    // [rows][ld / G] each group's sum of rounded inputs (weights with minimums)
    int ld, groups;
} q8_input;

INLINE q8_input rows_from(const q8_input *in, int r0) {
    const q8_input rows = {in->x ? in->x + (size_t)r0 * in->ld : NULL, in->xi ? in->xi + (size_t)r0 * in->ld : NULL,
                           in->step ? in->step + (size_t)r0 * (in->ld / GRID_GROUP) : NULL,
                           in->sums + (size_t)r0 * in->groups, in->ld, in->groups};
    return rows;
}

INLINE void store_rows(const int R, const int TT, vec acc[][MAX_BLOCK][NV], int N, int tile0, uint16_t *y) {
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) {
        float out[LANES];
        UNROLL for (int v = 0; v < NV; v++) v_store(out + VW * v, acc[t][r][v]);
        UNROLL for (int j = 0; j < LANES; j += 8)
            store_bf16(y + (size_t)r * N + (size_t)(tile0 + t) * LANES + j, _mm256_loadu_ps(out + j));
    }
}

// The float path: R rows (R <= ROW_BLOCK) of TT adjacent 16-column tiles; R, TT and HALF
// (float16 scales and minimums) are compile-time constants once inlined. One row has one
// dependent chain of multiply-adds per vector of columns: TT tiles side by side give the
// core TT times as many independent chains to overlap (the lm head's one-row step, a 49152
// x 576 int8 weight, is otherwise bound by the multiply-add's latency), and no column's
// operations change.
INLINE void rows_tile(const int R, const int TT, const int HALF, const q8_weight *w, const q8_input *in, int tile0,
                      uint16_t *y) {
    const int K = w->k, N = w->n, G = w->group, groups = K / G;
    vec acc[TILES_ONE_ROW][MAX_BLOCK][NV];
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
                    const vec xv = v_bcast(in->x + (size_t)r * in->ld + k);
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
                    UNROLL for (int r = 0; r < R; r++) acc[t][r][v] = v_fma(m, v_bcast(in->sums + (size_t)r * groups + g), acc[t][r][v]);
                }
            }
        }
    }
    store_rows(R, TT, acc, N, tile0, y);
}

#if INTEGER_PATH
// The integer path: rows_tile's arithmetic with d summed in int32 from the inputs in steps
// (R <= INT_ROW_BLOCK). Input columns 2p and 2p+1 of a tile's 16 columns, widened to int16,
// become one vector of pairs (q[2p][j], q[2p+1][j]) in lane j by one permute; vpdpwssd
// multiplies each pair by the row's two inputs and adds both products to the lane: a
// row costs one instruction per two inputs (the float path: two FMAs and, shared by the
// rows, four conversions).
static const uint16_t PAIR_ORDER[32] __attribute__((aligned(64))) = {
    0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

INLINE void rows_tile_int(const int R, const int TT, const int HALF, const q8_weight *w, const q8_input *in, int tile0,
                          uint16_t *y) {
    const int K = w->k, N = w->n, G = w->group, groups = K / G, steps = in->ld / GRID_GROUP;
    const __m512i order = _mm512_load_si512(PAIR_ORDER);
    vec acc[TILES_ONE_ROW][MAX_BLOCK][NV];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) acc[t][r][0] = v_zero();
    for (int g = 0; g < groups; g++) {
        __m512i d[TILES_ONE_ROW][INT_ROW_BLOCK];
        UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) d[t][r] = _mm512_setzero_si512();
        for (int k = g * G; k < (g + 1) * G; k += 2) {
            UNROLL for (int t = 0; t < TT; t++) {
                const int8_t *q = w->q + ((size_t)(tile0 + t) * K + k) * LANES;
                const __m512i pairs = _mm512_permutexvar_epi16(order, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)q)));
                UNROLL for (int r = 0; r < R; r++) {
                    int32_t two;  // x[k] (low half) and x[k+1], as in a lane of pairs
                    memcpy(&two, in->xi + (size_t)r * in->ld + k, sizeof two);
                    d[t][r] = _mm512_dpwssd_epi32(d[t][r], pairs, _mm512_set1_epi32(two));
                }
            }
        }
        UNROLL for (int t = 0; t < TT; t++) {
            const size_t at = ((size_t)(tile0 + t) * groups + g) * LANES;
            const vec s = v_param(w->scale, at, HALF);
            const vec m = w->minimum ? v_param(w->minimum, at, HALF) : v_zero();
            UNROLL for (int r = 0; r < R; r++) {
                const vec dot = _mm512_mul_ps(_mm512_cvtepi32_ps(d[t][r]), v_bcast(in->step + (size_t)r * steps + g * G / GRID_GROUP));
                acc[t][r][0] = v_fma(s, dot, acc[t][r][0]);
                if (w->minimum) acc[t][r][0] = v_fma(m, v_bcast(in->sums + (size_t)r * groups + g), acc[t][r][0]);
            }
        }
    }
    store_rows(R, TT, acc, N, tile0, y);
}
#endif

// A path's tile functions: ``any`` runs R rows (R <= its block) of one tile, ``few`` R <=
// FEW_ROWS rows of TILES_FOR(R) tiles from ``tile``; R a compile-time constant per case.
typedef void (*tile_fn)(int, const q8_weight *, const q8_input *, int, uint16_t *);
#define CASE_ANY(TILE, HALF, r) case r: TILE(r, 1, HALF, w, in, tile, y); break;
#define CASE_FEW(TILE, HALF, r) case r: TILE(r, TILES_FOR(r), HALF, w, in, tile, y); break;
#if FEW_ROWS > 1
#define FEW_CASES(TILE, HALF) CASE_FEW(TILE, HALF, 2) CASE_FEW(TILE, HALF, 3) CASE_FEW(TILE, HALF, 4) CASE_FEW(TILE, HALF, 5) CASE_FEW(TILE, HALF, 6)
#else
#define FEW_CASES(TILE, HALF)
#endif
#define FEW_ROWS_TILE(name, TILE, HALF)                                                                          \
    static void name(int R, const q8_weight *w, const q8_input *in, int tile, uint16_t *y) {                      \
        switch (R) {                                                                                             \
        CASE_FEW(TILE, HALF, 1)                                                                                  \
        FEW_CASES(TILE, HALF)                                                                                    \
        }                                                                                                        \
    }
#if ROW_BLOCK > 3
#define FLOAT_CASES(HALF) CASE_ANY(rows_tile, HALF, 3) CASE_ANY(rows_tile, HALF, 4) CASE_ANY(rows_tile, HALF, 5) \
    CASE_ANY(rows_tile, HALF, 6) CASE_ANY(rows_tile, HALF, 7)
#else
#define FLOAT_CASES(HALF)
#endif
#define FLOAT_TILES(name, HALF)                                                                                  \
    static void name(int R, const q8_weight *w, const q8_input *in, int tile, uint16_t *y) {                      \
        switch (R) {                                                                                             \
        CASE_ANY(rows_tile, HALF, 1) CASE_ANY(rows_tile, HALF, 2) FLOAT_CASES(HALF)                              \
        default: rows_tile(ROW_BLOCK, 1, HALF, w, in, tile, y); break;                                           \
        }                                                                                                        \
    }                                                                                                            \
    FEW_ROWS_TILE(name##_few_rows, rows_tile, HALF)
FLOAT_TILES(float_tile_f32, 0)
FLOAT_TILES(float_tile_f16, 1)
#if INTEGER_PATH
#define INT_TILES(name, HALF)                                                                                    \
    static void name(int R, const q8_weight *w, const q8_input *in, int tile, uint16_t *y) {                      \
        switch (R) {                                                                                             \
        CASE_ANY(rows_tile_int, HALF, 1) CASE_ANY(rows_tile_int, HALF, 2) CASE_ANY(rows_tile_int, HALF, 3)       \
        CASE_ANY(rows_tile_int, HALF, 4) CASE_ANY(rows_tile_int, HALF, 5) CASE_ANY(rows_tile_int, HALF, 6)       \
        CASE_ANY(rows_tile_int, HALF, 7) CASE_ANY(rows_tile_int, HALF, 8) CASE_ANY(rows_tile_int, HALF, 9)       \
        CASE_ANY(rows_tile_int, HALF, 10) CASE_ANY(rows_tile_int, HALF, 11)                                      \
        default: rows_tile_int(INT_ROW_BLOCK, 1, HALF, w, in, tile, y); break;                                   \
        }                                                                                                        \
    }                                                                                                            \
    FEW_ROWS_TILE(name##_few_rows, rows_tile_int, HALF)
INT_TILES(int_tile_f32, 0)
INT_TILES(int_tile_f16, 1)
#endif

// Every tile, TILES_ONE_ROW tiles at a time: the full blocks of ``block`` rows one tile a
// call (a tile's weights stay in L1 from one block to the next), then a last block of at
// most FEW_ROWS rows TILES_FOR(R) tiles a call (see rows_tile); the last few tiles one at
// a time. (TILES_FOR(R) divides TILES_ONE_ROW.)
// schedule(dynamic): a thread slowed by another process on its core takes fewer tiles instead of
// holding the others at the barrier; a tile's outputs are one thread's, so the split never changes a bit.
static void over_tiles(tile_fn any, tile_fn few, int block, const q8_weight *w, const q8_input *in, uint16_t *y, int M) {
    const int tiles = w->n / LANES, last = M % block, full = M - last;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < tiles; t += TILES_ONE_ROW) {
        const int end = t + TILES_ONE_ROW < tiles ? t + TILES_ONE_ROW : tiles;
        for (int u = t; u < end; u++)
            for (int r0 = 0; r0 < full; r0 += block) {
                const q8_input rows = rows_from(in, r0);
                any(block, w, &rows, u, y + (size_t)r0 * w->n);
            }
        if (last == 0) continue;
        const q8_input rows = rows_from(in, full);
        uint16_t *yr = y + (size_t)full * w->n;
        if (last <= FEW_ROWS && end == t + TILES_ONE_ROW)
            for (int u = t; u < end; u += TILES_FOR(last)) few(last, w, &rows, u, yr);
        else
            for (int u = t; u < end; u++) any(last, w, &rows, u, yr);
    }
}

static void matmul(const int half, const uint16_t *x, const int8_t *q, const void *scale, const void *minimum,
                   uint16_t *y, int M, int N, int K, int G) {
    const int groups = K / G;
    const size_t n = (size_t)M * K;
    // The scratch: the rounded inputs (bfloat16), each row's group sums, and then the float
    // path's inputs in float32 or the integer path's inputs in steps and steps.
    const size_t rounded_floats = (n / 2 + 15) / 16 * 16, sum_floats = ((size_t)M * groups + 15) / 16 * 16;
    float *scratch = input_buffer_for(rounded_floats + sum_floats + n + (size_t)M * (K / GRID_GROUP) + 16);
    uint16_t *rounded = (uint16_t *)scratch;
    float *sums = scratch + rounded_floats, *rest = sums + sum_floats;
    prepare_inputs(x, rounded, NULL, M, K, GRID_BITS);
    if (minimum)
        for (int r = 0; r < M; r++)
            for (int g = 0; g < groups; g++) {
                float s = 0.0f;  // left to right: -ffp-contract=off and no -ffast-math keep this order
                for (int k = g * G; k < (g + 1) * G; k++) s += from_bf16(rounded[(size_t)r * K + k]);
                sums[(size_t)r * groups + g] = s;
            }
    const q8_weight w = {q, scale, minimum, N, K, G};
#if INTEGER_PATH
    int16_t *xi = (int16_t *)rest;
    float *step = rest + rounded_floats;
    if (inputs_in_steps(rounded, xi, step, M, K, GRID_BITS)) {
        const q8_input in = {NULL, xi, step, sums, K, groups};
        if (half) over_tiles(int_tile_f16, int_tile_f16_few_rows, INT_ROW_BLOCK, &w, &in, y, M);
        else over_tiles(int_tile_f32, int_tile_f32_few_rows, INT_ROW_BLOCK, &w, &in, y, M);
        return;
    }
#endif
    float *x32 = rest;
    for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x32 + i, load_bf16(rounded + i));
    for (size_t i = n / 8 * 8; i < n; i++) x32[i] = from_bf16(rounded[i]);
    const q8_input in = {x32, NULL, NULL, sums, K, groups};
    if (half) over_tiles(float_tile_f16, float_tile_f16_few_rows, ROW_BLOCK, &w, &in, y, M);
    else over_tiles(float_tile_f32, float_tile_f32_few_rows, ROW_BLOCK, &w, &in, y, M);
}

INT8_ENTRY_POINTS(0)
