// The tile kernel of the int8-group matmul: int8_x86.c's arithmetic on Intel's AMX tiles
// (Sapphire Rapids and later), for calls of many rows. Loaded by int8_cpu.py beside the
// int8-group matmul, which sends it every call of TILE_MIN_ROWS rows or more.
//
// Why: with many rows (a tick of many streams, a verify round, a prefill chunk) the vector
// builds are bound by their multiply-adds (vpdpwssd: one per pair of inputs, 16 columns
// and row), where one AMX instruction computes one group's sums for 16 rows x 16 columns.
// Two ways, by the weights' format (int8_packed.h):
// - 5 or 6 bits (Q5_0, Q5_1, Q5_K, Q6_K): TDPBF16PS on the bfloat16 inputs and the
//   weights' values looked up as bfloat16 (exact: |q| <= 32), once per column tile and
//   call for every block of 16 rows;
// - the int8 layout (Q8_0's bytes), one block of at most 16 rows: TDPBSSD / TDPBUSD on the
//   inputs in steps split into a signed high and an unsigned low byte, the weights' bytes
//   as they are (a vpermb rearranges four inputs' 16 columns into the tile unit's layout):
//   converting bytes to bfloat16 costs six instructions a pair and made bfloat16 tiles
//   slower than the vector kernel below 16 rows. More rows take the bfloat16 tiles, the
//   bytes converted once per column tile for every row block (two int8 products and two
//   stores a group and block cost more there: 96 rows 1.2-1.4x the time).
// What bounds both is that preparation and the work around each group's instructions
// (storing its 16 x 16 sums and scaling them into the rows' totals), the same for 1 row
// as for 16. For a call of one row block each thread takes a contiguous run of column
// tiles and prepares the next tile's weights while this one's groups run, so that their
// loads from memory overlap the tile work: every format pays from 8 rows
// (int8_cpu.TILE_MIN_ROWS).
//
// The arithmetic is int8_x86.c's: the inputs on its grid (grid.h, 11 bits), where a
// group's sum of products is exact in any order (and in int32), so the tile unit's own
// order of addition gives the vector builds' d, and then the same float steps:
//     acc = fma(scale, d, acc);  [acc = fma(minimum, sum_x, acc)]
// (test: every vector build against this one, TILE_MIN_ROWS-40 rows). A row's result does
// not depend on M or on its neighbours (the tile unit computes each row of a tile alone,
// and the threads split columns, not rows).
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

// The vector kernel itself (its AVX-512 build here, the same bits as every build): its
// grid, its scratch, and its matmul for a call whose inputs are off the grid.
#include "int8_x86.c"
#include "amx.h"  // amx_init, tile_config

#define ROWS 16   // rows per tile
// The int8 layout's calls of at most this many rows (one row block) run on int8 tiles, more
// on bfloat16 ones (the file's header; a 17-row call on either costs about a 32-row one).
#define INT8_TILES_MAX_ROWS 16
// The weights stream from memory once per call: prefetched this far ahead, as int4_amx.c does.
#define PREFETCH_AHEAD 2048

// Tiles 0-1 and 6-7: two groups' partial sums (C, 16 x 16 float32), by turns; 2-3: their
// inputs (A, 16 rows of G bfloat16); 4-5: their weights (B, G/2 rows of 16 columns x 2
// bfloat16). The configuration is per thread.
static void configure_tiles(int G) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = t == 2 || t == 3 ? (uint16_t)(G * 2) : 64;
        cfg.rows[t] = t == 4 || t == 5 ? (uint8_t)(G / 2) : ROWS;
    }
    _tile_loadconfig(&cfg);
}

// Pairs [p0, p1) of a column tile in a narrow ``format`` (int8_packed.h) into b[p0 .. p1), as
// bfloat16 looked up in ``table`` (pair_table_bf16).
static inline void widen_pairs(const uint8_t *tile, int format, int p0, int p1, const pair_table *table, __m512i *b) {
    const size_t line = PAIR_BYTES(FORMAT_BITS(format));
    // bits a compile-time constant in each loop: pair_words's plane loop unrolled
    if (FORMAT_BITS(format) == 5)
        for (int p = p0; p < p1; p++) {
            if ((p & 3) == 0) _mm_prefetch((const char *)tile + (size_t)p * line + PREFETCH_AHEAD, _MM_HINT_T0);
            _mm512_store_si512(b + p, pair_words(tile, 5, 2 * p, table));
        }
    else
        for (int p = p0; p < p1; p++) {
            if ((p & 3) == 0) _mm_prefetch((const char *)tile + (size_t)p * line + PREFETCH_AHEAD, _MM_HINT_T0);
            _mm512_store_si512(b + p, pair_words(tile, 6, 2 * p, table));
        }
}

