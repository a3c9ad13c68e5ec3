// Float-weight matmul for x86-64: bfloat16 activations, float32 accumulation, bfloat16
// output. Built twice by build.py and loaded by float_cpu.py: for AVX-512 and for AVX2 +
// FMA + F16C. It runs matmul weights kept in their source's own float type (a GGUF's F32,
// F16 and BF16 tensors, a Hugging Face folder's safetensors): float32, float16 or
// bfloat16, read as they are, with no float32 copy of a 16-bit weight.
//
// One entry point, float_matmul, whose last argument is the weight's element type
// (FLOAT32, FLOAT16, BFLOAT16 below; float_cpu.ELEMENT_TYPES maps torch's dtypes to them).
//
// The arithmetic: a weight is read as its exact float32 value (float16 through F16C's
// conversion, bfloat16 by a 16-bit shift, float32 as it is), and every output element is
// one fixed sequence of operations, whatever the number of rows M, the thread split and
// the build:
//     acc = 0;  for k = 0 .. K-1, in order:  acc = fma(x[k], w[k], acc);  y = bfloat16(acc)
// (the output rounded to nearest even, as torch rounds). For float16 and bfloat16 weights
// a product with a bfloat16 input (8 + 11 significant bits at most) is exact in float32, so
// acc is the float32 sum of the exact products added left to right. Each output column is
// one vector lane, so a row's result does not depend on the other rows of its call (batch
// invariance) nor on the build (AVX-512 and AVX2 do the same lane operations); how many
// rows and tiles a block holds changes only which chains run side by side.
//
// Layout (float_cpu.pack): w [N/16][K][16] of the element type (lane j of input column k:
// output column n0 + j).
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "op.h"
#include "vec.h"  // vec, VW, v_zero / v_bcast / v_fma / v_load / v_store
#include "grid.h"  // input_buffer_for: the calling thread's scratch

#define LANES 16  // output columns per packed tile
#define UNROLL _Pragma("GCC unroll 16")

enum { FLOAT32 = 0, FLOAT16 = 1, BFLOAT16 = 2 };  // the element types (float_cpu.ELEMENT_TYPES)

