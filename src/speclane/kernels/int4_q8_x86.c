// The int4 matmul on int8 inputs (``--matmul-inputs int8``): each row's inputs quantized to
// int8 per group of 32 (llama.cpp's Q8_1: step d = max|x| / 127, q = round(x / d)), then
// integer dot products with the weights' 4-bit q by vpmaddubsw, 32 multiply-adds an
// instruction against vpmaddwd's 16 on the exact int16 path of int4_x86.c. That is how
// llama.cpp computes its Q4 types on x86; the cost is the inputs' rounding to 8 bits, whose
// effect on the model's predictions benchmarks/accuracy.py measures (docs/design.md).
//
// The weights: int4_x86.c's values and scales (q4.h), their 4-bit q in a layout of their own
// (unpack_quad); a weight is w = q * scale + minimum per group of 32 input columns, so a
// group's share of an output is
//     scale * d * sum(qx[k] q[k]) + minimum * d * sum(qx[k])
// with qx the int8 inputs. sum(qx q) is an exact integer (|.| <= 32 * 127 * 15), as is
// sum(qx). Each output element is computed by one sequence of float operations whatever
// the number of rows and whichever path the call takes:
//     per group:  acc = fma(scale, float(sum(qx q)) * d, acc);  acc = fma(minimum, d * float(sum(qx)), acc)
// so a row's result does not depend on its neighbours (batch invariance). Two builds, the
// same bits: sum(qx q) and sum(qx) are integers either build adds exactly, and the float
// operations after them are the same per column.
//
// The AVX2 build (every x86-64 CPU): a quad of input columns (4k .. 4k+3) of 8 output
// columns is one vector of 32 weight bytes, one 32-bit lane a column; vpmaddubsw with the
// quad's 4 int8 inputs broadcast gives two int16 sums a lane (each at most 2 * 15 * 127),
// and a group's 8 quads add up in int16 without overflow (8 * 3810 < 2^15); one vpmaddwd by
// ones then makes each column's int32 sum.
//
// The AVX-512 VNNI build: vpdpbusd multiplies a lane's 4 unsigned bytes (the weight's q) by 4
// signed bytes (the inputs) and adds the 4 products into the lane's int32: one quad of 16
// columns an instruction, against two instructions for 8 columns above. Two quads of a tile
// (64 packed bytes) load as one vector; a mask, a shift and two vshufi64x2 make each quad's
// 16 columns one vector, once per tile and block of up to 8 rows.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "q4.h"  // Q4_GROUP
#include "q8_inputs.h"  // quantize_call
#include "op.h"
#include "split.h"  // iterations_per_chunk
#include "sums.h"  // KEEP_IN_REGISTER

#define LANES 16          // output columns per packed tile
#define GROUP Q4_GROUP    // input columns per (scale, minimum) pair
#define QUADS (GROUP / 4) // quads of input columns per group
#define UNROLL _Pragma("GCC unroll 16")
#ifdef __AVX512VNNI__
#define ROWS Q8_VNNI_ROWS    // rows a tile's weights run over in registers at a time
#define TILES Q8_VNNI_TILES  // tiles a one-row call interleaves (q8_inputs.h)
#else
#define ROWS 6
#define TILES 1  // one tile a call (q8_inputs.h, Q8_VNNI_TILES)
#endif

typedef struct {
    const uint8_t *packed;
    const uint16_t *scale, *minimum;
    int n, k;
} q4_weight;

#ifdef __AVX512VNNI__
// A pair of quads of one 16-column tile (quads k and k+1: 64 bytes, laid out as unpack_quad
// reads one) as two vectors of 16 columns x 4 bytes, quad k's and quad k+1's: the mask gives
// columns 0-7 of both quads (quad k in the low 256 bits), the shift columns 8-15, and
// vshufi64x2 takes each quad's halves from the two.
INLINE void unpack_quad_pair(const uint8_t *quads, __m512i *first, __m512i *second) {
    const __m512i v = _mm512_loadu_si512((const void *)quads), nibble = _mm512_set1_epi8(15);
    const __m512i low = _mm512_and_si512(v, nibble), high = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
    *first = _mm512_shuffle_i64x2(low, high, 0x44);   // low's and high's low 256 bits
    *second = _mm512_shuffle_i64x2(low, high, 0xEE);  // their high 256 bits
}

