// The tile kernel of the int8-group matmul: int8_x86.c's arithmetic on Intel's AMX tiles
// (Sapphire Rapids and later), for calls of many rows. Loaded by int8_cpu.py beside the
// int8-group matmul, which sends it every call of TILE_MIN_ROWS[bits] rows or more.
//
// Why: with many rows (a prefill chunk) the vector builds are bound by their multiply-adds
// (vpdpwssd: one per pair of inputs, 16 columns and row). One AMX TDPBF16PS multiplies a
// 16-row x G-input tile of bfloat16 inputs by a G x 16 tile of weights: one group's sums
// for 16 rows x 16 columns at once. The weights' int8 values are bfloat16 exactly
// (|q| <= 128 has at most 8 significant bits), widened once per column tile and call for
// every block of 16 rows (a narrow format's values looked up as bfloat16, int8_packed.h).
// What bounds it is that widening and the work around each group's instruction (storing
// its 16 x 16 sums and scaling them into the rows' totals), the same for 1 row as for 16:
// it pays from 6 rows on for 5-bit weights, 12 for 6-bit ones (groups of 16) and 16 for
// the int8 layout (int8_cpu.TILE_MIN_ROWS): a tick of many streams, a verify round, a
// prefill's chunks. (The same kernel on AMX's int8 products, the inputs in steps split into a signed
// high and an unsigned low byte, needs two instructions and two stores a group, and was
// slower at every row count.)
//
// The arithmetic is int8_x86.c's: the inputs on its grid (grid.h, 11 bits), where a
// group's sum of products is exact in any order, so the tile unit's own order of addition
// gives the vector builds' d, and then the same float steps:
//     acc = fma(scale, d, acc);  [acc = fma(minimum, sum_x, acc)]
// (test: every vector build against this one, 32-40 rows). A row's result does not depend on
// M or on its neighbours (the tile unit computes each row of a tile alone, and the threads
// split columns, not rows).
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

// The vector kernel itself (its AVX-512 build here, the same bits as every build): its
// grid, its scratch, and its matmul for a call whose inputs are off the grid.
#include "int8_x86.c"
#include "amx.h"  // amx_init, tile_config

#define ROWS 16   // rows per tile
// The weights stream from memory once per call: prefetched this far ahead, as int4_amx.c does.
#define PREFETCH_AHEAD 2048

// Tiles 0-1: two groups' partial sums (C, 16 x 16 float32); 2-3: their inputs (A, 16 rows
// of G bfloat16); 4-5: their weights (B, G/2 rows of 16 columns x 2 bfloat16). The
// configuration is per thread.
static void configure_tiles(int G) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 6; t++) {
        cfg.colsb[t] = t == 2 || t == 3 ? (uint16_t)(G * 2) : 64;
        cfg.rows[t] = t >= 4 ? (uint8_t)(G / 2) : ROWS;
    }
    _tile_loadconfig(&cfg);
}

// One column tile's weights (at ``tile``, in ``format``: int8_packed.h) for every input pair
// (q[2p][j], q[2p+1][j]) in 32-bit lane j, as bfloat16 (exact): the tile unit's B layout. A
// narrow format looks its values up as bfloat16 directly (pair_words); the int8 layout's
// bytes are widened and converted.
static void widen_column_tile(const uint8_t *tile, int format, int K, __m512i *b) {
    const size_t line = tile_bytes(format, K) / (size_t)(K / 2);  // bytes a pair
    if (FORMAT_BITS(format) != 8) {
        const pair_table table = pair_table_bf16(format);
        // bits a compile-time constant in each loop: pair_words's plane loop unrolled
        if (FORMAT_BITS(format) == 5)
            for (int p = 0; p < K / 2; p++) {
                if ((p & 3) == 0) _mm_prefetch((const char *)tile + (size_t)p * line + PREFETCH_AHEAD, _MM_HINT_T0);
                _mm512_store_si512(b + p, pair_words(tile, 5, 2 * p, &table));
            }
        else
            for (int p = 0; p < K / 2; p++) {
                if ((p & 3) == 0) _mm_prefetch((const char *)tile + (size_t)p * line + PREFETCH_AHEAD, _MM_HINT_T0);
                _mm512_store_si512(b + p, pair_words(tile, 6, 2 * p, &table));
            }
        return;
    }
    const __m512i order = _mm512_load_si512(PAIR_ORDER);
    for (int p = 0; p < K / 2; p++) {
        _mm_prefetch((const char *)tile + (size_t)p * line + PREFETCH_AHEAD, _MM_HINT_T0);
        const __m256i two = pair_values(tile, format, 2 * p);
        const __m512 first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(two)));
        const __m512 second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(two, 1)));
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(second, first);  // [first 0..15 | second 0..15]
        _mm512_store_si512(b + p, _mm512_permutexvar_epi16(order, both));
    }
}

typedef struct {
    const void *scale, *minimum;  // this column tile's [groups][16], float16 where half
    int half, K, G;
} tile_params;

