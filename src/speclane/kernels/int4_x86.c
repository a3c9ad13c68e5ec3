// Weight-only int4 matmul for x86-64: bfloat16 activations, float32 accumulation,
// bfloat16 output. Built three times by build.py and loaded by int4_cpu.py: for AVX-512 with
// its bfloat16 dot product (AVX512_BF16: AMD Zen 4/5, Intel Sapphire Rapids on), for plain
// AVX-512 and for AVX2 + FMA + F16C.
//
// Why our own: torch's CPU int4 kernel dequantizes its weights again for every block of
// 4 rows, so a 5-row call costs two 4-row calls and 16 rows cost ~6x one row. A
// speculative round verifies K+1 rows of one sequence and a mixed tick holds every
// stream's row: here the cost of rows should be the multiply-adds, not the dequantization.
// Few rows unpack weights into registers and use each one at once (a tile's rows in blocks
// where they are more than the registers hold); many rows unpack a 128-input-column block
// of NT 16-column tiles into L1 once and run all rows over it with a register tile of MR
// rows x 16 NT columns.
//
// The arithmetic: a weight is w = q * scale + minimum (GGUF's Q4_1: q in 0..15, one scale
// and minimum per 32 input columns, a "group"), so a group's share of an output is
//     scale * sum(x[k] * q[k]) + minimum * sum(x[k]).
// The kernel never forms w: it multiplies the bfloat16 inputs by the small integers q,
// which is exact in float32, and applies scale and minimum once per group. That is what
// lets AVX512_BF16's vdpbf16ps (two multiply-adds per float32 lane in one instruction) do
// the inner loop on bfloat16 inputs and integer weights without rounding either.
//
// The inputs are first rounded to their group's grid (grid.h, round_group with q4.h's GRID_BITS: an input whose
// exponent is 8 or more below its group's largest loses its low bits), on which every sum of a group's
// products is exact in float32 in any order: that is what lets the AMX tile kernel
// (int4_amx.c), whose tile unit adds in an undocumented order, give these same bits.
//
// Batch invariance and the same bits in every build: each output element is computed by
// one sequence of operations whatever the number of rows M and whatever the build:
//     per group:  d = 0;  for each pair of input columns (2p, 2p+1) in order:
//                     d = d + x[2p+1] q[2p+1];  d = d + x[2p] q[2p]    (products exact, sums rounded)
//                 acc = fma(scale, d, acc);  acc = fma(minimum, sum_x, acc)
// with acc starting at 0, x the rounded inputs and sum_x the group's rounded input sum in
// the fixed order of group_sum. (On the grid the pair steps' roundings never round: d is
// exact, so its order is moot; the rest of the sequence is what the builds share.)
// vdpbf16ps does exactly the pair step (its documented order: the odd element first, each
// sum rounded to float32; checked bit for bit on Zen 5 over 2^20 random lanes), and the
// other builds do it with two FMAs, which round an exact product's sum the same way. Every
// column is one vector lane, so the path (direct or buffered) and the build do not change
// a row's result. The limit of "the same bits in every build" (and on the tile kernel):
// groups whose largest input is outside [2^-112, 2^119) (grid.h; below, the
// group is zeroed so no sum is subnormal, where vdpbf16ps and the tile unit flush and the
// FMAs do not) — far outside any activation a model produces.
#include <immintrin.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "vec.h"  // vec, VW, v_zero / v_bcast / v_fma / v_load / v_store
#include "q4.h"
#include "op.h"
#include "split.h"  // iterations_per_chunk
#include "sums.h"  // KEEP_IN_REGISTER

#define LANES 16   // output columns per packed tile
#define GROUP Q4_GROUP  // input columns per (scale, minimum) pair
#define PAIRS (GROUP / 2)  // pairs of input columns per group: one packed byte per column
#define KB 128     // input columns per unpacked block in the buffered path
#define MCHUNK 128  // rows per accumulator block in the buffered path
#define UNROLL _Pragma("GCC unroll 16")