INLINE void group_scales(const q4_weight *w, size_t tile, int g, __m512 *s, __m512 *m) {
    const size_t at = (tile * (w->k / GROUP) + g) * LANES;
    *s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->scale + at)));
    *m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->minimum + at)));
}

// R rows over TT tiles (TT > 1 only for R == 1): each pair of quads unpacked once for the R
// rows, each row's quad of inputs broadcast once for the TT tiles.
INLINE void rows_over_tiles(const int R, const int TT, const q4_weight *w, const q8_input *in, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n;
    const int CHAINS = R * TT <= 4 ? 2 : 1;  // (add_quad_pair_products) more blocks have chains enough
    __m512 acc[TILES][ROWS];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) acc[t][r] = _mm512_setzero_ps();
    for (int g = 0; g < K / GROUP; g++) {
        __m512i d[2][TILES][ROWS];
        UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) d[0][t][r] = d[1][t][r] = _mm512_setzero_si512();
        UNROLL for (int k = g * QUADS; k < (g + 1) * QUADS; k += 2) {
            __m512i first[TILES], second[TILES];
            UNROLL for (int t = 0; t < TT; t++) unpack_quad_pair(w->packed + ((size_t)(tile0 + t) * (K / 4) + k) * 32, &first[t], &second[t]);
            add_quad_pair_products(R, TT, CHAINS, in, k, first, second, d);
        }
        UNROLL for (int t = 0; t < TT; t++) {
            __m512 s, m;
            group_scales(w, (size_t)tile0 + t, g, &s, &m);
            UNROLL for (int r = 0; r < R; r++) {
                const __m512 step = _mm512_set1_ps(in->step[(size_t)r * in->steps + g]);
                const __m512 sum = _mm512_set1_ps(in->step_sum[(size_t)r * in->sums + g]);
                const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(CHAINS == 2 ? _mm512_add_epi32(d[0][t][r], d[1][t][r]) : d[0][t][r]), step);
                acc[t][r] = _mm512_fmadd_ps(m, sum, _mm512_fmadd_ps(s, dot, acc[t][r]));
            }
        }
    }
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) store_bf16_16(y + (size_t)r * N + (tile0 + t) * LANES, acc[t][r]);
}

#else  // AVX2

// The weight stream is read a software prefetch this many bytes ahead: the default model's
// layer matmuls from memory (int4_x86.c's integer path, the same stream) took 0.92-0.95x
// the time with it on Zen 3.
#define PREFETCH_AHEAD 2048

// A quad's weights of one 16-column tile (int4_cpu.pack(..., quads=True): 32 bytes, byte
// 4c + i holding q[c][4k + i] in its low nibble and q[c + 8][4k + i] in its high one) as
// two vectors of 8 columns x 4 bytes, columns 0-7 and 8-15: a mask and a shift.
INLINE void unpack_quad(const uint8_t *quad, __m256i *a, __m256i *b) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)quad), nibble = _mm256_set1_epi8(15);
    *a = _mm256_and_si256(v, nibble);
    *b = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
}

INLINE void group_scales(const q4_weight *w, size_t tile, int g, __m256 *s, __m256 *m) {
    const size_t at = (tile * (w->k / GROUP) + g) * LANES;
    UNROLL for (int v = 0; v < 2; v++) {
        s[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->scale + at + 8 * v)));
        m[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w->minimum + at + 8 * v)));
    }
}

INLINE void store_row(const __m256 *acc, uint16_t *y) {
    store_bf16(y, acc[0]);
    store_bf16(y + 8, acc[1]);
}

