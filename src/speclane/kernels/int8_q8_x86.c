// The int8-group matmul on int8 inputs (``--matmul-inputs int8``): int8_x86.c's weights
// (w = q * scale + minimum per group of G = 16 or 32 input columns, q an int8) times the
// inputs quantized to int8 per group of 32 (q8_inputs.h), in integer dot products, as
// llama.cpp computes its Q8_0 and Q6_K types on x86.
//
// A group's share of an output is scale * d * sum(qx q) + minimum * d * sum(qx): sum(qx q)
// is an exact integer (|.| <= 32 * 128 * 127 < 2^24, so its float32 is exact too), and each
// output element is one sequence of float operations whatever the number of rows:
//     per group:  acc = fma(scale, float(sum(qx q)) * d, acc);  [acc = fma(minimum, d * float(sum(qx)), acc)]
// (d: the step of the 32 inputs the group lies in) so a row's result does not depend on its
// neighbours. Two builds, the same bits (the sums are the same integers):
// - AVX2 (every x86-64 CPU): vpmaddubsw multiplies unsigned by signed bytes, so each weight
//   byte enters as |q| and the input takes q's sign (vpsignb); a pair's sum (at most
//   2 * 128 * 127) fits int16, and vpmaddwd by ones widens it into a column's int32 lane.
// - AVX-512 VNNI: vpdpbusd adds a lane's 4 products of unsigned by signed bytes into its
//   int32, 16 columns an instruction. Each weight byte enters as q + 128 (its top bit
//   flipped: unsigned), and the group's sum less 128 * sum(qx) is sum(qx q).
//
// Layout (int8_cpu.pack(..., quads=True)): q [N/16][K/4][64] int8, byte 4c + i of quad k
// holding column n0+c's value at input column 4k + i (columns 0-7: the first 32 bytes, a
// vector; 8-15: the next); scale and minimum [N/16][K/G][16] as int8_x86.c's.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "q8_inputs.h"  // quantize_call
#include "int8_entry.h"  // int8_rows_of, INT8_ENTRY_POINTS
#include "op.h"
#include "split.h"  // iterations_per_chunk
#include "sums.h"  // KEEP_IN_REGISTER

#define LANES 16  // output columns per packed tile
#define UNROLL _Pragma("GCC unroll 16")
#ifdef __AVX512VNNI__
#define ROWS Q8_VNNI_ROWS    // rows a tile's weights run over in registers at a time
#define TILES Q8_VNNI_TILES  // tiles a one-row call interleaves (q8_inputs.h)
#else
// 8 rows' 16 partial sums (two vectors a row) do not all fit AVX2's 16 registers, but the
// tile's weights are read and their signs taken once for 8 rows, not 4: the default model's
// 49,152 x 576 head (its coarse pass, on this kernel wherever AVX2 runs it) at 5 / 8 / 16
// rows took 0.91x / 0.85x / 0.98x the time of 4-row blocks (an AMD EPYC Zen 3).
#define ROWS 8
#define TILES 1  // one tile a call (q8_inputs.h, Q8_VNNI_TILES)
#endif

typedef struct {
    const int8_t *q;
    const void *scale, *minimum;  // float32, or float16 where the call is int8_matmul_h's
    int n, k, group;
} q8_weight;

#ifdef __AVX512VNNI__
INLINE __m512 param(const void *base, size_t at, const int half) {  // 16 scales or minimums as float32
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + at)))
                : _mm512_loadu_ps((const float *)base + at);
}