// The vector type and its few operations, so every build shares the loops below.
#ifdef __AVX512F__
// Rows up to which the direct path runs (its partial and running sums are 2 registers a
// row), and the buffered path's register tile: MR rows x NT tiles of a group's partial sums
// beside the tiles' weights and a broadcast. The bfloat16 build's weights are one register
// a tile (6 x 4: 24 + 4 + 1), the plain build's two (6 x 3: 18 + 6 + 1; at 6 x 4 the
// compiler kept two partial sums on the stack, and 8-96 rows took 1.05-1.06x the time).
// The direct path to 12 rows (24 sums + a pair's weights + a broadcast in the plain build):
// the default model's forward of 8 and of 12 positions took 0.63x the time of the buffered
// path's in the bfloat16 build (Zen 5), which had made a 7-row forward 1.5x a 6-row one;
// the plain build's 120 layer matmuls at 7-12 rows 0.84-0.94x the time of a 6-row direct
// path (Intel Xeon with AMX, where auto picks the plain build: see int4_cpu.py).
#define DIRECT_MAX_ROWS 12
#ifdef __AVX512BF16__
#define NT 4
#else
#define NT 3
#endif
#define MR 6
// The direct path reads one weight stream; a software prefetch this many bytes ahead made
// 1-2 rows 0.88x the time on a Skylake-SP Xeon, and on Zen 5 the whole model's one-token
// step 0.75-0.88x and a 5-row verify 0.85-0.9x (1024 and 4096 no better). (Four weights that
// stay in cache ran faster without it: the model's ~70 MB stream from memory.)
#define PREFETCH_AHEAD 2048
INLINE vec v_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
#else
// AVX2 has 16 vector registers, and a group's partial sums and the running sums both live
// in them in the direct path: measured on Zen 5 (all four layer shapes of the default
// model, one process), a 4-row direct path was fastest (3 rows 0.78x the time of a 2-row
// one). The buffered tile: 5 rows, 10 partial sums + 4 weight vectors + a broadcast (at 6
// rows one sum spilled to the stack; 5 and 6 measured within 3% of each other at 8-96 rows).
#define DIRECT_MAX_ROWS 4
#define MR 5
#define NT 1
#define PREFETCH_AHEAD 0
INLINE vec v_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
#endif
#define NV (LANES / VW)  // vectors per tile

// packed: the AVX-512 builds' [N/16][K/2][16] bytes, byte j of pair p = q[n0+j][2p] |
// q[n0+j][2p+1] << 4; the AVX2 build's planes (int4_cpu.PLANES_ISA): [N/16][K/8][16] little-endian
// 32-bit lanes, lane c of block b holding q[n0+c][8b+2j] in bits 4j..4j+3 and
// q[n0+c][8b+2j+1] in bits 16+4j..19+4j (j = 0..3), so that one shift and one mask give
// 8 columns' int16 pairs (q[2p], q[2p+1]) in order, which vpmaddwd multiplies by an input
// pair (direct_int; the byte layout needs a widening and two interleaves a pair, and took
// 1.4x the time on Zen 3). int4_cpu.pack writes both.
// scale, minimum: [N/16][K/32][16] float16 (GGUF's Q4_1 keeps them in float16, so they
// are the file's values exactly; float32 copies would add a fifth to the bytes a
// one-row step streams from memory).
typedef struct {
    const uint8_t *packed;
    const uint16_t *scale, *minimum;
    int n, k;
} q4_weight;

// A "pair" is VW columns' q at input columns 2p and 2p+1, unpacked from the packed weight
// (tile_pair: the v-th VW columns of a tile); dot_pair is the pair step of the arithmetic
// above for one row.
#ifdef __AVX512BF16__
typedef uint16_t xin;   // the inner loops read the rounded bfloat16 inputs as they are
typedef __m512i wpair;  // per lane: q[2p] (low half) and q[2p+1] as bfloat16
INLINE wpair tile_pair(const q4_weight *w, size_t tile, int p, int v) {
    return unpack_pair_bf16(w->packed + (tile * (w->k / 2) + p) * LANES + VW * v);
}
INLINE vec dot_pair(vec d, const xin *x, int p, wpair w) {
    int32_t pair;  // x[2p] and x[2p+1], side by side in memory as in a lane of w
    memcpy(&pair, x + 2 * p, sizeof pair);
    return _mm512_dpbf16_ps(d, (__m512bh)_mm512_set1_epi32(pair), (__m512bh)w);
}
#else
typedef float xin;  // the inputs converted to float32 once per call
typedef struct {
    vec lo, hi;  // q at input columns 2p and 2p+1, as float32
} wpair;
INLINE wpair tile_pair(const q4_weight *w, size_t tile, int p, int v) {
    wpair pair;
#ifdef __AVX512F__
    // int -> float by a table lookup: a permute reads only an index's low 4 bits, so it
    // masks the low nibble for free. The same exact values as a conversion.
    const uint8_t *bytes = w->packed + (tile * (w->k / 2) + p) * LANES + VW * v;
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    pair.lo = _mm512_permutexvar_ps(q, values);
    pair.hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), values);