// 16 rows (one row block of the padded input) x one column tile, over every group.
static void row_block(const uint16_t *x, const float *sums, const __m512i *b, const tile_params *w, int rows, __m512 *acc) {
    const int G = w->G, groups = w->K / G, stride = w->K * 2, pairs = G / 2;
    float d[2][ROWS * LANES] __attribute__((aligned(64)));
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g += 2) {  // two groups in flight: their tiles are independent
        const int pair = g + 1 < groups;
        _tile_zero(0);
        _tile_loadd(2, x + g * G, stride);
        _tile_loadd(4, b + g * pairs, 64);
        _tile_dpbf16ps(0, 2, 4);
        if (pair) {
            _tile_zero(1);
            _tile_loadd(3, x + (g + 1) * G, stride);
            _tile_loadd(5, b + (g + 1) * pairs, 64);
            _tile_dpbf16ps(1, 3, 5);
        }
        for (int h = 0; h <= pair; h++) {
            if (h == 0) _tile_stored(0, d[0], 64);
            else _tile_stored(1, d[1], 64);
            const size_t at = (size_t)(g + h) * LANES;
            const __m512 scale = v_param(w->scale, at, w->half);
            const __m512 minimum = w->minimum ? v_param(w->minimum, at, w->half) : _mm512_setzero_ps();
            for (int r = 0; r < rows; r++) {
                acc[r] = _mm512_fmadd_ps(scale, _mm512_load_ps(d[h] + r * LANES), acc[r]);
                if (w->minimum) acc[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(sums[(size_t)r * groups + g + h]), acc[r]);
            }
        }
    }
}

// y = x @ W^T, with int8_x86.c's arguments and weight layout (half: float16 scales and
// minimums). The caller has had amx_init() succeed and checks N % 16 == 0, K % 32 == 0.
static void matmul_tiles(int half, const uint16_t *x, const int8_t *q, const void *scale, const void *minimum,
                         uint16_t *y, int M, int N, int K, int G, int format) {
    const int groups = K / G, blocks = (M + ROWS - 1) / ROWS, padded = blocks * ROWS;
    // The inputs on the grid, padded to whole row blocks (a tile always loads 16 rows), then
    // each row's group sums. Padding rows are zeros and never stored.
    const size_t x_floats = ((size_t)padded * K + 1) / 2;
    float *scratch = input_buffer_for(x_floats + (size_t)padded * groups + 16);
    uint16_t *xp = (uint16_t *)scratch;
    float *sums = scratch + (x_floats + 15) / 16 * 16;
    prepare_inputs(x, xp, NULL, M, K, GRID_BITS);
    if (!inputs_on_grid(xp, (size_t)M * K, GRID_BITS)) {  // the vector kernel's float path, as for fewer rows
        matmul(half, x, q, scale, minimum, y, M, N, K, G, format);
        return;
    }
    memset(xp + (size_t)M * K, 0, (size_t)(padded - M) * K * sizeof(uint16_t));
    if (minimum) minimum_sums(xp, sums, M, K, G);
    const int tiles = N / LANES;
    const size_t param_size = half ? 2 : 4;
    #pragma omp parallel
    {
        configure_tiles(G);
        __m512i *b = aligned_alloc(64, (size_t)(K / 2) * sizeof(__m512i));
        if (!b) abort();
        // schedule(dynamic): as the vector kernel, a thread slowed by another process takes fewer tiles.
        #pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tiles; t++) {
            widen_column_tile((const uint8_t *)q + (size_t)t * tile_bytes(format, K), format, K, b);
            const size_t at = (size_t)t * groups * LANES * param_size;
            const tile_params w = {(const char *)scale + at, minimum ? (const char *)minimum + at : NULL, half, K, G};
            for (int blk = 0; blk < blocks; blk++) {
                __m512 acc[ROWS];
                const int rows = M - blk * ROWS < ROWS ? M - blk * ROWS : ROWS;
                row_block(xp + (size_t)blk * ROWS * K, sums + (size_t)blk * ROWS * groups, b, &w, rows, acc);
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

void int8_matmul_amx(const uint16_t *x, const int8_t *q, const float *scale, const float *minimum, uint16_t *y,
                     int M, int N, int K, int G, int format) {
    matmul_tiles(0, x, q, scale, minimum, y, M, N, K, G, format);
}

void int8_matmul_h_amx(const uint16_t *x, const int8_t *q, const uint16_t *scale, const uint16_t *minimum, uint16_t *y,
                       int M, int N, int K, int G, int format) {
    matmul_tiles(1, x, q, scale, minimum, y, M, N, K, G, format);
}

// The two with op.h's arguments: x, q, scale, minimum, y, M, N, K, G, format.
void int8_matmul_amx_op(const int64_t *a) {
    int8_matmul_amx(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), (int)a[5], (int)a[6], (int)a[7],
                    (int)a[8], (int)a[9]);
}
void int8_matmul_h_amx_op(const int64_t *a) {
    int8_matmul_h_amx(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), (int)a[5], (int)a[6],
                      (int)a[7], (int)a[8], (int)a[9]);
}
