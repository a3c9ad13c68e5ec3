// Weight-only int4 matmul for x86-64 with AVX2 + FMA + F16C: bfloat16 activations, float32
// accumulation, bfloat16 output. Built and loaded by int4_cpu.py.
//
// Why our own: torch's CPU int4 kernel dequantizes its weights again for every block of
// 4 rows, so a 5-row call costs two 4-row calls and 16 rows cost ~6x one row. A
// speculative round verifies K+1 rows of one sequence and a mixed tick holds every
// stream's row: here the cost of rows should be the FMAs, not the dequantization.
// Few rows (1-4) dequantize into registers and use each weight at once; more rows
// dequantize a 128-column block of a 16-column tile into L1 once and run all rows over
// it with a 6x16 register tile.
//
// Batch invariance: every output element is computed by the same sequence of operations
// whatever the number of rows M: w = fma(q, scale, minimum) in float32, then
// acc = fma(x[m][k], w, acc) for k = 0, 1, ..., K-1 with one accumulator per (row, column).
// Both paths below (direct for few rows, buffered for many) keep that sequence, so a row's
// result does not depend on how many rows share the call.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define LANES 16   // output columns per packed tile (two 8-float vectors)
#define GROUP 32   // input columns per (scale, minimum) pair
#define KB 128     // input columns per dequantized block in the buffered path (8 KiB)
#define MR 6       // rows per micro-kernel call in the buffered path
#define MCHUNK 64  // rows per accumulator block in the buffered path

// Rows up to which the direct path runs. Measured over the default model's 120 layer
// matmuls (weights streaming from memory): direct 4 rows 17.6 ms vs buffered 22.3 ms;
// direct 5 rows ~ buffered, direct 6 rows slower (its accumulators no longer fit in registers).
#define DIRECT_MAX_ROWS 4
#define UNROLL _Pragma("GCC unroll 16")

// packed: [N/16][K/2][16] bytes, byte j of pair p = q[n0+j][2p] | q[n0+j][2p+1] << 4.
// scale, minimum: [N/16][K/32][16] float16 (GGUF's Q4_1 keeps them in float16, so they
// are the file's values exactly; float32 copies would add a fifth to the bytes a
// one-row step streams from memory).
typedef struct {
    const uint8_t *packed;
    const uint16_t *scale, *minimum;
    int n, k;
} q4_weight;

INLINE __m256 load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

// The two dequantized 8-wide vectors of columns v for input columns 2p (lo) and 2p+1 (hi).
INLINE void dequant_pair(const uint8_t *bytes, __m256 s, __m256 m, __m256 *lo, __m256 *hi) {
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes));
    *lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15))), s, m);
    *hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), s, m);
}

// Few rows: dequantize into registers and use each vector at once, one 16-column tile at
// a time with its group's scales and minimums held in registers (wider tiles spill them,
// measured slower).
INLINE void direct(const int R, const q4_weight *w, const float *x, int tile, uint16_t *y) {
    const int K = w->k, N = w->n;
    __m256 acc[R][2];
    UNROLL for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < K / GROUP; g++) {
        __m256 s[2], m[2];  // the group's scales and minimums, converted once per group
        UNROLL for (int v = 0; v < 2; v++) {
            const size_t at = ((size_t)tile * (K / GROUP) + g) * LANES + 8 * v;
            s[v] = load_f16(w->scale + at);
            m[v] = load_f16(w->minimum + at);
        }
        for (int p = g * GROUP / 2; p < (g + 1) * GROUP / 2; p++) {
            const uint8_t *b = w->packed + ((size_t)tile * (K / 2) + p) * LANES;
            UNROLL for (int v = 0; v < 2; v++) {
                __m256 lo, hi;
                dequant_pair(b + 8 * v, s[v], m[v], &lo, &hi);
                UNROLL for (int r = 0; r < R; r++) {
                    acc[r][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * K + 2 * p), lo, acc[r][v]);
                    acc[r][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * K + 2 * p + 1), hi, acc[r][v]);
                }
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        float out[LANES];
        _mm256_storeu_ps(out, acc[r][0]);
        _mm256_storeu_ps(out + 8, acc[r][1]);
        for (int j = 0; j < LANES; j++) y[(size_t)r * N + tile * LANES + j] = to_bf16(out[j]);
    }
}