#else  // the planes: block p / 4, lanes of the v-th 8 columns, shifted to pair p % 4
    const __m256i *block = (const __m256i *)(w->packed + (tile * (w->k / 8) + p / 4) * 4 * LANES);
    const __m256i low = _mm256_srl_epi32(_mm256_loadu_si256(block + v), _mm_cvtsi32_si128(4 * (p % 4)));
    pair.lo = _mm256_cvtepi32_ps(_mm256_and_si256(low, _mm256_set1_epi32(15)));
    pair.hi = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(low, 16), _mm256_set1_epi32(15)));
#endif
    return pair;
}
INLINE vec dot_pair(vec d, const xin *x, int p, wpair w) {  // vdpbf16ps's order: 2p+1 first
    d = v_fma(v_bcast(x + 2 * p + 1), w.hi, d);
    return v_fma(v_bcast(x + 2 * p), w.lo, d);
}
#endif

// A call's inputs as the inner loops read them, and each row's group sums [M][K/32].
typedef struct {
    const xin *x;
    const float *sums;
    int ld, groups;  // x's row stride and the sums' (K and K/32)
} q4_input;

// A group's scales and minimums for one tile, as float32.
INLINE void group_scales(const q4_weight *w, size_t tile, int g, vec *s, vec *m) {
    UNROLL for (int v = 0; v < NV; v++) {
        const size_t at = (tile * (w->k / GROUP) + g) * LANES + VW * v;
        s[v] = v_f16(w->scale + at);
        m[v] = v_f16(w->minimum + at);
    }
}

INLINE void store_row(const vec *acc, uint16_t *y) {  // one row's 16 columns -> bfloat16
    float out[LANES];
    UNROLL for (int v = 0; v < NV; v++) v_store(out + VW * v, acc[v]);
    UNROLL for (int j = 0; j < LANES; j += 8) store_bf16(y + j, _mm256_loadu_ps(out + j));
}

// Few rows: unpack into registers and use each pair at once, one 16-column tile at a time.
// (The AVX2 build runs every call whose inputs lie on the grid in integers: see direct_int.)
// One tile a call, also for one or two rows, whose single chain of dependent steps per
// column is the shortest: two tiles interleaved per call hid that latency, but made two
// weight streams a thread, and with each thread on a contiguous run of tiles (split.h) one
// tile at a time took 0.85-0.91x the time at one and two rows in every build (the default
// model's 120 layer matmuls, an AMD EPYC Zen 4: bfloat16, VNNI and AVX2 builds).
INLINE void direct(const int R, const q4_weight *w, const q4_input *in, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n;
    // Sized by the largest call, not by R: arrays sized by parameters are kept on
    // the stack even once inlined with constants (read in the generated code).
    vec acc[DIRECT_MAX_ROWS][NV];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) acc[r][v] = v_zero();
    for (int g = 0; g < K / GROUP; g++) {
        vec d[DIRECT_MAX_ROWS][NV];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) d[r][v] = v_zero();
        for (int p = g * PAIRS; p < (g + 1) * PAIRS; p++) {
            if (PREFETCH_AHEAD && (p & 3) == 0)  // once per line (the AVX-512 builds' byte layout)
                _mm_prefetch((const char *)(w->packed + ((size_t)tile0 * (K / 2) + p) * LANES) + PREFETCH_AHEAD, _MM_HINT_T0);
            UNROLL for (int v = 0; v < NV; v++) {
                const wpair q = tile_pair(w, (size_t)tile0, p, v);
                UNROLL for (int r = 0; r < R; r++) d[r][v] = dot_pair(d[r][v], in->x + (size_t)r * in->ld, p, q);
            }
        }
        vec s[NV], m[NV];
        group_scales(w, (size_t)tile0, g, s, m);
        UNROLL for (int r = 0; r < R; r++) {
            const vec sum = v_bcast(in->sums + (size_t)r * in->groups + g);
            UNROLL for (int v = 0; v < NV; v++) acc[r][v] = v_fma(m[v], sum, v_fma(s[v], d[r][v], acc[r][v]));
        }
    }
    UNROLL for (int r = 0; r < R; r++) store_row(acc[r], y + (size_t)r * N + tile0 * LANES);
}