// One column tile's weights (at ``tile``, in ``format``: int8_packed.h) for every
// input pair (q[2p][j], q[2p+1][j]) in 32-bit lane j, as bfloat16 (exact): the tile unit's
// B layout, a narrow format's values looked up as bfloat16 directly (pair_words).
static void widen_column_tile(const uint8_t *tile, int format, int K, __m512i *b) {
    if (FORMAT_BITS(format) == 8) {  // the int8 layout's bytes: their int16 pairs converted
        for (int p = 0; p < K / 2; p++) {
            _mm_prefetch((const char *)tile + (size_t)p * 32 + PREFETCH_AHEAD, _MM_HINT_T0);
            _mm512_store_si512(b + p, words_to_bf16(pair_words(tile, format, 2 * p, NULL)));
        }
        return;
    }
    const pair_table table = pair_table_bf16(format);
    widen_pairs(tile, format, 0, K / 2, &table, b);
}

typedef struct {
    const void *scale, *minimum;  // this column tile's [groups][16], float16 where half
    int half, K, G;
} tile_params;

// Column tile t's scales and minimums (each [groups][16], ``half``: float16) of a call's.
static inline tile_params params_of(int t, const void *scale, const void *minimum, int half, int K, int G) {
    const size_t at = (size_t)t * (K / G) * LANES * (half ? 2 : 4);
    const tile_params w = {(const char *)scale + at, minimum ? (const char *)minimum + at : NULL, half, K, G};
    return w;
}

// The column tiles [*first, *end) of this thread of the parallel region: a contiguous run,
// so that it knows the tile after each (the one-row-block loops prepare it meanwhile).
static inline void thread_tiles(int tiles, int *first, int *end) {
    const int threads = omp_get_num_threads(), me = omp_get_thread_num();
    *first = (int)((long)tiles * me / threads);
    *end = (int)((long)tiles * (me + 1) / threads);
}

// Rows 0 .. rows - 1 of column tile t's totals into y [rows][N] as bfloat16.
static inline void store_tile(const __m512 *acc, int rows, uint16_t *y, int N, int t) {
    for (int r = 0; r < rows; r++)
        _mm256_storeu_si256((__m256i *)(y + (size_t)r * N + (size_t)t * LANES), _mm512_cvtepi32_epi16(to_bf16_16(acc[r])));
}

// acc[r] for the block's rows of group g, from its sums at d (the rows' group sums of inputs
// ``sums``, for the minimum term).
static inline void take_group(const float *d, const tile_params *w, const float *sums, int g, int rows, __m512 *acc) {
    const int groups = w->K / w->G;
    const size_t at = (size_t)g * LANES;
    const __m512 scale = v_param(w->scale, at, w->half);
    const __m512 minimum = w->minimum ? v_param(w->minimum, at, w->half) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        acc[r] = _mm512_fmadd_ps(scale, _mm512_load_ps(d + r * LANES), acc[r]);
        if (w->minimum) acc[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(sums[(size_t)r * groups + g]), acc[r]);
    }
}

