// Weight-only int8-group matmul for x86-64: bfloat16 activations, int32 and float32 accumulation,
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
// 2^-12 of that largest), where each is an integer number of its block's step, below
// 2^12 steps: an int16, and a group's sum of products is exact in int32 and in float32.
// Every build sums a group's products in int32, converts the sum to float32 (exact) and
// scales it by the step (a power of two). Every output element is one fixed sequence of
// operations, whatever the number of rows M, the thread split and the build:
//     acc = 0;  per group:  d = float32(sum(x q) in steps) * step;  acc = fma(scale, d, acc);
//                           [acc = fma(minimum, sum_x, acc)]
// with sum_x the group's rounded inputs added left to right in float32 (only where the
// weight has minimums). The multiply-adds: vpdpwssd in the AVX-512 VNNI build (two inputs'
// products added to a 32-bit lane in one instruction), vpmaddwd and an add in the others.
// Each output column is one vector lane, so a row's result does not depend on the other
// rows of its call (batch invariance) nor on the build. (A call with an input group at
// 2^116 or above, Inf or NaN, off the grid, takes a float path instead: FMAs over the
// inputs one by one: on the grid the same d, so the call's other rows keep their bits.)
//
// Layout (int8_cpu.pack): q [N/16][K][16] int8 (lane j of input column k: column n0+j), or
// the same values in 5 or 6 bits (int8_packed.h: the call's format; decoded to those 16
// bytes an input in registers, so every path below computes the same bits from either),
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
#include "split.h"  // iterations_per_chunk
#include "sums.h"  // KEEP_IN_REGISTER

#define LANES 16  // output columns per packed tile
#define UNROLL _Pragma("GCC unroll 16")
#define MAX_BLOCK 12  // the most rows of one tile call on either path (accumulator arrays' size)
// The grid (grid.h): |x| < 2^(E + 1) is below 2^12 steps of 2^(E - 11) and |q| <= 128 =
// 2^7, so a group's sum of at most 32 products is at most 2^24 steps: exact in int32 and
// in float32 alike, so the float path (FMAs, for a call off the grid) is exact too. A
// finer grid, exact only in integers, measured no closer to float32 (benchmarks/accuracy.py,
// 14 bits: SmolLM2 Q8_0 99.23% top-1 vs 99.31% at 11, Q4_K_M 99.32% vs 99.37%; docs/design.md).
#define GRID_BITS 11

