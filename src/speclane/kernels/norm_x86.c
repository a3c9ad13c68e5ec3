// The small per-layer operations between the matmuls of a bfloat16 forward, fused: the
// residual add with RMSNorm, and SiLU(gate) * up. Built by build.py for AVX-512 and AVX2
// (the compiler vectorizes the loops) and loaded by norm_cpu.py.
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

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

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

// gate_up: [rows][2 * inter] bfloat16 (gate, then up); out: [rows][inter] bfloat16.
void silu_mul(const uint16_t *gate_up, uint16_t *out, int rows, int inter) {
    #pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + (size_t)r * 2 * inter, *up = gate + inter;
        uint16_t *y = out + (size_t)r * inter;
        for (int i = 0; i < inter; i++) {
            const float g = from_bf16(gate[i]);
            const float silu = from_bf16(to_bf16(g / (1.0f + expf(-g))));
            y[i] = to_bf16(silu * from_bf16(up[i]));
        }
    }
}