#ifdef __AVX512F__
// 8 rows x 2 tiles: 16 running sums + 2 weights + a broadcast of 32 registers, and 10
// loads per 16 FMAs (8 rows x 1 tile: 9 per 8, and the loads, not the FMAs, set the pace)
#define ROW_BLOCK 8  // rows sharing a tile's weights
#define SUMS 16  // running sums a block keeps in registers (rows x tiles x vectors per tile)
INLINE vec v_half(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
INLINE vec v_bfloat(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#else
#define ROW_BLOCK 6  // a tile is two vectors: 12 running sums + 2 weights + a broadcast
#define SUMS 12
INLINE vec v_half(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INLINE vec v_bfloat(const uint16_t *p) { return load_bf16(p); }
#endif
#define NV (LANES / VW)
#define MAX_TILES 4  // tiles a block of few rows runs side by side (more independent FMA chains)

// The weight's lanes at element ``at`` as float32 (exact); ``type`` a compile-time constant once inlined.
INLINE vec v_weight(const int type, const void *w, size_t at) {
    if (type == FLOAT32) return v_load((const float *)w + at);
    if (type == FLOAT16) return v_half((const uint16_t *)w + at);
    return v_bfloat((const uint16_t *)w + at);
}

// How many tiles a block of R rows runs side by side: the most of 4, 2, 1 whose running
// sums fit SUMS (a constant expression: each block below is compiled for its own).
#define TILES_FOR(R) ((R) * 4 * NV <= SUMS ? 4 : (R) * 2 * NV <= SUMS ? 2 : 1)

// R rows of T consecutive tiles from ``tile`` (R * T * NV <= SUMS; type, R and T compile-time
// constants once inlined, so the sums stay in registers).
INLINE void block(const int type, const int R, const int T, const void *w, const float *x, int K, int N, int tile,
                  uint16_t *y) {
    vec acc[ROW_BLOCK][MAX_TILES][NV];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
        acc[r][t][v] = v_zero();
    const size_t stride = (size_t)K * LANES;  // elements per tile
    const size_t first = (size_t)tile * stride;
    for (int k = 0; k < K; k++) {
        vec wv[MAX_TILES][NV];
        UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
            wv[t][v] = v_weight(type, w, first + t * stride + (size_t)k * LANES + VW * v);
        UNROLL for (int r = 0; r < R; r++) {
            const vec xv = v_bcast(x + (size_t)r * K + k);
            UNROLL for (int t = 0; t < T; t++) UNROLL for (int v = 0; v < NV; v++)
                acc[r][t][v] = v_fma(xv, wv[t][v], acc[r][t][v]);
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) {
        float out[LANES];
        UNROLL for (int v = 0; v < NV; v++) v_store(out + VW * v, acc[r][t][v]);
        UNROLL for (int j = 0; j < LANES; j += 8)
            store_bf16(y + (size_t)r * N + (size_t)(tile + t) * LANES + j, _mm256_loadu_ps(out + j));
    }
}

// A block of R rows and T tiles, T either TILES_FOR(R) or 1: a compile-time element type,
// R and T per case.
static void any_block(int type, int R, int T, const void *w, const float *x, int K, int N, int tile, uint16_t *y) {
#define CASE(e, r, t) if (type == e && R == r && T == t) { block(e, r, t, w, x, K, N, tile, y); return; }
#define TYPES(r, t) CASE(FLOAT32, r, t) CASE(FLOAT16, r, t) CASE(BFLOAT16, r, t)
#define ROWS(r) TYPES(r, 1) if (TILES_FOR(r) > 1) { TYPES(r, TILES_FOR(r)) }
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6)
#if ROW_BLOCK > 6
    ROWS(7) ROWS(8)
#endif
#undef ROWS
#undef TYPES
#undef CASE
    abort();  // unreachable: R <= ROW_BLOCK, T is 1 or TILES_FOR(R), type one of the three
}

// y = x @ W^T. x: [M][K] bfloat16, y: [M][N] bfloat16, w: the packed weight of element type
// ``type``; 16 divides N (the caller checks and passes contiguous tensors).
void float_matmul(const uint16_t *x, const void *w, uint16_t *y, int M, int N, int K, int type) {
    const size_t n = (size_t)M * K;
    float *x32 = input_buffer_for((n + 15) / 16 * 16);
    for (size_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x32 + i, load_bf16(x + i));
    for (size_t i = n / 8 * 8; i < n; i++) x32[i] = from_bf16(x[i]);
    const int tiles = N / LANES;
    const int R0 = M < ROW_BLOCK ? M : ROW_BLOCK;  // the rows of a full row block
    const int T0 = TILES_FOR(R0);  // tiles per group: each thread takes whole groups
    const int groups = (tiles + T0 - 1) / T0;
    // schedule(dynamic): a thread slowed by another process on its core takes fewer tiles instead of
    // holding the others at the barrier; a tile's outputs are one thread's, so the split never changes a bit.
    #pragma omp parallel for schedule(dynamic, 1)
    for (int g = 0; g < groups; g++) {
        const int t0 = g * T0, tn = tiles - t0 < T0 ? tiles - t0 : T0;
        for (int r0 = 0; r0 < M; r0 += ROW_BLOCK) {
            const int R = M - r0 < ROW_BLOCK ? M - r0 : ROW_BLOCK;
            const float *xr = x32 + (size_t)r0 * K;
            uint16_t *yr = y + (size_t)r0 * N;
            if (R == R0 && tn == T0)
                any_block(type, R, T0, w, xr, K, N, t0, yr);
            else
                for (int t = t0; t < t0 + tn; t++) any_block(type, R, 1, w, xr, K, N, t, yr);
        }
    }
}

// float_matmul with op.h's arguments: x, w, y, M, N, K, type.
void float_matmul_op(const int64_t *a) {
    float_matmul(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), (int)a[3], (int)a[4], (int)a[5], (int)a[6]);
}