#ifdef __AVX512F__
#define ROW_BLOCK 8  // rows sharing a tile's widened weights: 8 partial + 8 running sums
#define TILES_ONE_ROW 4  // a one-row call's tiles per rows_tile: 4 chains of one vector each
INLINE vec v_int8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
INLINE vec v_half(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
#else
#define ROW_BLOCK 3  // a tile is two vectors: 6 partial + 6 running sums + 2 weights + a broadcast
#define TILES_ONE_ROW 4  // a one-row call's tiles per rows_tile: 8 chains (the running sums spill, once a group)
INLINE vec v_int8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
INLINE vec v_half(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#endif
// The integer path's rows per call of a tile: AVX-512, 12 int32 partial sums + 12 running
// sums + the pair's weights + a broadcast (+ vpmaddwd's product) of 32 registers; AVX2,
// whose tile is two vectors, 6 rows' 12 partial sums beside the pair's two and a broadcast
// (the running sums go to the stack, once a group). On an AMD EPYC Zen 3, 3 layers of
// Qwen3-0.6B's matmuls at 5 and 16 rows took 0.78x and 0.76x the time of 3-row blocks in
// Q5_0, 0.83x and 0.87x in Q8_0 (5-row blocks: 16 rows 0.84x, 4-row: 5 rows 0.99x).
// A one-row call of a narrow format's weights takes one tile a call: four spilled the
// partial sums at every pair beside the decode's constants (1.1-1.15x the time in Q5_0 and
// Q6_K), where the byte layout's four ran 0.9x one's.
#ifdef __AVX512F__
#define INT_ROW_BLOCK 12
#define NARROW_TILES_ONE_ROW TILES_ONE_ROW
#else
#define INT_ROW_BLOCK 6
#define NARROW_TILES_ONE_ROW 1
#endif
// A scale or minimum vector: float32, or float16 widened (exact) where ``half``.
INLINE vec v_param(const void *base, size_t at, const int half) {
    return half ? v_half((const uint16_t *)base + at) : v_load((const float *)base + at);
}
#define NV (LANES / VW)

typedef struct {
    const uint8_t *q;  // column tile t's weights at q + t * tile (int8_packed.h: the int8 layout or fewer bits)
    const void *scale, *minimum;  // float32, or float16 where the call is int8_matmul_h's
    int n, k, group, format;
    size_t tile;  // bytes of a column tile
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
                int8_t column[2 * LANES];  // inputs k & ~1 and k | 1 (this path is rare: a call off the grid)
                _mm256_storeu_si256((__m256i *)column, pair_values(w->q + (size_t)(tile0 + t) * w->tile, w->format, k & ~1));
                vec wq[NV];
                UNROLL for (int v = 0; v < NV; v++) wq[v] = v_int8(column + (k & 1) * LANES + VW * v);
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

// The integer path: R rows (R <= INT_ROW_BLOCK) of TT tiles, d summed in int32 from the
// inputs in steps. Input columns k and k+1 of a tile's 16 columns, widened to int16, are
// arranged as pairs (q[k][j], q[k+1][j]) in 32-bit lane j; vpmaddwd (or VNNI's vpdpwssd,
// which adds too) multiplies each pair by the row's two inputs and adds both products in
// the lane: a row costs one instruction (two without VNNI) per two inputs and vector.
#ifdef __AVX512F__
typedef __m512i ivec;
typedef pair_table ivec_table;  // int8_packed.h's int16 lookup of a narrow format's values
INLINE ivec_table tile_table(int format) { return pair_table_int16(format); }
INLINE void load_pairs(const uint8_t *tile, int format, int k, const ivec_table *table, ivec *pairs) {
    pairs[0] = pair_words(tile, format, k, table);
}
INLINE ivec i_zero(void) { return _mm512_setzero_si512(); }
INLINE ivec i_bcast(int32_t two) { return _mm512_set1_epi32(two); }
#ifdef __AVX512VNNI__
INLINE ivec i_madd(ivec d, ivec q, ivec x) { return _mm512_dpwssd_epi32(d, q, x); }
#else
INLINE ivec i_madd(ivec d, ivec q, ivec x) {
    d = _mm512_add_epi32(d, _mm512_madd_epi16(q, x));
    KEEP_IN_REGISTER(d);
    return d;
}
#endif
INLINE vec i_float(ivec d) { return _mm512_cvtepi32_ps(d); }
#else
typedef __m256i ivec;
typedef pair_decoder ivec_table;  // the AVX2 build decodes to the int8 layout's bytes (int8_packed.h)
INLINE ivec_table tile_table(int format) { return pair_decoder_for(format); }
INLINE void load_pairs(const uint8_t *tile, int format, int k, const ivec_table *table, ivec *pairs) {
    (void)format;  // the decoder's; byte interleave: columns 0-7, then 8-15
    const __m256i q = pair_values_of(tile, table, k);
    const __m128i a = _mm256_castsi256_si128(q), b = _mm256_extracti128_si256(q, 1);
    pairs[0] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
    pairs[1] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b));
}
INLINE ivec i_zero(void) { return _mm256_setzero_si256(); }
INLINE ivec i_bcast(int32_t two) { return _mm256_set1_epi32(two); }
INLINE ivec i_madd(ivec d, ivec q, ivec x) {
    d = _mm256_add_epi32(d, _mm256_madd_epi16(q, x));
    KEEP_IN_REGISTER(d);
    return d;
}
INLINE vec i_float(ivec d) { return _mm256_cvtepi32_ps(d); }
#endif

INLINE void rows_tile_int(const int R, const int TT, const int HALF, const q8_weight *w, const q8_input *in, int tile0,
                          uint16_t *y) {
    const int K = w->k, N = w->n, G = w->group, groups = K / G, steps = in->ld / GRID_GROUP;
    const ivec_table table = tile_table(w->format);
    vec acc[TILES_ONE_ROW][MAX_BLOCK][NV];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) acc[t][r][v] = v_zero();
    for (int g = 0; g < groups; g++) {
        ivec d[TILES_ONE_ROW][INT_ROW_BLOCK][NV];
        UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) d[t][r][v] = i_zero();
        for (int k = g * G; k < (g + 1) * G; k += 2) {
            UNROLL for (int t = 0; t < TT; t++) {
                ivec pairs[NV];
                load_pairs(w->q + (size_t)(tile0 + t) * w->tile, w->format, k, &table, pairs);
                UNROLL for (int r = 0; r < R; r++) {
                    int32_t two;  // x[k] (low half) and x[k+1], as in a lane of pairs
                    memcpy(&two, in->xi + (size_t)r * in->ld + k, sizeof two);
                    const ivec x = i_bcast(two);
                    UNROLL for (int v = 0; v < NV; v++) d[t][r][v] = i_madd(d[t][r][v], pairs[v], x);
                }
            }
        }
        UNROLL for (int t = 0; t < TT; t++) {
            const size_t at = ((size_t)(tile0 + t) * groups + g) * LANES;
            UNROLL for (int v = 0; v < NV; v++) {
                const vec s = v_param(w->scale, at + VW * v, HALF);
                const vec m = w->minimum ? v_param(w->minimum, at + VW * v, HALF) : v_zero();
                UNROLL for (int r = 0; r < R; r++) {
                    const vec dot = i_float(d[t][r][v]) * v_bcast(in->step + (size_t)r * steps + g * G / GRID_GROUP);
                    acc[t][r][v] = v_fma(s, dot, acc[t][r][v]);
                    if (w->minimum) acc[t][r][v] = v_fma(m, v_bcast(in->sums + (size_t)r * groups + g), acc[t][r][v]);
                }
            }
        }
    }
    store_rows(R, TT, acc, N, tile0, y);
}