// A call of at most DIRECT_MAX_ROWS rows over every tile, by DIRECT (direct, or the VNNI
// build's direct_int), one tile at a time.
#if DIRECT_MAX_ROWS > 4
#define MORE_DIRECT_CASES(DIRECT, w, in, u, y)                                                                  \
    case 4: DIRECT(4, w, in, u, y); break;   case 5: DIRECT(5, w, in, u, y); break;                           \
    case 6: DIRECT(6, w, in, u, y); break;   case 7: DIRECT(7, w, in, u, y); break;                           \
    case 8: DIRECT(8, w, in, u, y); break;   case 9: DIRECT(9, w, in, u, y); break;                           \
    case 10: DIRECT(10, w, in, u, y); break; case 11: DIRECT(11, w, in, u, y); break;
#else
#define MORE_DIRECT_CASES(DIRECT, w, in, u, y)
#endif
#define DIRECT_OVER_TILES(DIRECT, w, in, y, M)                                                                  \
    do {                                                                                                        \
        const int tiles_ = (w)->n / LANES, chunk_ = iterations_per_chunk(tiles_);                               \
        _Pragma("omp parallel for schedule(dynamic, chunk_)")                                                   \
        for (int t = 0; t < tiles_; t++) DIRECT_ROWS(DIRECT, w, in, t, y, M);                                   \
    } while (0)
// R (at most DIRECT_MAX_ROWS) rows over tile u by DIRECT, a compile-time row count per case
// (the sums stay in registers).
#define DIRECT_ROWS(DIRECT, w, in, u, y, R)                                                                     \
    do {                                                                                                        \
        switch (R) {                                                                                            \
        case 1: DIRECT(1, w, in, u, y); break;                                                                  \
        case 2: DIRECT(2, w, in, u, y); break;                                                                  \
        case 3: DIRECT(3, w, in, u, y); break;                                                                  \
        MORE_DIRECT_CASES(DIRECT, w, in, u, y)                                                                  \
        default: DIRECT(DIRECT_MAX_ROWS, w, in, u, y); break;                                                   \
        }                                                                                                       \
    } while (0)

// The integer few-row paths: the AVX2 build's (vpmaddwd) and the AVX-512 VNNI build's
// (vpdpwssd). Both read the rounded inputs as int16 multiples of their group's step.
#if !defined(__AVX512F__) || (defined(__AVX512VNNI__) && !defined(__AVX512BF16__))
#define INTEGER_PATH 1
#else
#define INTEGER_PATH 0
#endif

#if INTEGER_PATH
typedef struct {
    const int16_t *x;    // [M][K] the rounded inputs in steps
    const float *step;   // [M][K/32] each group's step
    const float *sums;   // [M][K/32]
    int ld, groups;
} q4_int_input;
#endif

#ifndef __AVX512F__
// The AVX2 build's few-row path in integers. On the grid (round_group) an input is an
// integer multiple of its group's step 2^(E - 14) below 2^15 steps (E: the exponent of the
// group's largest; a bfloat16 at exponent E has 8 significant bits, so none rounds up to
// 2^(E + 1)): it fits an int16. vpmaddwd multiplies two int16 inputs by two int16 weights
// and adds the products into an int32 lane, which is the pair step; a group's 16 pair
// steps sum under 2^24, so the int32 total converted to float32 and scaled by the step
// (a power of two) is exactly the d of the float path: the same bits, from about 2/3 of
// the float path's instructions (no int -> float conversion of the weights, half the
// multiply-add instructions). The planes layout (q4_weight) hands it a tile's columns in
// order, 8 a vector, from one shift and one mask per pair.
// Rows the integer path runs over a tile's weights at a time (the weights are unpacked again
// for each block of rows, from L1; on Zen 3 the default model's 120 layer matmuls took at 5
// and 16 rows 0.89x and 0.93x the time of 4-row blocks, 8-row blocks no faster). Every call
// whose inputs lie on the grid takes this path, however many rows: on Zen 3 the 120 layer
// matmuls took 0.74x the buffered float path's time at 64, 96, 128 and 256 rows.
#define INT_ROWS 6
#define INT_MAX_ROWS INT_MAX
// The integer path reads the weight stream with a software prefetch this many bytes ahead,
// as the AVX-512 direct path does: the default model's 120 layer matmuls at one row, their
// ~66 MB from memory, took 0.92-0.95x the time with it on Zen 3 (1024 as good, 4096 worse).
#define PREFETCH_AHEAD_INT 2048
_Static_assert(INT_ROWS == 6, "matmul_rows_int's cases cover 1 .. INT_ROWS - 1 rows");