// 16 rows (one row block of the padded input) x one column tile, over every group. Where
// ``next`` is not NULL (a narrow format's next column tile, for a call of one row block), its
// weights are widened into ``next_b`` two groups at a time while this tile's run, so that
// their loads from memory overlap this tile's work (as int8_row_block).
static void row_block(const uint16_t *x, const float *sums, const __m512i *b, const tile_params *w, int rows, __m512 *acc,
                      const uint8_t *next, int format, const pair_table *table, __m512i *next_b) {
    const int G = w->G, groups = w->K / G, stride = w->K * 2, pairs = G / 2;
    float d[2][ROWS * LANES] __attribute__((aligned(64)));
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    // Two groups at a time (their tiles are independent), into sum tiles 0-1 and 6-7 by
    // turns: a pair's products run while the pair before is stored and scaled.
    for (int g = 0; g < groups + 2; g += 2) {
        if (g < groups) {
            const int two = g + 1 < groups;
            _tile_loadd(2, x + g * G, stride);
            _tile_loadd(4, b + g * pairs, 64);
            if (two) {
                _tile_loadd(3, x + (g + 1) * G, stride);
                _tile_loadd(5, b + (g + 1) * pairs, 64);
            }
            if ((g / 2) & 1) {
                _tile_zero(6);
                _tile_dpbf16ps(6, 2, 4);
                if (two) {
                    _tile_zero(7);
                    _tile_dpbf16ps(7, 3, 5);
                }
            } else {
                _tile_zero(0);
                _tile_dpbf16ps(0, 2, 4);
                if (two) {
                    _tile_zero(1);
                    _tile_dpbf16ps(1, 3, 5);
                }
            }
            if (next) widen_pairs(next, format, g * pairs, (g + 1 + two) * pairs, table, next_b);
        }
        if (g == 0) continue;
        const int p = g - 2, two = p + 1 < groups;  // the pair before
        if ((p / 2) & 1) {
            _tile_stored(6, d[0], 64);
            if (two) _tile_stored(7, d[1], 64);
        } else {
            _tile_stored(0, d[0], 64);
            if (two) _tile_stored(1, d[1], 64);
        }
        take_group(d[0], w, sums, p, rows, acc);
        if (two) take_group(d[1], w, sums, p + 1, rows, acc);
    }
}

// The int8 layout's weights (format 8: Q8_0's bytes) on the tile unit's int8 products: the
// bytes as they are, four inputs of 16 columns (64 bytes of the layout) rearranged by one
// vpermb. The inputs in steps (int16, |x| < 2^12, grid.h) split into a signed high and
// an unsigned low byte, x = 256 xh + xl: a group's d = 256 sum(xh q) + sum(xl q) (TDPBSSD,
// TDPBUSD), exact in int32, then the vector integer path's float steps:
//     acc = fma(scale, float(d) * step, acc);  [acc = fma(minimum, sum_x, acc)]
// Tiles 0-1 and 5-6: a group's two sums (C, 16 x 16 int32); 2-3: the rows' high and low bytes
// (A, 16 rows of G bytes); 4: the weights (B, G/4 rows of 16 columns x 4 bytes).
static void configure_int8_tiles(int G) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 7; t++) {
        cfg.colsb[t] = t == 2 || t == 3 ? (uint16_t)G : 64;
        cfg.rows[t] = t == 4 ? (uint8_t)(G / 4) : ROWS;
    }
    _tile_loadconfig(&cfg);
}

// Byte 4c + i of a quad from byte 16i + c of four inputs' 16 columns (the int8 layout).
static const uint8_t QUAD_ORDER[64] __attribute__((aligned(64))) = {
    0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54,
    7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61,
    14, 30, 46, 62, 15, 31, 47, 63};

typedef struct {
    const int8_t *high;   // [16][K] each row's inputs in steps, high bytes (signed)
    const uint8_t *low;   // [16][K] ... low bytes
    const float *step;    // [rows][K / 32]
    const float *sums;    // [rows][K / G]
} int8_tile_input;

// acc[r] for the block's rows of group g, from its two sums at d[0] (high bytes) and d[1] (low).
static inline void take_int8_group(const int8_tile_input *in, const tile_params *w, int g, int rows,
                                   int32_t d[2][ROWS * LANES], __m512 *acc) {
    const int G = w->G, groups = w->K / G, steps = w->K / GRID_GROUP;
    const size_t at = (size_t)g * LANES;
    const __m512 scale = v_param(w->scale, at, w->half);
    const __m512 minimum = w->minimum ? v_param(w->minimum, at, w->half) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        const __m512i whole = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(d[0] + r * LANES), 8),
                                               _mm512_load_si512(d[1] + r * LANES));
        const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(whole), _mm512_set1_ps(in->step[(size_t)r * steps + g * G / GRID_GROUP]));
        acc[r] = _mm512_fmadd_ps(scale, dot, acc[r]);
        if (w->minimum) acc[r] = _mm512_fmadd_ps(minimum, _mm512_set1_ps(in->sums[(size_t)r * groups + g]), acc[r]);
    }
}

