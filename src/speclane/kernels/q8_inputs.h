// A matmul's inputs as int8 (included by int4_q8_x86.c and int8_q8_x86.c, the kernels of
// --matmul-inputs int8): each group of 32 inputs of a row as q = round(x / d) (nearest,
// ties to even) with the group's step d = max|x| / 127, llama.cpp's Q8_1; |q| <= 127.
#ifndef SPECLANE_Q8_INPUTS_H
#define SPECLANE_Q8_INPUTS_H

#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "grid.h"  // input_buffer_for

#define Q8_GROUP 32  // inputs per step

// A call's int8 inputs: q [M][K]; each group's step [M][K/32]; and d * sum(q) over each
// group of the weight's G inputs [M][K/G] (G = 16 or 32: a weight's minimum term).
typedef struct {
    const int8_t *q;
    const float *step, *step_sum;
    int ld, steps, sums;  // q's row stride (K), and the steps' and sums' (K/32, K/G)
} q8_input;

INLINE q8_input q8_rows_from(const q8_input *in, int r0) {  // rows r0.. of a call's inputs
    const q8_input rows = {in->q + (size_t)r0 * in->ld, in->step + (size_t)r0 * in->steps,
                           in->step_sum + (size_t)r0 * in->sums, in->ld, in->steps, in->sums};
    return rows;
}

// Fills q, step and step_sum (each sized as q8_input says) from x [M][K] bfloat16. A group
// whose largest magnitude is infinite or NaN gets a NaN step (its outputs are NaN, as a
// float matmul's would be) and zero inputs. Rows are split between threads from 8 rows on.
static void quantize_inputs(const uint16_t *x, int8_t *q, float *step, float *step_sum, int M, int K, int G) {
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
            const float inverse = d > 0.0f ? 1.0f / d : 0.0f;  // NaN d: 0 (q all zero)
            const __m256 scale = _mm256_set1_ps(inverse);
            __m256i i32[4];
            for (int i = 0; i < 4; i++) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale));
            const __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]), i16b = _mm256_packs_epi32(i32[2], i32[3]);
            const __m256i i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16a, i16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(q + at), i8);
            step[(size_t)r * steps + g] = d;
            // The sums of q over the weight's groups in this step's 32 inputs (integers: exact).
            for (int s = 0; s < Q8_GROUP / G; s++) {
                int total = 0;
                for (int i = s * G; i < (s + 1) * G; i++) total += q[at + i];
                step_sum[(size_t)r * sums + (size_t)g * (Q8_GROUP / G) + s] = d * (float)total;
            }
        }
}

// A call's int8 inputs in the calling thread's scratch (input_buffer_for): x [M][K] quantized,
// the steps, and the step sums over the weight's groups of G.
static q8_input quantize_call(const uint16_t *x, int M, int K, int G) {
    const size_t q_floats = ((size_t)M * K / 4 + 15) / 16 * 16, step_floats = ((size_t)M * (K / Q8_GROUP) + 15) / 16 * 16;
    float *scratch = input_buffer_for(q_floats + step_floats + (size_t)M * (K / G));
    int8_t *q = (int8_t *)scratch;
    float *step = scratch + q_floats, *step_sum = step + step_floats;
    quantize_inputs(x, q, step, step_sum, M, K, G);
    const q8_input in = {q, step, step_sum, K, K / Q8_GROUP, K / G};
    return in;
}

#endif