// R rows over TT tiles (TT > 1 only for R == 1); HALF: float16 scales and minimums. A quad
// of a tile (64 bytes: 16 columns x 4 inputs) is one vector; two quads at a time (G / 4 is even).
INLINE void rows_over_tiles(const int R, const int TT, const int HALF, const q8_weight *w, const q8_input *in, int tile0,
                            uint16_t *y) {
    const int K = w->k, N = w->n, G = w->group, groups = K / G;
    const int CHAINS = R * TT <= 4 ? 2 : 1;  // (add_quad_pair_products) more blocks have chains enough
    __m512 acc[TILES][ROWS];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int g = 0; g < groups; g++) {
        __m512i d[2][TILES][ROWS];
        UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) d[0][t][r] = d[1][t][r] = _mm512_setzero_si512();
        for (int k = g * G / 4; k < (g + 1) * G / 4; k += 2) {
            __m512i first[TILES], second[TILES];
            UNROLL for (int t = 0; t < TT; t++) {
                const int8_t *quads = w->q + ((size_t)(tile0 + t) * (K / 4) + k) * 64;
                first[t] = _mm512_xor_si512(_mm512_loadu_si512((const void *)quads), flip);
                second[t] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(quads + 64)), flip);
            }
            add_quad_pair_products(R, TT, CHAINS, in, k, first, second, d);
        }
        UNROLL for (int t = 0; t < TT; t++) {
            const size_t at = ((size_t)(tile0 + t) * groups + g) * LANES;
            const __m512 s = param(w->scale, at, HALF);
            const __m512 m = w->minimum ? param(w->minimum, at, HALF) : _mm512_setzero_ps();
            UNROLL for (int r = 0; r < R; r++) {
                const __m512i biased = CHAINS == 2 ? _mm512_add_epi32(d[0][t][r], d[1][t][r]) : d[0][t][r];
                const __m512i sum = _mm512_sub_epi32(biased, _mm512_set1_epi32(128 * in->q_sum[(size_t)r * in->sums + g]));
                const __m512 step = _mm512_set1_ps(in->step[(size_t)r * in->steps + g * G / Q8_GROUP]);
                const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), step);
                acc[t][r] = _mm512_fmadd_ps(s, dot, acc[t][r]);
                if (w->minimum) acc[t][r] = _mm512_fmadd_ps(m, _mm512_set1_ps(in->step_sum[(size_t)r * in->sums + g]), acc[t][r]);
            }
        }
    }
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++)
        store_bf16_16(y + (size_t)r * N + (size_t)(tile0 + t) * LANES, acc[t][r]);
}

#else  // AVX2

INLINE __m256 param(const void *base, size_t at, const int half) {  // 8 scales or minimums as float32
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + at)))
                : _mm256_loadu_ps((const float *)base + at);
}

// R rows over TT tiles (TT > 1 only for R == 1); HALF: float16 scales and minimums.
INLINE void rows_over_tiles(const int R, const int TT, const int HALF, const q8_weight *w, const q8_input *in, int tile0,
                            uint16_t *y) {
    const int K = w->k, N = w->n, G = w->group, groups = K / G;
    __m256 acc[TILES][ROWS][2];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) acc[t][r][0] = acc[t][r][1] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int g = 0; g < groups; g++) {
        __m256i d[TILES][ROWS][2];
        UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) d[t][r][0] = d[t][r][1] = _mm256_setzero_si256();
        for (int k = g * G / 4; k < (g + 1) * G / 4; k++) {
            UNROLL for (int t = 0; t < TT; t++) {
                const int8_t *quad = w->q + ((size_t)(tile0 + t) * (K / 4) + k) * 64;
                const __m256i wa = _mm256_loadu_si256((const __m256i *)quad), wb = _mm256_loadu_si256((const __m256i *)(quad + 32));
                const __m256i ua = _mm256_abs_epi8(wa), ub = _mm256_abs_epi8(wb);
                UNROLL for (int r = 0; r < R; r++) {
                    int32_t four;
                    memcpy(&four, in->q + (size_t)r * in->ld + 4 * k, sizeof four);
                    const __m256i x = _mm256_set1_epi32(four);
                    d[t][r][0] = _mm256_add_epi32(d[t][r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(x, wa)), ones));
                    d[t][r][1] = _mm256_add_epi32(d[t][r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(ub, _mm256_sign_epi8(x, wb)), ones));
                    KEEP_IN_REGISTER(d[t][r][0]);
                    KEEP_IN_REGISTER(d[t][r][1]);
                }
            }
        }
        UNROLL for (int t = 0; t < TT; t++) {
            const size_t at = ((size_t)(tile0 + t) * groups + g) * LANES;
            UNROLL for (int v = 0; v < 2; v++) {
                const __m256 s = param(w->scale, at + 8 * v, HALF);
                const __m256 m = w->minimum ? param(w->minimum, at + 8 * v, HALF) : _mm256_setzero_ps();
                UNROLL for (int r = 0; r < R; r++) {
                    const __m256 step = _mm256_broadcast_ss(in->step + (size_t)r * in->steps + g * G / Q8_GROUP);
                    const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(d[t][r][v]), step);
                    acc[t][r][v] = _mm256_fmadd_ps(s, dot, acc[t][r][v]);
                    if (w->minimum) acc[t][r][v] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(in->step_sum + (size_t)r * in->sums + g), acc[t][r][v]);
                }
            }
        }
    }
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) {
        uint16_t *out = y + (size_t)r * N + (size_t)(tile0 + t) * LANES;
        store_bf16(out, acc[t][r][0]);
        store_bf16(out + 8, acc[t][r][1]);
    }
}