// Lines [k0, k1) of a column tile's int8 layout (64 bytes: four inputs' 16 columns) in the
// tile unit's B layout (byte 4c + i: column c at input 4k + i).
static inline void rearrange_lines(const uint8_t *tile, int k0, int k1, __m512i *b) {
    const __m512i order = _mm512_load_si512(QUAD_ORDER);
    for (int k = k0; k < k1; k++) {
        _mm_prefetch((const char *)tile + (size_t)k * 64 + PREFETCH_AHEAD, _MM_HINT_T0);
        _mm512_store_si512(b + k, _mm512_permutexvar_epi8(order, _mm512_loadu_si512(tile + (size_t)k * 64)));
    }
}

// 16 rows x one column tile (its weights rearranged at b) over every group. The groups
// alternate between two pairs of sum tiles (0-1, 5-6), so that group g's products run while
// group g - 1's sums are stored and scaled into the rows' totals, and meanwhile the next
// tile's weights (``next``, NULL: none) are rearranged into ``next_b``, a group's lines at a
// time: their loads from memory overlap this tile's work instead of preceding the next's.
static void int8_row_block(const int8_tile_input *in, const __m512i *b, const tile_params *w, int rows, __m512 *acc,
                           const uint8_t *next, __m512i *next_b) {
    const int G = w->G, K = w->K, groups = K / G;
    int32_t d[2][ROWS * LANES] __attribute__((aligned(64)));
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g <= groups; g++) {
        if (g < groups) {
            _tile_loadd(2, in->high + g * G, K);
            _tile_loadd(3, in->low + g * G, K);
            _tile_loadd(4, b + g * (G / 4), 64);
            if (g & 1) {
                _tile_zero(5);
                _tile_zero(6);
                _tile_dpbssd(5, 2, 4);
                _tile_dpbusd(6, 3, 4);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_dpbssd(0, 2, 4);
                _tile_dpbusd(1, 3, 4);
            }
            if (next) rearrange_lines(next, g * (G / 4), (g + 1) * (G / 4), next_b);
        }
        if (g == 0) continue;
        if ((g - 1) & 1) {
            _tile_stored(5, d[0], 64);
            _tile_stored(6, d[1], 64);
        } else {
            _tile_stored(0, d[0], 64);
            _tile_stored(1, d[1], 64);
        }
        take_int8_group(in, w, g - 1, rows, d, acc);
    }
}

// y = x @ W^T for the int8 layout (format 8) on int8 tiles; the arguments as matmul_tiles'.
static void matmul_int8_tiles(int half, const uint16_t *x, const int8_t *q, const void *scale, const void *minimum,
                              uint16_t *y, int M, int N, int K, int G) {
    const int groups = K / G, padded = ROWS, steps = K / GRID_GROUP;  // one row block (M <= INT8_TILES_MAX_ROWS)
    // Scratch: the rounded inputs (bfloat16), the inputs in steps (int16), their steps, the
    // group sums, and the high and low bytes of every padded row.
    const size_t n = (size_t)M * K, rounded_floats = (n / 2 + 15) / 16 * 16, steps_floats = (n / 2 + 15) / 16 * 16;
    const size_t step_floats = ((size_t)M * steps + 15) / 16 * 16, sum_floats = ((size_t)M * groups + 15) / 16 * 16;
    const size_t byte_floats = ((size_t)padded * K / 4 + 15) / 16 * 16;
    float *scratch = input_buffer_for(rounded_floats + steps_floats + step_floats + sum_floats + 2 * byte_floats + 16);
    uint16_t *rounded = (uint16_t *)scratch;
    int16_t *xi = (int16_t *)(scratch + rounded_floats);
    float *step = scratch + rounded_floats + steps_floats, *sums = step + step_floats;
    int8_t *high = (int8_t *)(sums + sum_floats);
    uint8_t *low = (uint8_t *)(sums + sum_floats + byte_floats);
    prepare_inputs(x, rounded, NULL, M, K, GRID_BITS);
    if (!inputs_in_steps(rounded, xi, step, M, K, GRID_BITS)) {  // the vector kernel's float path
        matmul(half, x, q, scale, minimum, y, M, N, K, G, 8);
        return;
    }
    if (minimum) minimum_sums(rounded, sums, M, K, G);
    for (size_t i = 0; i < n; i++) {
        high[i] = (int8_t)(xi[i] >> 8);  // arithmetic: xi = 256 high + low, low in 0..255
        low[i] = (uint8_t)(xi[i] & 255);
    }
    memset(high + n, 0, (size_t)padded * K - n);
    memset(low + n, 0, (size_t)padded * K - n);
    const size_t tile_size = (size_t)K * LANES;
    #pragma omp parallel
    {
        configure_int8_tiles(G);
        __m512i *buffers = aligned_alloc(64, 2 * (size_t)(K / 4) * sizeof(__m512i));
        if (!buffers) abort();
        int first, end;
        thread_tiles(N / LANES, &first, &end);
        if (first < end) rearrange_lines((const uint8_t *)q + (size_t)first * tile_size, 0, K / 4, buffers);
        const int8_tile_input in = {high, low, step, sums};
        for (int t = first; t < end; t++) {
            __m512i *b = buffers + (size_t)((t - first) & 1) * (K / 4), *next_b = buffers + (size_t)((t - first + 1) & 1) * (K / 4);
            const uint8_t *next = t + 1 < end ? (const uint8_t *)q + (size_t)(t + 1) * tile_size : NULL;
            const tile_params w = params_of(t, scale, minimum, half, K, G);
            __m512 acc[ROWS];
            int8_row_block(&in, b, &w, M, acc, next, next_b);
            store_tile(acc, M, y, N, t);
        }
        free(buffers);
        _tile_release();
    }
}