// Block b's lanes for pair 4b + j (planes: see q4_weight): 8 columns' int16 pairs
// (q[2p], q[2p+1]) in their int32 lanes, one shift and one mask.
#define PLANE(v, j) _mm256_and_si256((j) ? _mm256_srli_epi32(v, 4 * (j)) : (v), _mm256_set1_epi32(0x000F000F))

INLINE void direct_int(const int R, const q4_weight *w, const q4_int_input *in, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n;
    vec acc[INT_ROWS][NV];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) acc[r][v] = v_zero();
    const __m256i *blocks = (const __m256i *)(w->packed + (size_t)tile0 * (K / 8) * 4 * LANES);
    for (int g = 0; g < K / GROUP; g++) {
        __m256i d[INT_ROWS][NV];
        UNROLL for (int r = 0; r < R; r++) d[r][0] = d[r][1] = _mm256_setzero_si256();
        UNROLL for (int b = g * GROUP / 8; b < (g + 1) * GROUP / 8; b++) {  // 8 inputs a block
            if (PREFETCH_AHEAD_INT) _mm_prefetch((const char *)(blocks + 2 * b) + PREFETCH_AHEAD_INT, _MM_HINT_T0);
            const __m256i lo = _mm256_loadu_si256(blocks + 2 * b), hi = _mm256_loadu_si256(blocks + 2 * b + 1);
            UNROLL for (int j = 0; j < 4; j++) {
                const __m256i a = PLANE(lo, j), c = PLANE(hi, j);  // columns 0-7, 8-15
                UNROLL for (int r = 0; r < R; r++) {
                    int32_t pair;  // x[2p] (low half) and x[2p+1], as in a lane of a and c
                    memcpy(&pair, in->x + (size_t)r * in->ld + 8 * b + 2 * j, sizeof pair);
                    const __m256i xp = _mm256_set1_epi32(pair);
                    d[r][0] = _mm256_add_epi32(d[r][0], _mm256_madd_epi16(a, xp));
                    d[r][1] = _mm256_add_epi32(d[r][1], _mm256_madd_epi16(c, xp));
                    KEEP_IN_REGISTER(d[r][0]);
                    KEEP_IN_REGISTER(d[r][1]);
                }
            }
        }
        vec s[NV], m[NV];
        group_scales(w, (size_t)tile0, g, s, m);
        UNROLL for (int r = 0; r < R; r++) {
            const vec step = v_bcast(in->step + (size_t)r * in->groups + g), sum = v_bcast(in->sums + (size_t)r * in->groups + g);
            UNROLL for (int v = 0; v < NV; v++)
                acc[r][v] = v_fma(m[v], sum, v_fma(s[v], _mm256_mul_ps(_mm256_cvtepi32_ps(d[r][v]), step), acc[r][v]));
        }
    }
    UNROLL for (int r = 0; r < R; r++) store_row(acc[r], y + (size_t)r * N + tile0 * LANES);
}

#endif  // !__AVX512F__


#ifndef __AVX512F__
static void matmul_rows_int(const q4_int_input *in, const q4_weight *w, uint16_t *y, int M) {
    const int tiles = w->n / LANES;
    const int chunk = iterations_per_chunk(tiles);
    #pragma omp parallel for schedule(dynamic, chunk)
    for (int u = 0; u < tiles; u++)
        for (int r0 = 0; r0 < M; r0 += INT_ROWS) {  // a tile's weights stay in L1 for the next block of rows
            const q4_int_input rows = {in->x + (size_t)r0 * in->ld, in->step + (size_t)r0 * in->groups,
                                       in->sums + (size_t)r0 * in->groups, in->ld, in->groups};
            uint16_t *out = y + (size_t)r0 * w->n;
            switch (M - r0 < INT_ROWS ? M - r0 : INT_ROWS) {
#define CASE(r) case r: direct_int(r, w, &rows, u, out); break;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5)
#undef CASE
            default: direct_int(INT_ROWS, w, &rows, u, out); break;
            }
        }
}
#endif