// R rows over TT tiles (TT > 1 only for R == 1), each quad unpacked from the packed weights
// as it is used (a mask and a shift; unpacking a tile once into a buffer for many rows made
// 8 rows 1.4x slower and 16 to 96 rows no faster, measured on Zen 3).
INLINE void rows_over_tiles(const int R, const int TT, const q4_weight *w, const q8_input *in, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n;
    __m256 acc[TILES][ROWS][2];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) acc[t][r][0] = acc[t][r][1] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int g = 0; g < K / GROUP; g++) {
        __m256i d[TILES][ROWS][2];
        UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) d[t][r][0] = d[t][r][1] = _mm256_setzero_si256();
        for (int k = g * QUADS; k < (g + 1) * QUADS; k++) {
            UNROLL for (int t = 0; t < TT; t++) {
                __m256i a, b;
                const uint8_t *quad = w->packed + ((size_t)(tile0 + t) * (K / 4) + k) * 32;
                if ((k & 1) == 0) _mm_prefetch((const char *)quad + PREFETCH_AHEAD, _MM_HINT_T0);  // once per line
                unpack_quad(quad, &a, &b);
                UNROLL for (int r = 0; r < R; r++) {
                    int32_t quad;
                    memcpy(&quad, in->q + (size_t)r * in->ld + 4 * k, sizeof quad);
                    const __m256i x = _mm256_set1_epi32(quad);
                    d[t][r][0] = _mm256_add_epi16(d[t][r][0], _mm256_maddubs_epi16(a, x));
                    d[t][r][1] = _mm256_add_epi16(d[t][r][1], _mm256_maddubs_epi16(b, x));
                    KEEP_IN_REGISTER(d[t][r][0]);
                    KEEP_IN_REGISTER(d[t][r][1]);
                }
            }
        }
        UNROLL for (int t = 0; t < TT; t++) {
            __m256 s[2], m[2];
            group_scales(w, (size_t)tile0 + t, g, s, m);
            UNROLL for (int r = 0; r < R; r++) {
                const __m256 step = _mm256_broadcast_ss(in->step + (size_t)r * in->steps + g);
                const __m256 sum = _mm256_broadcast_ss(in->step_sum + (size_t)r * in->sums + g);
                UNROLL for (int v = 0; v < 2; v++) {
                    const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(d[t][r][v], ones)), step);
                    acc[t][r][v] = _mm256_fmadd_ps(m[v], sum, _mm256_fmadd_ps(s[v], dot, acc[t][r][v]));
                }
            }
        }
    }
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) store_row(acc[t][r], y + (size_t)r * N + (tile0 + t) * LANES);
}

#endif

// One tile's outputs for every row, ROWS at a time.
static void tile_rows(const q4_weight *w, const q8_input *in, int M, int tile, uint16_t *y) {
    for (int r0 = 0; r0 < M; r0 += ROWS) {
        const q8_input rows = q8_rows_from(in, r0);
        uint16_t *out = y + (size_t)r0 * w->n;
        switch (M - r0 < ROWS ? M - r0 : ROWS) {
#define CASE(r) case r: rows_over_tiles(r, 1, w, &rows, tile, out); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5)
#if ROWS > 6
        CASE(6) CASE(7)
#endif
#undef CASE
        default: rows_over_tiles(ROWS, 1, w, &rows, tile, out); break;
        }
    }
}
_Static_assert(ROWS == 6 || ROWS == 8, "tile_rows' cases cover 1 .. ROWS - 1 rows");

// The threads take contiguous runs of tiles (split.h), one row TILES tiles a call and more
// rows one tile a call: a call streams its weight from memory once, and more than ROWS rows run over a
// tile's weights in blocks while they are in L1.
static void matmul_rows(const q8_input *in, const q4_weight *w, uint16_t *y, int M) {
    const int tiles = w->n / LANES;
    const int step = M == 1 ? TILES : 1;
    const int chunk = iterations_per_chunk((tiles + step - 1) / step);
    #pragma omp parallel for schedule(dynamic, chunk)
    for (int t = 0; t < tiles; t += step) {
        if (step > 1 && t + step <= tiles) {
            rows_over_tiles(1, TILES, w, in, t, y);
        } else {
            for (int u = t; u < t + step && u < tiles; u++) tile_rows(w, in, M, u, y);
        }
    }
}

// y = x @ W^T. x: [M][K] bfloat16, y: [M][N] bfloat16; the weight packed by int4_cpu.pack(..., quads=True).
// The caller checks N % 16 == 0 and K % 32 == 0 and passes contiguous tensors.
void int4_matmul(const uint16_t *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                 uint16_t *y, int M, int N, int K) {
    const q8_input in = quantize_call(x, M, K, GROUP);
    const q4_weight w = {packed, scale, minimum, N, K};
    matmul_rows(&in, &w, y, M);
}

// int4_matmul with op.h's arguments: x, packed, scale, minimum, y, M, N, K.
void int4_matmul_op(const int64_t *a) {
    int4_matmul(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), (int)a[5], (int)a[6], (int)a[7]);
}