// y = x @ W^T, with int8_x86.c's arguments and weight layout (half: float16 scales and
// minimums). The caller has had amx_init() succeed and checks N % 16 == 0, K % 32 == 0.
static void matmul_tiles(int half, const uint16_t *x, const int8_t *q, const void *scale, const void *minimum,
                         uint16_t *y, int M, int N, int K, int G, int format) {
    if (FORMAT_BITS(format) == 8 && M <= INT8_TILES_MAX_ROWS) {
        matmul_int8_tiles(half, x, q, scale, minimum, y, M, N, K, G);
        return;
    }
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
    const size_t tile_size = tile_bytes(format, K);
    #pragma omp parallel
    {
        configure_tiles(G);
        __m512i *b = aligned_alloc(64, 2 * (size_t)(K / 2) * sizeof(__m512i));
        if (!b) abort();
        if (blocks == 1 && FORMAT_BITS(format) != 8) {
            // One row block of a narrow format: each thread a contiguous run of column tiles,
            // the next one's weights widened while this one's groups run (row_block).
            const pair_table table = pair_table_bf16(format);
            int first, end;
            thread_tiles(tiles, &first, &end);
            if (first < end) widen_pairs((const uint8_t *)q + (size_t)first * tile_size, format, 0, K / 2, &table, b);
            for (int t = first; t < end; t++) {
                __m512i *own = b + (size_t)((t - first) & 1) * (K / 2), *next_b = b + (size_t)((t - first + 1) & 1) * (K / 2);
                const uint8_t *next = t + 1 < end ? (const uint8_t *)q + (size_t)(t + 1) * tile_size : NULL;
                const tile_params w = params_of(t, scale, minimum, half, K, G);
                __m512 acc[ROWS];
                row_block(xp, sums, own, &w, M, acc, next, format, &table, next_b);
                store_tile(acc, M, y, N, t);
            }
        } else {
            // schedule(dynamic): as the vector kernel, a thread slowed by another process takes fewer tiles.
            #pragma omp for schedule(dynamic, 1)
            for (int t = 0; t < tiles; t++) {
                widen_column_tile((const uint8_t *)q + (size_t)t * tile_size, format, K, b);
                const tile_params w = params_of(t, scale, minimum, half, K, G);
                for (int blk = 0; blk < blocks; blk++) {
                    __m512 acc[ROWS];
                    const int rows = M - blk * ROWS < ROWS ? M - blk * ROWS : ROWS;
                    row_block(xp + (size_t)blk * ROWS * K, sums + (size_t)blk * ROWS * groups, b, &w, rows, acc, NULL, format,
                              NULL, NULL);
                    store_tile(acc, rows, y + (size_t)blk * ROWS * N, N, t);
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
