// A matmul's inputs as int8 (included by int4_q8_x86.c and int8_q8_x86.c, the kernels of
// --matmul-inputs int8): each group of 32 inputs of a row as q = round(x / d) (nearest,
// ties to even) with the group's step d = max|x| / 127, llama.cpp's Q8_1; |q| <= 127.
#ifndef SPECLANE_Q8_INPUTS_H
#define SPECLANE_Q8_INPUTS_H

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "grid.h"  // input_buffer_for

#define Q8_GROUP 32  // inputs per step

// A call's int8 inputs: q [M][K]; each group's step [M][K/32]; and over each group of the
// weight's G inputs (G = 16 or 32) sum(q) [M][K/G], and d * sum(q) (a weight's minimum term).
typedef struct {
    const int8_t *q;
    const float *step, *step_sum;
    const int32_t *q_sum;
    int ld, steps, sums;  // q's row stride (K), and the steps' and sums' (K/32, K/G)
} q8_input;

INLINE q8_input q8_rows_from(const q8_input *in, int r0) {  // rows r0.. of a call's inputs
    const q8_input rows = {in->q + (size_t)r0 * in->ld, in->step + (size_t)r0 * in->steps,
                           in->step_sum + (size_t)r0 * in->sums, in->q_sum + (size_t)r0 * in->sums,
                           in->ld, in->steps, in->sums};
    return rows;
}

#ifdef __AVX512VNNI__
// The AVX-512 VNNI builds' register blocks (int4_q8_x86.c, int8_q8_x86.c): up to this many
// rows of one tile, or one row of this many tiles. One row over 4 tiles has 4 independent
// chains of vpdpbusd where one tile would have one, and took the same time as one tile on
// the default model's head; two tiles interleaved (these kernels' AVX2 builds at one row,
// any build at two rows) made two weight streams a thread with each thread on a contiguous
// run of tiles (split.h), and one tile a call took 0.63-0.72x their time at those rows (an
// AMD EPYC Zen 4). So every other call, and the AVX2 builds' one row, takes one tile.
#define Q8_VNNI_ROWS 8
#define Q8_VNNI_TILES 4

INLINE __m512i broadcast_quad(const int8_t *q) {  // 4 int8 inputs in every 32-bit lane
    int32_t quad;
    memcpy(&quad, q, sizeof quad);
    return _mm512_set1_epi32(quad);
}

// R rows' products with two quads of TT tiles (input columns 4k .. 4k+7; first and second:
// each quad's 16 columns x 4 unsigned bytes), added into the rows' int32 sums by vpdpbusd:
// the first quad's into d[0], the second's into d[chains - 1] (two chains a row and tile
// where there are few: independent sums whose latency overlaps; the total is the same).
INLINE void add_quad_pair_products(const int R, const int TT, const int chains, const q8_input *in, int k,
                                   const __m512i *first, const __m512i *second,
                                   __m512i d[2][Q8_VNNI_TILES][Q8_VNNI_ROWS]) {
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {
        const int8_t *x = in->q + (size_t)r * in->ld + 4 * k;
        const __m512i x0 = broadcast_quad(x), x1 = broadcast_quad(x + 4);
        _Pragma("GCC unroll 16") for (int t = 0; t < TT; t++) {
            d[0][t][r] = _mm512_dpbusd_epi32(d[0][t][r], first[t], x0);
            d[chains - 1][t][r] = _mm512_dpbusd_epi32(d[chains - 1][t][r], second[t], x1);
        }
    }
}
#endif

INLINE int sum_lanes(__m256i v) {  // the 8 int32 lanes' sum
    const __m128i four = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i two = _mm_add_epi32(four, _mm_unpackhi_epi64(four, four));
    return _mm_cvtsi128_si32(_mm_add_epi32(two, _mm_shuffle_epi32(two, 1)));
}

// Fills q, step, step_sum and q_sum (each sized as q8_input says) from x [M][K] bfloat16. A group
// whose largest magnitude is infinite or NaN gets a NaN step (its outputs are NaN, as a
// float matmul's would be) and zero inputs. Rows are split between threads from 8 rows on.
static void quantize_inputs(const uint16_t *x, int8_t *q, float *step, float *step_sum, int32_t *q_sum, int M, int K, int G) {
    const int steps = K / Q8_GROUP, sums = K / G;
    #pragma omp parallel for schedule(static) if (M >= 8)
    for (int r = 0; r < M; r++)
        for (int g = 0; g < steps; g++) {
            const size_t at = (size_t)r * K + (size_t)g * Q8_GROUP;
            __m256 v[4];
            const uint32_t bits = load_group_max_bits(x + at, v);
            float amax;
            memcpy(&amax, &bits, sizeof amax);
            if (bits >= 0x7F800000u) amax = __builtin_nanf("");
            const float d = amax / 127.0f;
            // A NaN step, and a step so small (a subnormal) that 1 / d overflows: q all zero (a
            // product of Inf or NaN would convert to -128, and the two builds of int8_q8_x86.c,
            // which multiply a -128 input differently, would then differ).
            const float inverse = d > 0.0f ? 1.0f / d : 0.0f;
            __m256i i8 = _mm256_setzero_si256();
            if (inverse <= FLT_MAX) {
                const __m256 scale = _mm256_set1_ps(inverse);
                __m256i i32[4];
                for (int i = 0; i < 4; i++) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale));
                const __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]), i16b = _mm256_packs_epi32(i32[2], i32[3]);
                i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16a, i16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            }
            _mm256_storeu_si256((__m256i *)(q + at), i8);
            step[(size_t)r * steps + g] = d;
            // The sums of q over the weight's groups in this step's 32 inputs (integers: exact):
            // inputs 0-15 and 16-31 widened to int16, their pairs' sums in int32 lanes.
            const __m256i ones = _mm256_set1_epi16(1);
            const __m256i halves[2] = {_mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(i8)), ones),
                                       _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(i8, 1)), ones)};
            const int half_sums[2] = {sum_lanes(halves[0]), sum_lanes(halves[1])};
            for (int s = 0; s < Q8_GROUP / G; s++) {
                const int total = G == Q8_GROUP ? half_sums[0] + half_sums[1] : half_sums[s];
                const size_t sum_at = (size_t)r * sums + (size_t)g * (Q8_GROUP / G) + s;
                q_sum[sum_at] = total;
                step_sum[sum_at] = d * (float)total;
            }
        }
}

// A call's int8 inputs in the calling thread's scratch (input_buffer_for): x [M][K] quantized,
// the steps, and the sums over the weight's groups of G.
static q8_input quantize_call(const uint16_t *x, int M, int K, int G) {
    const size_t q_floats = ((size_t)M * K / 4 + 15) / 16 * 16, step_floats = ((size_t)M * (K / Q8_GROUP) + 15) / 16 * 16;
    const size_t sum_floats = ((size_t)M * (K / G) + 15) / 16 * 16;
    float *scratch = input_buffer_for(q_floats + step_floats + 2 * sum_floats);
    int8_t *q = (int8_t *)scratch;
    float *step = scratch + q_floats, *step_sum = step + step_floats;
    int32_t *q_sum = (int32_t *)(step_sum + sum_floats);
    quantize_inputs(x, q, step, step_sum, q_sum, M, K, G);
    const q8_input in = {q, step, step_sum, q_sum, K, K / Q8_GROUP, K / G};
    return in;
}

#endif