#if INTEGER_PATH && defined(__AVX512F__)
// The AVX-512 VNNI build's few-row path: AVX2's integer arithmetic (see direct_int) on
// 16 columns a vector, where vpdpwssd is vpmaddwd and the add in one instruction. A
// tile's byte j (q[2p] | q[2p+1] << 4) widened to an int32 lane becomes the pair
// (q[2p], q[2p+1]) as two int16 by one shift and one masked merge, columns in order; each
// row then costs one instruction per pair and tile (the float path: a table lookup per
// nibble, then two FMAs per row). Same bits as the float path: a group's d is exact in both.
#define INT_MAX_ROWS DIRECT_MAX_ROWS
INLINE __m512i unpack_pair_int(const uint8_t *bytes) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    return _mm512_and_si512(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)), _mm512_set1_epi32(0x000F000F));
}

INLINE void direct_int(const int R, const q4_weight *w, const q4_int_input *in, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n;
    vec acc[DIRECT_MAX_ROWS];
    UNROLL for (int r = 0; r < R; r++) acc[r] = v_zero();
    for (int g = 0; g < K / GROUP; g++) {
        __m512i d[DIRECT_MAX_ROWS];
        UNROLL for (int r = 0; r < R; r++) d[r] = _mm512_setzero_si512();
        for (int p = g * PAIRS; p < (g + 1) * PAIRS; p++) {
            const uint8_t *b = w->packed + ((size_t)tile0 * (K / 2) + p) * LANES;
            if (PREFETCH_AHEAD && (p & 3) == 0) _mm_prefetch((const char *)b + PREFETCH_AHEAD, _MM_HINT_T0);  // once per line
            const __m512i q = unpack_pair_int(b);
            UNROLL for (int r = 0; r < R; r++) {
                int32_t pair;  // x[2p] (low half) and x[2p+1], as in a lane of q
                memcpy(&pair, in->x + (size_t)r * in->ld + 2 * p, sizeof pair);
                d[r] = _mm512_dpwssd_epi32(d[r], q, _mm512_set1_epi32(pair));
            }
        }
        vec s[NV], m[NV];
        group_scales(w, (size_t)tile0, g, s, m);
        UNROLL for (int r = 0; r < R; r++) {
            const vec step = v_bcast(in->step + (size_t)r * in->groups + g), sum = v_bcast(in->sums + (size_t)r * in->groups + g);
            acc[r] = v_fma(m[0], sum, v_fma(s[0], _mm512_mul_ps(_mm512_cvtepi32_ps(d[r]), step), acc[r]));
        }
    }
    UNROLL for (int r = 0; r < R; r++) store_row(&acc[r], y + (size_t)r * N + tile0 * LANES);
}

static void matmul_rows_int(const q4_int_input *in, const q4_weight *w, uint16_t *y, int M) {
    DIRECT_OVER_TILES(direct_int, w, in, y, M);
}
#endif

// A block of the buffered path: KB input columns of NT tiles, unpacked, with the scales
// and minimums of its groups as float32 (zeros for tiles past the weight's last).
typedef struct {
    wpair q[KB / 2][NT * NV];
    float scale[KB / GROUP][NT * LANES], minimum[KB / GROUP][NT * LANES];
} q4_block;

static void unpack_block(const q4_weight *w, int tile0, int tiles, int k0, int kb, q4_block *block) {
    const int K = w->k;  // k0 and kb are multiples of GROUP
    for (int t = 0; t < tiles; t++) {
        const size_t tile = (size_t)tile0 + t;
        for (int p = k0 / 2; p < (k0 + kb) / 2; p++)
            UNROLL for (int v = 0; v < NV; v++) block->q[p - k0 / 2][t * NV + v] = tile_pair(w, tile, p, v);
        for (int g = k0 / GROUP; g < (k0 + kb) / GROUP; g++) {
            vec s[NV], m[NV];
            group_scales(w, tile, g, s, m);
            UNROLL for (int v = 0; v < NV; v++) {
                v_store(block->scale[g - k0 / GROUP] + t * LANES + VW * v, s[v]);
                v_store(block->minimum[g - k0 / GROUP] + t * LANES + VW * v, m[v]);
            }
        }
    }
}

