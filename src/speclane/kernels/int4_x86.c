// Weight-only int4 matmul for x86-64: bfloat16 activations, float32 accumulation,
// bfloat16 output. Built twice by build.py, for AVX2 + FMA + F16C (8-float vectors) and
// for AVX-512 (16-float vectors), and loaded by int4_cpu.py.
//
// Why our own: torch's CPU int4 kernel dequantizes its weights again for every block of
// 4 rows, so a 5-row call costs two 4-row calls and 16 rows cost ~6x one row. A
// speculative round verifies K+1 rows of one sequence and a mixed tick holds every
// stream's row: here the cost of rows should be the FMAs, not the dequantization.
// Few rows dequantize into registers and use each weight at once; more rows dequantize a
// 128-input-column block of NT 16-column tiles into L1 once and run all rows over it with
// a register tile of MR rows x 16 NT columns.
//
// Batch invariance: every output element is computed by the same sequence of operations
// whatever the number of rows M: w = fma(q, scale, minimum) in float32, then
// acc = fma(x[m][k], w, acc) for k = 0, 1, ..., K-1 with one accumulator per (row, column).
// Both paths below (direct for few rows, buffered for many) keep that sequence, so a row's
// result does not depend on how many rows share the call. Each column is one vector lane
// doing exactly those operations, so the AVX2 and AVX-512 builds give the same bits too.
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define LANES 16   // output columns per packed tile
#define GROUP 32   // input columns per (scale, minimum) pair
#define KB 128     // input columns per dequantized block in the buffered path (8 NT KiB)
#define MCHUNK 128  // rows per accumulator block in the buffered path (a 96-token prefill: one block, 0.94x the time of 64)
#define UNROLL _Pragma("GCC unroll 16")

// The vector type and its few operations, so both builds share every loop below.
#ifdef __AVX512F__
#define VW 16  // floats per vector: one vector covers a tile's 16 columns
// Rows up to which the direct path runs (3-7 rows: direct and buffered within the noise),
// and the buffered path's register tile: 6 rows x 4 tiles, 24 accumulators, 4 weight
// vectors and a broadcast of the 32 registers; per input column 10 loads feed 24 FMAs.
// 12 x 1 tiles (the first version: 13 loads for 12 FMAs) reached 70 GFLOPS at 96 rows,
// 12 x 2 90, 8 x 3 99, 6 x 4 106 (the default model's four layer shapes, /tmp A/B in one
// process on a 2-core Xeon, 2026-12-01; torch's float32 GEMM: ~94 at 96 rows).
#define DIRECT_MAX_ROWS 6
#define MR 6
#define NT 4
// The direct path reads one weight stream; a software prefetch this many bytes ahead made
// 1-2 rows 0.88x the time here (no gain measured in the AVX2 build, which has none).
#define PREFETCH_AHEAD 2048
// 1-2 rows: tiles interleaved per direct() call (1 row: 0.85x the time of one tile at a
// time; 3 and 4 tiles measured no better than 2).
#define TILES_PER_CALL 2
typedef __m512 vec;
INLINE vec v_zero(void) { return _mm512_setzero_ps(); }
INLINE vec v_bcast(const float *p) { return _mm512_set1_ps(*p); }
INLINE vec v_fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
INLINE vec v_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void v_store(float *p, vec v) { _mm512_storeu_ps(p, v); }
INLINE vec v_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
// Columns' values at input columns 2p (lo) and 2p+1 (hi) from their VW packed bytes.
INLINE void v_dequant_pair(const uint8_t *bytes, vec s, vec m, vec *lo, vec *hi) {
    // int -> float by a table lookup, not a conversion: a permute reads only an index's low
    // 4 bits (so it masks the low nibble for free) and runs on the shuffle port, leaving
    // the FMA port to the FMAs. The same exact values as a conversion: the same bits.
    const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    *lo = _mm512_fmadd_ps(_mm512_permutexvar_ps(q, values), s, m);
    *hi = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), values), s, m);
}
#else
#define VW 8
// AVX2 has 16 vector registers: 4 rows x 2 vectors of accumulators in the direct path
// (measured: direct 4 rows 17.6 ms vs buffered 22.3 ms, 5 rows even, 6 rows slower).
#define DIRECT_MAX_ROWS 4
#define MR 6
#define NT 1  // a tile is two vectors here: 6 x 2 accumulators of the 16 registers
#define PREFETCH_AHEAD 0
#define TILES_PER_CALL 1  // a tile is two vectors here: two chains already (2 measured no better)
typedef __m256 vec;
INLINE vec v_zero(void) { return _mm256_setzero_ps(); }
INLINE vec v_bcast(const float *p) { return _mm256_broadcast_ss(p); }
INLINE vec v_fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
INLINE vec v_load(const float *p) { return _mm256_loadu_ps(p); }
INLINE void v_store(float *p, vec v) { _mm256_storeu_ps(p, v); }
INLINE vec v_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INLINE void v_dequant_pair(const uint8_t *bytes, vec s, vec m, vec *lo, vec *hi) {
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes));
    *lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15))), s, m);
    *hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), s, m);
}
#endif
#define NV (LANES / VW)  // vectors per tile