static void dequant_block(const q4_weight *w, size_t tile, int k0, int kb, float *block) {
    const int K = w->k;  // k0 and kb are multiples of GROUP
    for (int g = k0 / GROUP; g < (k0 + kb) / GROUP; g++) {
        __m256 s[2], m[2];  // converted once per group
        UNROLL for (int v = 0; v < 2; v++) {
            const size_t at = (tile * (K / GROUP) + g) * LANES + 8 * v;
            s[v] = load_f16(w->scale + at);
            m[v] = load_f16(w->minimum + at);
        }
        for (int k = g * GROUP; k < (g + 1) * GROUP; k += 2) {
            const uint8_t *b = w->packed + (tile * (K / 2) + k / 2) * LANES;
            UNROLL for (int v = 0; v < 2; v++) {
                __m256 lo, hi;
                dequant_pair(b + 8 * v, s[v], m[v], &lo, &hi);
                _mm256_store_ps(block + (k - k0) * LANES + 8 * v, lo);
                _mm256_store_ps(block + (k - k0 + 1) * LANES + 8 * v, hi);
            }
        }
    }
}

// R rows (R <= MR) against one dequantized block: the classic 6x16 register tile.
INLINE void micro(const int R, const float *x, int ldx, const float *block, int kb, float *acc) {
    __m256 a[MR][2];
    UNROLL for (int r = 0; r < R; r++) { a[r][0] = _mm256_loadu_ps(acc + r * LANES); a[r][1] = _mm256_loadu_ps(acc + r * LANES + 8); }
    for (int k = 0; k < kb; k++) {
        __m256 w0 = _mm256_load_ps(block + k * LANES), w1 = _mm256_load_ps(block + k * LANES + 8);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
            a[r][0] = _mm256_fmadd_ps(xv, w0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(xv, w1, a[r][1]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) { _mm256_storeu_ps(acc + r * LANES, a[r][0]); _mm256_storeu_ps(acc + r * LANES + 8, a[r][1]); }
}

static void micro_any(int R, const float *x, int ldx, const float *block, int kb, float *acc) {
    switch (R) {
    case 1: micro(1, x, ldx, block, kb, acc); break;
    case 2: micro(2, x, ldx, block, kb, acc); break;
    case 3: micro(3, x, ldx, block, kb, acc); break;
    case 4: micro(4, x, ldx, block, kb, acc); break;
    case 5: micro(5, x, ldx, block, kb, acc); break;
    default: micro(6, x, ldx, block, kb, acc); break;
    }
}

// Many rows: dequantize a block of one tile once into L1, then run every row over it.
static void buffered_tile(const q4_weight *w, const float *x, int M, int tile, uint16_t *y) {
    const int K = w->k, N = w->n;
    float block[KB * LANES] __attribute__((aligned(32)));
    float acc[MCHUNK * LANES];
    for (int m0 = 0; m0 < M; m0 += MCHUNK) {
        const int rows = M - m0 < MCHUNK ? M - m0 : MCHUNK;
        memset(acc, 0, sizeof(float) * rows * LANES);
        for (int k0 = 0; k0 < K; k0 += KB) {
            const int kb = K - k0 < KB ? K - k0 : KB;
            dequant_block(w, (size_t)tile, k0, kb, block);
            for (int r = 0; r < rows; r += MR)
                micro_any(rows - r < MR ? rows - r : MR, x + (size_t)(m0 + r) * K + k0, K, block, kb, acc + r * LANES);
        }
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < LANES; j++) y[(size_t)(m0 + r) * N + tile * LANES + j] = to_bf16(acc[r * LANES + j]);
    }
}

// y = x @ W^T. x: [M][K] bfloat16, y: [M][N] bfloat16, x32: scratch [M][K] float32.
// The caller checks N % 16 == 0 and K % 32 == 0 and passes contiguous tensors.
void int4_matmul(const uint16_t *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                 uint16_t *y, int M, int N, int K, float *x32) {
    for (long i = 0; i < (long)M * K; i += 8) _mm256_storeu_ps(x32 + i, load_bf16(x + i));
    const q4_weight w = {packed, scale, minimum, N, K};
    const int tiles = N / LANES;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        switch (M <= DIRECT_MAX_ROWS ? M : 0) {
        case 1: direct(1, &w, x32, t, y); break;
        case 2: direct(2, &w, x32, t, y); break;
        case 3: direct(3, &w, x32, t, y); break;
        case 4: direct(4, &w, x32, t, y); break;
        default: buffered_tile(&w, x32, M, t, y); break;
        }
    }
}