// A path's tile functions: ``any`` runs R rows (R <= its block) of one tile, R a
// compile-time constant per case; ``one_row`` one row of TILES_ONE_ROW tiles from ``tile``.
// More rows than one take one tile a call: interleaved tiles give a row more independent
// chains of multiply-adds, but each is a weight stream of its own, and with each thread on
// a contiguous run of tiles (split.h) the streams cost more than the chains save (the
// default model's 49,152 x 576 head from memory at 2-6 rows took 0.61-0.84x the time of
// 4 tiles a call at 1-3 rows and 2 at 4-6, in the bfloat16 and plain AVX-512 builds of an
// AMD EPYC Zen 4). One row keeps its tiles: a single chain a column is latency-bound
// (except the AVX2 build's narrow formats, one tile a call: NARROW_TILES_ONE_ROW).
typedef void (*tile_fn)(int, const q8_weight *, const q8_input *, int, uint16_t *);
typedef void (*one_row_fn)(const q8_weight *, const q8_input *, int, uint16_t *);
#define CASE_ANY(TILE, HALF, r) case r: TILE(r, 1, HALF, w, in, tile, y); break;
#define ONE_ROW_TILES(name, TILE, HALF, NARROW_PER_CALL)                                                         \
    static void name(const q8_weight *w, const q8_input *in, int tile, uint16_t *y) {                            \
        if (FORMAT_BITS(w->format) == 8 || NARROW_PER_CALL == TILES_ONE_ROW)                                     \
            TILE(1, TILES_ONE_ROW, HALF, w, in, tile, y);                                                        \
        else                                                                                                     \
            for (int t = 0; t < TILES_ONE_ROW; t += NARROW_PER_CALL) TILE(1, NARROW_PER_CALL, HALF, w, in, tile + t, y); \
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
    ONE_ROW_TILES(name##_one_row, rows_tile, HALF, TILES_ONE_ROW)
FLOAT_TILES(float_tile_f32, 0)
FLOAT_TILES(float_tile_f16, 1)
#if INT_ROW_BLOCK == 12
#define MORE_INT_CASES(HALF) CASE_ANY(rows_tile_int, HALF, 3)                                                    \
    CASE_ANY(rows_tile_int, HALF, 4) CASE_ANY(rows_tile_int, HALF, 5) CASE_ANY(rows_tile_int, HALF, 6)           \
    CASE_ANY(rows_tile_int, HALF, 7) CASE_ANY(rows_tile_int, HALF, 8) CASE_ANY(rows_tile_int, HALF, 9)           \
    CASE_ANY(rows_tile_int, HALF, 10) CASE_ANY(rows_tile_int, HALF, 11)
#else
_Static_assert(INT_ROW_BLOCK == 6, "INT_TILES' cases cover 1 .. INT_ROW_BLOCK - 1 rows");
#define MORE_INT_CASES(HALF) CASE_ANY(rows_tile_int, HALF, 3) CASE_ANY(rows_tile_int, HALF, 4) CASE_ANY(rows_tile_int, HALF, 5)
#endif
#define INT_TILES(name, HALF)                                                                                    \
    static void name(int R, const q8_weight *w, const q8_input *in, int tile, uint16_t *y) {                      \
        switch (R) {                                                                                             \
        CASE_ANY(rows_tile_int, HALF, 1) CASE_ANY(rows_tile_int, HALF, 2) MORE_INT_CASES(HALF)                   \
        default: rows_tile_int(INT_ROW_BLOCK, 1, HALF, w, in, tile, y); break;                                   \
        }                                                                                                        \
    }                                                                                                            \
    ONE_ROW_TILES(name##_one_row, rows_tile_int, HALF, NARROW_TILES_ONE_ROW)
INT_TILES(int_tile_f32, 0)
INT_TILES(int_tile_f16, 1)

// Every tile, TILES_ONE_ROW tiles at a time: the full blocks of ``block`` rows one tile a
// call (a tile's weights stay in L1 from one block to the next), then the last block's rows
// one tile a call, or a last single row all TILES_ONE_ROW tiles in one call (see rows_tile
// and ONE_ROW_TILES);
// the last few tiles one at a time.
// Split between threads as split.h says: dynamically, in contiguous runs of tiles (a call
// streams the weight from memory once, its blocks of rows over a tile from L1).
static void over_tiles(tile_fn any, one_row_fn one_row, int block, const q8_weight *w, const q8_input *in, uint16_t *y, int M) {
    const int tiles = w->n / LANES, last = M % block, full = M - last;
    const int chunk = iterations_per_chunk((tiles + TILES_ONE_ROW - 1) / TILES_ONE_ROW);
    #pragma omp parallel for schedule(dynamic, chunk)
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
        if (last == 1 && end == t + TILES_ONE_ROW)
            one_row(w, &rows, t, yr);
        else
            for (int u = t; u < end; u++) any(last, w, &rows, u, yr);
    }
}

// Each row's group sums of its rounded inputs, sums [M][K/G], every group added left to
// right in float32 (-ffp-contract=off and no -ffast-math keep this order): the minimum
// term's sum_x, the same in every build and in the tile kernel (int8_amx.c).
static void minimum_sums(const uint16_t *rounded, float *sums, int M, int K, int G) {
    const int groups = K / G;
    for (int r = 0; r < M; r++)
        for (int g = 0; g < groups; g++) {
            float s = 0.0f;
            for (int k = g * G; k < (g + 1) * G; k++) s += from_bf16(rounded[(size_t)r * K + k]);
            sums[(size_t)r * groups + g] = s;
        }
}

static void matmul(const int half, const uint16_t *x, const int8_t *q, const void *scale, const void *minimum,
                   uint16_t *y, int M, int N, int K, int G, int format) {
    const int groups = K / G;
    const size_t n = (size_t)M * K;
    // The scratch: the rounded inputs (bfloat16), each row's group sums, and then the float
    // path's inputs in float32 or the integer path's inputs in steps and steps.
    const size_t rounded_floats = (n / 2 + 15) / 16 * 16, sum_floats = ((size_t)M * groups + 15) / 16 * 16;
    float *scratch = input_buffer_for(rounded_floats + sum_floats + n + (size_t)M * (K / GRID_GROUP) + 16);
    uint16_t *rounded = (uint16_t *)scratch;
    float *sums = scratch + rounded_floats, *rest = sums + sum_floats;
    prepare_inputs(x, rounded, NULL, M, K, GRID_BITS);
    if (minimum) minimum_sums(rounded, sums, M, K, G);
    const q8_weight w = {(const uint8_t *)q, scale, minimum, N, K, G, format, tile_bytes(format, K)};
    int16_t *xi = (int16_t *)rest;
    float *step = rest + rounded_floats;
    if (inputs_in_steps(rounded, xi, step, M, K, GRID_BITS)) {
        const q8_input in = {NULL, xi, step, sums, K, groups};
        if (half) over_tiles(int_tile_f16, int_tile_f16_one_row, INT_ROW_BLOCK, &w, &in, y, M);
        else over_tiles(int_tile_f32, int_tile_f32_one_row, INT_ROW_BLOCK, &w, &in, y, M);
        return;
    }
    float *x32 = rest;  // off the grid: the float path
    for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x32 + i, load_bf16(rounded + i));
    for (size_t i = n / 8 * 8; i < n; i++) x32[i] = from_bf16(rounded[i]);
    const q8_input in = {x32, NULL, NULL, sums, K, groups};
    if (half) over_tiles(float_tile_f16, float_tile_f16_one_row, ROW_BLOCK, &w, &in, y, M);
    else over_tiles(float_tile_f32, float_tile_f32_one_row, ROW_BLOCK, &w, &in, y, M);
}

INT8_ENTRY_POINTS(0)