// packed: [N/16][K/2][16] bytes, byte j of pair p = q[n0+j][2p] | q[n0+j][2p+1] << 4.
// scale, minimum: [N/16][K/32][16] float16 (GGUF's Q4_1 keeps them in float16, so they
// are the file's values exactly; float32 copies would add a fifth to the bytes a
// one-row step streams from memory).
typedef struct {
    const uint8_t *packed;
    const uint16_t *scale, *minimum;
    int n, k;
} q4_weight;

// A group's scales and minimums for one tile, converted once per group.
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

// Few rows: dequantize into registers and use each vector at once, TT 16-column tiles at
// a time with their group's scales and minimums held in registers. One row has a single
// chain of dependent FMAs per column (acc = fma(x, w, acc), K long): interleaving the
// independent chains of TT tiles hides the FMA's latency without changing any column's
// operations. (More rows are more chains already.)
INLINE void direct(const int R, const int TT, const q4_weight *w, const float *x, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n;
    vec acc[TT][R][NV];
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) UNROLL for (int v = 0; v < NV; v++) acc[t][r][v] = v_zero();
    for (int g = 0; g < K / GROUP; g++) {
        vec s[TT][NV], m[TT][NV];
        UNROLL for (int t = 0; t < TT; t++) group_scales(w, (size_t)tile0 + t, g, s[t], m[t]);
        for (int p = g * GROUP / 2; p < (g + 1) * GROUP / 2; p++) {
            UNROLL for (int t = 0; t < TT; t++) {
                const uint8_t *b = w->packed + ((size_t)(tile0 + t) * (K / 2) + p) * LANES;
                if (PREFETCH_AHEAD && (p & 3) == 0) _mm_prefetch((const char *)b + PREFETCH_AHEAD, _MM_HINT_T0);  // once per line
                UNROLL for (int v = 0; v < NV; v++) {
                    vec lo, hi;
                    v_dequant_pair(b + VW * v, s[t][v], m[t][v], &lo, &hi);
                    UNROLL for (int r = 0; r < R; r++) {
                        acc[t][r][v] = v_fma(v_bcast(x + r * K + 2 * p), lo, acc[t][r][v]);
                        acc[t][r][v] = v_fma(v_bcast(x + r * K + 2 * p + 1), hi, acc[t][r][v]);
                    }
                }
            }
        }
    }
    UNROLL for (int t = 0; t < TT; t++) UNROLL for (int r = 0; r < R; r++) store_row(acc[t][r], y + (size_t)r * N + (tile0 + t) * LANES);
}

// Input columns k0 .. k0+kb of tile `tile`, dequantized into its 16 columns of a block whose
// rows (one per input column) hold `width` floats.
static void dequant_block(const q4_weight *w, size_t tile, int k0, int kb, float *block, int width) {
    const int K = w->k;  // k0 and kb are multiples of GROUP
    for (int g = k0 / GROUP; g < (k0 + kb) / GROUP; g++) {
        vec s[NV], m[NV];
        group_scales(w, tile, g, s, m);
        for (int k = g * GROUP; k < (g + 1) * GROUP; k += 2) {
            const uint8_t *b = w->packed + (tile * (K / 2) + k / 2) * LANES;
            UNROLL for (int v = 0; v < NV; v++) {
                vec lo, hi;
                v_dequant_pair(b + VW * v, s[v], m[v], &lo, &hi);
                v_store(block + (size_t)(k - k0) * width + VW * v, lo);
                v_store(block + (size_t)(k - k0 + 1) * width + VW * v, hi);
            }
        }
    }
}

