// The small per-layer operations between the matmuls of a bfloat16 forward, fused: the
// residual add with RMSNorm, and SiLU(gate) * up. Built by build.py for AVX-512 and AVX2
// (the norm's loops are left to the compiler; the SiLU is written 8-wide, below) and
// loaded by norm_cpu.py.
//
// Why: a one-token step of the default model calls these ~150 times (60 norms, 30 SiLUs,
// 60 adds, 60 casts to bfloat16), each a few microseconds of arithmetic behind ~10-60 µs of
// torch dispatch on this project's 2-core CPU (F.rms_norm alone is ~60 µs: six ops).
//
// Numerics follow the torch ops they replace, so only a sum's order can differ:
// - add_rms_norm: x += delta (float32 + a bfloat16 value, exact as in torch), then
//   out = bf16(x * (1 / sqrt(mean(x^2) + eps)) * weight). The sum of squares keeps 16
//   partial sums (element i into partial i % 16) added in a fixed order at the end, so
//   each row's result is the same in both builds and whatever the number of rows.
// - silu_mul: out = bf16(bf16(silu(gate)) * up), the roundings of F.silu(gate) * up on
//   bfloat16 tensors.
#include <math.h>
#include <stdint.h>

#include "bf16.h"

#define PARTIALS 16
#define PARALLEL_ROWS 8  // fewer rows run on the calling thread (a fork costs more than the work)

static void add_rms_norm_row(float *x, const uint16_t *delta, const float *weight, uint16_t *out, int hidden,
                             float eps) {
    float partial[PARTIALS] = {0};
    if (delta) {
        for (int i = 0; i < hidden; i++) x[i] += from_bf16(delta[i]);
    }
    for (int i = 0; i < hidden; i += PARTIALS) {
        for (int j = 0; j < PARTIALS && i + j < hidden; j++) partial[j] += x[i + j] * x[i + j];
    }
    float sum = 0.0f;
    for (int j = 0; j < PARTIALS; j++) sum += partial[j];
    const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
    for (int i = 0; i < hidden; i++) out[i] = to_bf16(x[i] * inv * weight[i]);
}

// x: [rows][hidden] float32, updated in place when delta (bfloat16, same shape) is given;
// weight: [hidden] float32; out: [rows][hidden] bfloat16.
void add_rms_norm(float *x, const uint16_t *delta, const float *weight, uint16_t *out, int rows, int hidden,
                  float eps) {
    #pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        add_rms_norm_row(x + (size_t)r * hidden, delta ? delta + (size_t)r * hidden : 0, weight,
                         out + (size_t)r * hidden, hidden, eps);
    }
}

// e^x in float32 for the SiLU: the Cephes expf polynomial after the usual reduction
// x = n ln2 + r (ln2 split in two so n ln2 is exact), |r| <= ln2 / 2; within 2 float32
// ulps, which the rounding to bfloat16 below nearly always absorbs. Written twice, for
// one float and for 8 (AVX2, in both builds: plenty for this loop), with the same
// operations in the same order and no FMA contraction (-ffp-contract=off): every element
// gets the same bits whichever form computes it. (A libm call per element, unvectorized,
// made a 96-token prefill's SiLU ~2.5 ms per layer, 9x torch's.)
#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO -2.12194440e-4f
static const float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_poly(float x) {
    if (x > EXP_HI) return INFINITY;  // so silu(g) of a very negative g is -0, as in torch
    x = fminf(fmaxf(x, EXP_LO), EXP_HI);
    const float n = floorf(x * LOG2E + 0.5f);
    const float r = (x - n * LN2_HI) - n * LN2_LO;
    float p = EXP_POLY[0];
    for (int i = 1; i < 6; i++) p = p * r + EXP_POLY[i];
    p = (p * (r * r) + r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;  // 2^n
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

static inline uint16_t silu_times(float g, float u) {  // bf16(bf16(silu(g)) * u), as torch rounds
    const float silu = from_bf16(to_bf16(g / (1.0f + exp_poly(-g))));
    return to_bf16(silu * u);
}

INLINE __m256 exp_poly8(__m256 x) {
    const __m256 overflow = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_HI), _CMP_GT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _mm256_set1_ps(0.5f)));
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
    __m256 p = _mm256_set1_ps(EXP_POLY[0]);
    for (int i = 1; i < 6; i++) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(EXP_POLY[i]));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_blendv_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), _mm256_set1_ps(INFINITY), overflow);
}

INLINE __m256 bf16_round8(__m256 f) {  // float -> nearest bfloat16 -> float
    return _mm256_castsi256_ps(_mm256_slli_epi32(to_bf16_8(f), 16));
}

// gate_up: [rows][2 * inter] bfloat16 (gate, then up); out: [rows][inter] bfloat16.
void silu_mul(const uint16_t *gate_up, uint16_t *out, int rows, int inter) {
    #pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + (size_t)r * 2 * inter, *up = gate + inter;
        uint16_t *y = out + (size_t)r * inter;
        int i = 0;
        for (; i + 8 <= inter; i += 8) {
            const __m256 g = load_bf16(gate + i);
            const __m256 e = exp_poly8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            const __m256 silu = bf16_round8(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
            store_bf16(y + i, _mm256_mul_ps(silu, load_bf16(up + i)));
        }
        for (; i < inter; i++) y[i] = silu_times(from_bf16(gate[i]), from_bf16(up[i]));
    }
}