#endif

_Static_assert(ROWS == 4 || ROWS == 8, "tile_rows' cases cover 1 .. ROWS - 1 rows");
#if ROWS > 4
#define MORE_ROW_CASES(HALF, w, rows, tile, out)                                                   \
    case 4: rows_over_tiles(4, 1, HALF, w, rows, tile, out); break;                                \
    case 5: rows_over_tiles(5, 1, HALF, w, rows, tile, out); break;                                \
    case 6: rows_over_tiles(6, 1, HALF, w, rows, tile, out); break;                                \
    case 7: rows_over_tiles(7, 1, HALF, w, rows, tile, out); break;
#else
#define MORE_ROW_CASES(HALF, w, rows, tile, out)
#endif
#define TILE_ROWS(name, HALF)                                                                          \
    static void name(const q8_weight *w, const q8_input *in, int M, int tile, uint16_t *y) {            \
        for (int r0 = 0; r0 < M; r0 += ROWS) {                                                          \
            const q8_input rows = q8_rows_from(in, r0);                                                 \
            uint16_t *out = y + (size_t)r0 * w->n;                                                      \
            switch (M - r0 < ROWS ? M - r0 : ROWS) { /* a compile-time R per case */                    \
            case 1: rows_over_tiles(1, 1, HALF, w, &rows, tile, out); break;                            \
            case 2: rows_over_tiles(2, 1, HALF, w, &rows, tile, out); break;                            \
            case 3: rows_over_tiles(3, 1, HALF, w, &rows, tile, out); break;                            \
            MORE_ROW_CASES(HALF, w, &rows, tile, out)                                                   \
            default: rows_over_tiles(ROWS, 1, HALF, w, &rows, tile, out); break;                        \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    static void name##_one_row(const q8_weight *w, const q8_input *in, int tile, uint16_t *y) {          \
        rows_over_tiles(1, TILES, HALF, w, in, tile, y);                                                \
    }
TILE_ROWS(rows_tile_f32, 0)
TILE_ROWS(rows_tile_f16, 1)

typedef void (*tile_fn)(const q8_weight *, const q8_input *, int, int, uint16_t *);
typedef void (*one_row_fn)(const q8_weight *, const q8_input *, int, uint16_t *);

static void matmul(const int half, const uint16_t *x, const int8_t *q, const void *scale, const void *minimum,
                   uint16_t *y, int M, int N, int K, int G, int format) {
    (void)format;  // quads are int8 (int8_cpu.pack packs no fewer bits in quads)
    const tile_fn tile_rows = half ? rows_tile_f16 : rows_tile_f32;
    const one_row_fn one_row = half ? rows_tile_f16_one_row : rows_tile_f32_one_row;
    const q8_input in = quantize_call(x, M, K, G);
    const q8_weight w = {q, scale, minimum, N, K, G};
    const int tiles = N / LANES;
    // The threads take contiguous runs of tiles (split.h), one row TILES tiles a call and more
    // rows one tile a call: a call streams the weight from memory once, and more than ROWS rows
    // run over a tile's quads in blocks while they are in L1. (Runs for those too: the
    // default model's 16-row logits, the head's 28 MB from memory, took one forward + logits
    // of 16 sequences 0.92x the time of one tile at a time, 12 sequences 0.88x.)
    const int step = M == 1 ? TILES : 1;
    const int chunk = iterations_per_chunk((tiles + step - 1) / step);
    #pragma omp parallel for schedule(dynamic, chunk)
    for (int t = 0; t < tiles; t += step) {
        if (step > 1 && t + step <= tiles) one_row(&w, &in, t, y);
        else for (int u = t; u < t + step && u < tiles; u++) tile_rows(&w, &in, M, u, y);
    }
}

INT8_ENTRY_POINTS(1)