// R rows (R <= MR) against a dequantized block of NT tiles: an R x 16 NT register tile,
// each accumulator one (row, column) chain in k order.
INLINE void micro(const int R, const float *x, int ldx, const float *block, int kb, float *acc) {
    const int width = NT * LANES;
    vec a[MR][NT * NV];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int j = 0; j < NT * NV; j++) a[r][j] = v_load(acc + r * width + VW * j);
    for (int k = 0; k < kb; k++) {
        vec wv[NT * NV];
        UNROLL for (int j = 0; j < NT * NV; j++) wv[j] = v_load(block + k * width + VW * j);
        UNROLL for (int r = 0; r < R; r++) {
            const vec xv = v_bcast(x + r * ldx + k);
            UNROLL for (int j = 0; j < NT * NV; j++) a[r][j] = v_fma(xv, wv[j], a[r][j]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int j = 0; j < NT * NV; j++) v_store(acc + r * width + VW * j, a[r][j]);
}

_Static_assert(MR == 6, "micro_any's cases cover 1 .. MR - 1 rows");

static void micro_any(int R, const float *x, int ldx, const float *block, int kb, float *acc) {
    switch (R) {  // a compile-time R per case: the tile stays in registers
#define CASE(r) case r: micro(r, x, ldx, block, kb, acc); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5)
#undef CASE
    default: micro(MR, x, ldx, block, kb, acc); break;
    }
}

// Many rows: dequantize a block of NT tiles once into L1, then run every row over it.
// A last group with fewer than NT tiles (N not a multiple of 16 NT) computes zeros in the
// missing columns and drops them.
static void buffered_group(const q4_weight *w, const float *x, int M, int tile0, uint16_t *y) {
    const int K = w->k, N = w->n, width = NT * LANES;
    const int tiles = N / LANES - tile0 < NT ? N / LANES - tile0 : NT;
    float block[KB * NT * LANES] __attribute__((aligned(64)));
    float acc[MCHUNK * NT * LANES] __attribute__((aligned(64)));
    if (tiles < NT) memset(block, 0, sizeof(block));
    for (int m0 = 0; m0 < M; m0 += MCHUNK) {
        const int rows = M - m0 < MCHUNK ? M - m0 : MCHUNK;
        memset(acc, 0, sizeof(float) * rows * width);
        for (int k0 = 0; k0 < K; k0 += KB) {
            const int kb = K - k0 < KB ? K - k0 : KB;
            for (int t = 0; t < tiles; t++) dequant_block(w, (size_t)tile0 + t, k0, kb, block + t * LANES, width);
            for (int r = 0; r < rows; r += MR)
                micro_any(rows - r < MR ? rows - r : MR, x + (size_t)(m0 + r) * K + k0, K, block, kb, acc + r * width);
        }
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < tiles * LANES; j += 8)
                store_bf16(y + (size_t)(m0 + r) * N + tile0 * LANES + j, _mm256_loadu_ps(acc + r * width + j));
    }
}

// y = x32 @ W^T for M rows of float32 inputs.
static void matmul_f32(const float *x32, const q4_weight *w, uint16_t *y, int M) {
    const int tiles = w->n / LANES;
    if (M > DIRECT_MAX_ROWS) {
        #pragma omp parallel for schedule(static)
        for (int t = 0; t < tiles; t += NT) buffered_group(w, x32, M, t, y);
        return;
    }
    // One or two rows: TILES_PER_CALL tiles interleaved per direct() call (see direct).
    const int step = M <= 2 ? TILES_PER_CALL : 1;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t += step) {
        if (step > 1 && t + step <= tiles) {
            if (M == 1) direct(1, TILES_PER_CALL, w, x32, t, y);
            else direct(2, TILES_PER_CALL, w, x32, t, y);
            continue;
        }
        for (int u = t; u < t + step && u < tiles; u++) {
            switch (M) {
#define CASE(r) case r: direct(r, 1, w, x32, u, y); break;
            CASE(1) CASE(2) CASE(3)
#if DIRECT_MAX_ROWS > 4
            CASE(4) CASE(5)
#endif
#undef CASE
            default: direct(DIRECT_MAX_ROWS, 1, w, x32, u, y); break;
            }
        }
    }
}

// The inputs as float32, in a buffer of the calling thread's that grows to the largest call
// and is kept: a prefill's calls would otherwise each map and fault in a fresh ~0.5 MB, and
// a one-row call would pay an allocation that is a good part of its own cost. A thread's
// buffer is freed when the thread exits (a thread-specific key's destructor).
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

// y = x @ W^T. x: [M][K] bfloat16, y: [M][N] bfloat16. The caller checks N % 16 == 0 and
// K % 32 == 0 and passes contiguous tensors. (8 arguments: each one costs the caller's
// ctypes a conversion, and a one-row call is mostly that overhead.)
void int4_matmul(const uint16_t *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                 uint16_t *y, int M, int N, int K) {
    const size_t n = (size_t)M * K;
    float *x32 = input_buffer_for(n);
    for (size_t i = 0; i < n; i += 8) _mm256_storeu_ps(x32 + i, load_bf16(x + i));
    const q4_weight w = {packed, scale, minimum, N, K};
    matmul_f32(x32, &w, y, M);
}
