// The tile kernel: the int4 matmul of int4_x86.c on Intel's AMX tiles (Sapphire Rapids
// and later), for calls of many rows. Loaded by int4_cpu.py beside the int4 matmul, which
// sends it every call of TILE_MIN_ROWS rows or more.
//
// Why a second kernel: with many rows (a 96-token prefill chunk is 96) the int4 matmul is
// bound by its multiply-adds (32 a cycle per core on AVX-512 FMAs). One AMX TDPBF16PS
// multiplies a 16-row x 32-input tile of bfloat16 inputs by a 32 x 16 tile of weights:
// 8,192 multiply-adds, one group of the arithmetic below for 16 rows x 16 columns at once.
//
// The arithmetic is int4_x86.c's: per group of 32 inputs, rounded to their group's grid
// (grid.h, round_group),
//     d = sum(x[k] q[k]);  acc = fma(scale, d, acc);  acc = fma(minimum, sum_x, acc)
// with exact products. The tile unit adds a group's 32 products in an order of its own
// (not documented; measured on this project's Xeon, none of sequential pairs either way,
// one rounding in double or a pairwise tree) — and on the grid every such sum is exact in
// float32, so d and every output are the int4 matmul's bits (test: every build against
// this one, 1-140 rows). A row's result does not depend on M or on its neighbours (the
// tile unit computes each row of a tile alone, and the threads split columns, not rows).
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "q4.h"
#include "op.h"
#include "amx.h"  // amx_init, tile_config

#define LANES 16  // output columns per packed tile (a tile's 16 float32 columns)
#define GROUP Q4_GROUP  // input columns per (scale, minimum) pair: one TDPBF16PS's depth
#define PAIRS (GROUP / 2)
#define ROWS 16   // rows per tile

// Tiles 0-1: two groups' partial sums (C); 2-3: their inputs (A); 4-5: their weights (B).
// Every tile is 16 rows of 64 bytes. The configuration is per thread.
static void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 6; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = ROWS;
    }
    _tile_loadconfig(&cfg);
}

// One column tile's weights for every group, in the tile unit's B layout: group g is 16
// rows (its pairs p) of 16 columns x (q[2p], q[2p+1]) as bfloat16 — which is exactly what
// unpack_pair_bf16 makes of a pair's 16 packed bytes.
// The weights stream from memory once per call: a software prefetch this many bytes ahead
// (as int4_x86.c's direct path) made the default model's 120 layer matmuls 0.68x the time
// at 1 row and 0.81x at 5-8 rows, which moved the tile kernel's break-even with the plain
// AVX-512 build from 8-9 rows to 3-4 (Intel Xeon with AMX; 4096 bytes no better).
#define PREFETCH_AHEAD 2048

static void unpack_column_tile(const uint8_t *packed, int K, size_t tile, __m512i *b) {
    const uint8_t *bytes = packed + tile * (size_t)(K / 2) * LANES;
    for (int p = 0; p < K / 2; p++) {
        if ((p & 3) == 0) _mm_prefetch((const char *)(bytes + (size_t)p * LANES) + PREFETCH_AHEAD, _MM_HINT_T0);  // once per line
        _mm512_store_si512(b + p, unpack_pair_bf16(bytes + (size_t)p * LANES));
    }
}

// acc[r] = fma(minimum, sum_x[r], fma(scale, d[r], acc[r])) for the block's rows of one group
// (only its real ones: padding rows are never stored).
INLINE void take_group(__m512 *acc, const float *d, __m512 scale, __m512 minimum, const float *sums, int groups, int g,
                       int rows) {
    for (int r = 0; r < rows; r++)
        acc[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(sums[(size_t)r * groups + g]),
                                 _mm512_fmadd_ps(scale, _mm512_load_ps(d + r * LANES), acc[r]));
}

// 16 rows (one row block of the padded input) x one column tile, over every group; b: the
// tile's weights, unpacked once for all its row blocks (unpacking each group just before
// its use was slower even for one row block: the tile load waits for the stores).
static void row_block(const uint16_t *x, const float *sums, const __m512i *b, const uint16_t *scale,
                      const uint16_t *minimum, int K, int rows, __m512 *acc) {
    const int groups = K / GROUP, stride = K * 2;
    float d[2][ROWS * LANES] __attribute__((aligned(64)));
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g += 2) {  // two groups in flight: their tiles are independent
        const int pair = g + 1 < groups;
        _tile_zero(0);
        _tile_loadd(2, x + g * GROUP, stride);
        _tile_loadd(4, b + g * PAIRS, 64);
        _tile_dpbf16ps(0, 2, 4);
        if (pair) {
            _tile_zero(1);
            _tile_loadd(3, x + (g + 1) * GROUP, stride);
            _tile_loadd(5, b + (g + 1) * PAIRS, 64);
            _tile_dpbf16ps(1, 3, 5);
        }
        _tile_stored(0, d[0], 64);
        take_group(acc, d[0], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scale + g * LANES))),
                   _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(minimum + g * LANES))), sums, groups, g, rows);
        if (pair) {
            _tile_stored(1, d[1], 64);
            take_group(acc, d[1], _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scale + (g + 1) * LANES))),
                       _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(minimum + (g + 1) * LANES))), sums, groups,
                       g + 1, rows);
        }
    }
}

// y = x @ W^T, with int4_x86.c's arguments and weight layout.
// The caller has had amx_init() succeed and checks N % 16 == 0 and K % 32 == 0.
void int4_matmul_amx(const uint16_t *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                     uint16_t *y, int M, int N, int K) {
    const int groups = K / GROUP, blocks = (M + ROWS - 1) / ROWS, padded = blocks * ROWS;
    // The inputs padded to whole row blocks (a tile always loads 16 rows), then each row's
    // group sums. Padding rows are zeros and never stored.
    const size_t x_floats = ((size_t)padded * K + 1) / 2;
    float *scratch = input_buffer_for(x_floats + (size_t)padded * groups + 16);
    uint16_t *xp = (uint16_t *)scratch;
    float *sums = scratch + (x_floats + 15) / 16 * 16;
    prepare_inputs(x, xp, sums, M, K, GRID_BITS);  // as int4_x86.c reads them (grid.h)
    memset(xp + (size_t)M * K, 0, (size_t)(padded - M) * K * sizeof(uint16_t));
    const int tiles = N / LANES;
    #pragma omp parallel
    {
        configure_tiles();
        __m512i *b = aligned_alloc(64, (size_t)(K / 2) * sizeof(__m512i));
        if (!b) abort();
        #pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            unpack_column_tile(packed, K, (size_t)t, b);
            const size_t at = (size_t)t * groups * LANES;
            for (int blk = 0; blk < blocks; blk++) {
                __m512 acc[ROWS];
                const int rows = M - blk * ROWS < ROWS ? M - blk * ROWS : ROWS;
                row_block(xp + (size_t)blk * ROWS * K, sums + (size_t)blk * ROWS * groups, b, scale + at, minimum + at,
                          K, rows, acc);
                for (int r = 0; r < rows; r++) {
                    uint16_t *out = y + (size_t)(blk * ROWS + r) * N + (size_t)t * LANES;
                    _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(to_bf16_16(acc[r])));
                }
            }
        }
        free(b);
        _tile_release();
    }
}

// int4_matmul_amx with op.h's arguments: x, packed, scale, minimum, y, M, N, K.
void int4_matmul_amx_op(const int64_t *a) {
    int4_matmul_amx(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), (int)a[5], (int)a[6], (int)a[7]);
}