// R rows (R <= MR) over a block: per group, an R x 16 NT register tile of partial sums,
// then the running sums in acc (rows of NT * 16 floats) take scale and minimum.
// x and sums point at the block's first input column and group of the first row.
INLINE void micro(const int R, const xin *x, int ldx, const float *sums, int lds, const q4_block *block, int kb,
                  float *acc) {
    const int width = NT * LANES;
    for (int gb = 0; gb < kb / GROUP; gb++) {
        vec d[MR][NT * NV];
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int j = 0; j < NT * NV; j++) d[r][j] = v_zero();
        for (int p = gb * PAIRS; p < (gb + 1) * PAIRS; p++) {
            wpair q[NT * NV];
            UNROLL for (int j = 0; j < NT * NV; j++) q[j] = block->q[p][j];
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int j = 0; j < NT * NV; j++) d[r][j] = dot_pair(d[r][j], x + (size_t)r * ldx, p, q[j]);
        }
        UNROLL for (int r = 0; r < R; r++) {
            const vec sum = v_bcast(sums + (size_t)r * lds + gb);
            UNROLL for (int j = 0; j < NT * NV; j++) {
                float *a = acc + r * width + VW * j;
                v_store(a, v_fma(v_load(block->minimum[gb] + VW * j), sum, v_fma(v_load(block->scale[gb] + VW * j), d[r][j], v_load(a))));
            }
        }
    }
}

_Static_assert(MR == 5 || MR == 6, "micro_any's cases cover 1 .. MR - 1 rows");
_Static_assert(DIRECT_MAX_ROWS == 4 || DIRECT_MAX_ROWS == 12, "matmul_rows' cases cover 1 .. DIRECT_MAX_ROWS - 1 rows");

static void micro_any(int R, const xin *x, int ldx, const float *sums, int lds, const q4_block *block, int kb, float *acc) {
    switch (R) {  // a compile-time R per case: the tile stays in registers
#define CASE(r) case r: micro(r, x, ldx, sums, lds, block, kb, acc); break;
    CASE(1) CASE(2) CASE(3) CASE(4)
#if MR > 5
    CASE(5)
#endif
#undef CASE
    default: micro(MR, x, ldx, sums, lds, block, kb, acc); break;
    }
}

// Many rows: unpack a block of NT tiles once into L1, then run every row over it. A last
// group with fewer than NT tiles computes zeros in the missing columns and drops them.
static void buffered_group(const q4_weight *w, const q4_input *in, int M, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n, width = NT * LANES;
    const int tiles = N / LANES - tile0 < NT ? N / LANES - tile0 : NT;
    q4_block block __attribute__((aligned(64)));
    float acc[MCHUNK * NT * LANES] __attribute__((aligned(64)));
    if (tiles < NT) memset(&block, 0, sizeof(block));
    for (int m0 = 0; m0 < M; m0 += MCHUNK) {
        const int rows = M - m0 < MCHUNK ? M - m0 : MCHUNK;
        memset(acc, 0, sizeof(float) * rows * width);
        for (int k0 = 0; k0 < K; k0 += KB) {
            const int kb = K - k0 < KB ? K - k0 : KB;
            unpack_block(w, tile0, tiles, k0, kb, &block);
            for (int r = 0; r < rows; r += MR)
                micro_any(rows - r < MR ? rows - r : MR, in->x + (size_t)(m0 + r) * in->ld + k0, in->ld,
                          in->sums + (size_t)(m0 + r) * in->groups + k0 / GROUP, in->groups, &block, kb, acc + r * width);
        }
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < tiles * LANES; j += 8)
                store_bf16(y + (size_t)(m0 + r) * N + tile0 * LANES + j, _mm256_loadu_ps(acc + r * width + j));
    }
}

// More rows than the direct path takes, up to BLOCKED_MAX_ROWS: each tile's rows in blocks
// of at most DIRECT_MAX_ROWS by the direct path, one after another while the tile's weights
// are in L1, in blocks as even as the count allows (16 rows as 8 + 8, not 12 + 4: a block of
// 4 rows does a third of the multiply-adds per weight unpacked). The 120 layer matmuls of
// the default model against the buffered path (AMD EPYC Zen 4, benchmarks/kernels.py's
// shapes, bfloat16 build, 7 alternated rounds): 13 rows 0.66x the time, 16 rows 0.74x,
// 24 0.75x, 32 0.82x, 48 0.88x, 64 1.01-1.05x; the plain AVX-512 build 16 rows 0.68x, 48
// 0.91x. Past that the buffered path's register tile, fed from L1, is the faster.
#ifdef __AVX512F__
#define BLOCKED_MAX_ROWS 48
#else
#define BLOCKED_MAX_ROWS DIRECT_MAX_ROWS  // the AVX2 build runs these rows in integers (matmul_rows_int)
#endif
_Static_assert(BLOCKED_MAX_ROWS >= DIRECT_MAX_ROWS, "direct_blocks takes the rows past the direct path's");
static void direct_blocks(const q4_input *in, const q4_weight *w, uint16_t *y, int M) {
    const int tiles = w->n / LANES, blocks = (M + DIRECT_MAX_ROWS - 1) / DIRECT_MAX_ROWS;
    const int chunk = iterations_per_chunk(tiles);
    #pragma omp parallel for schedule(dynamic, chunk)
    for (int t = 0; t < tiles; t++)
        for (int b = 0, r0 = 0; b < blocks; b++) {
            const int rows = (M - r0) / (blocks - b);
            const q4_input part = {in->x + (size_t)r0 * in->ld, in->sums + (size_t)r0 * in->groups, in->ld, in->groups};
            DIRECT_ROWS(direct, w, &part, t, y + (size_t)r0 * w->n, rows);
            r0 += rows;
        }
}

static void matmul_rows(const q4_input *in, const q4_weight *w, uint16_t *y, int M) {
    const int tiles = w->n / LANES;
    if (M > DIRECT_MAX_ROWS && M <= BLOCKED_MAX_ROWS) {
        direct_blocks(in, w, y, M);
        return;
    }
    if (M > DIRECT_MAX_ROWS) {
        // schedule(dynamic): a thread slowed by another process on its core takes fewer tiles instead of
        // holding the others at the barrier; a tile's outputs are one thread's, so the split never changes a bit.
        #pragma omp parallel for schedule(dynamic, 1)
        for (int t = 0; t < tiles; t += NT) buffered_group(w, in, M, t, y);
        return;
    }
    DIRECT_OVER_TILES(direct, w, in, y, M);
}

// y = x @ W^T. x: [M][K] bfloat16, y: [M][N] bfloat16. The caller checks N % 16 == 0 and
// K % 32 == 0 and passes contiguous tensors. (8 arguments: each one costs the caller's
// ctypes a conversion, and a one-row call is mostly that overhead.)
void int4_matmul(const uint16_t *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                 uint16_t *y, int M, int N, int K) {
    if (M <= 0) return;  // no rows: the few-rows path would run a 2-row call on rows that are not there
    const int groups = K / GROUP;
    const size_t n = (size_t)M * K;
    // The scratch: the rounded inputs (bfloat16, see round_group), each row's group sums,
    // and in the FMA builds the rounded inputs as float32.
    const size_t rounded_floats = (n / 2 + 15) / 16 * 16, sum_floats = ((size_t)M * groups + 15) / 16 * 16;
#ifdef __AVX512BF16__
    float *scratch = input_buffer_for(rounded_floats + sum_floats);
#else
    float *scratch = input_buffer_for(rounded_floats + 2 * sum_floats + n + 16);  // x32, or the integer path's inputs and steps
#endif
    uint16_t *rounded = (uint16_t *)scratch;
    float *sums = scratch + rounded_floats;
    prepare_inputs(x, rounded, sums, M, K, GRID_BITS);
#ifdef __AVX512BF16__
    const xin *inputs = rounded;
#else
    float *x32 = sums + sum_floats;
#if INTEGER_PATH
    if (M <= INT_MAX_ROWS) {  // the integer path; x32's room holds its inputs and steps
        int16_t *steps_x = (int16_t *)x32;
        float *steps = x32 + (n / 2 + 15) / 16 * 16;
        if (inputs_in_steps(rounded, steps_x, steps, M, K, GRID_BITS)) {
            const q4_int_input in = {steps_x, steps, sums, K, groups};
            const q4_weight w = {packed, scale, minimum, N, K};
            matmul_rows_int(&in, &w, y, M);
            return;
        }
    }
#endif
    for (size_t i = 0; i < n; i += 8) _mm256_storeu_ps(x32 + i, load_bf16(rounded + i));
    const xin *inputs = x32;
#endif
    const q4_input in = {inputs, sums, K, groups};
    const q4_weight w = {packed, scale, minimum, N, K};
    matmul_rows(&in, &w, y, M);
}

// int4_matmul with op.h's arguments: x, packed, scale, minimum, y, M, N, K.
void int4_matmul_op(const int64_t *a) {
    int4_matmul(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), (int)a[5], (int)a[6], (int)a[7]);
}
