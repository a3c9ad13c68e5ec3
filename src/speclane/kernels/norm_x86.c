// The small operations between the matmuls of a bfloat16 forward, fused: the residual add
// with RMSNorm, RMSNorm of column groups in place (q/k heads, Gemma's output norms), the
// gated MLP's SiLU or GELU-tanh times up, a copy into a column slice (a split layer's
// parts), and the head's widening with its top candidates. Built by build.py for AVX-512 and AVX2
// (both written once over a vector of VW floats: 16 in the AVX-512 build, 8 in the AVX2
// one, each lane doing the same operations, so the builds give the same bits) and loaded
// by norm_cpu.py.
//
// Why: a one-token step of the default model calls these ~150 times (60 norms, 30 SiLUs,
// 60 adds, 60 casts to bfloat16), each a few microseconds of arithmetic behind ~10-60 µs of
// torch dispatch on this project's 2-core CPU (F.rms_norm alone is ~60 µs: six ops).
//
// Numerics follow the torch ops they replace, so only a sum's order can differ:
// - add_rms_norm: x += delta (float32 + a bfloat16 value, exact as in torch), then
//   out = bf16(x * (1 / sqrt(mean(x^2) + eps)) * weight) (add_rms_norm_f32: the same in
//   float32, the model's final norm). The sum of squares keeps 16
//   partial sums (element i into partial i % 16) added in a fixed order at the end, so
//   each row's result is the same in both builds and whatever the number of rows.
// - silu_mul / gelu_tanh_mul: out = bf16(bf16(act(gate)) * up), the roundings of
//   F.silu(gate) * up (F.gelu(gate, approximate="tanh") * up) on bfloat16 tensors.
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "bf16.h"
#include "op.h"

#define PARTIALS 16
#define PARALLEL_ROWS 8  // fewer rows run on the calling thread (a fork costs more than the work)

// The vector type and the few operations both loops use. Why 16 lanes where the CPU has
// them: the SiLU's exp polynomial is one long chain of dependent operations per vector,
// and at 8 lanes a 96-token prefill's SiLU ran at ~5 ns per element (slower than torch's).
#ifdef __AVX512F__
#define VW 16
typedef __m512 vec;
INLINE vec v_set1(float f) { return _mm512_set1_ps(f); }
INLINE vec v_load(const float *p) { return _mm512_loadu_ps(p); }
INLINE void v_store(float *p, vec a) { _mm512_storeu_ps(p, a); }
INLINE vec v_add(vec a, vec b) { return _mm512_add_ps(a, b); }
INLINE vec v_sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
INLINE vec v_mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
INLINE vec v_div(vec a, vec b) { return _mm512_div_ps(a, b); }
INLINE vec v_min(vec a, vec b) { return _mm512_min_ps(a, b); }
INLINE vec v_max(vec a, vec b) { return _mm512_max_ps(a, b); }
INLINE vec v_floor(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
INLINE vec v_pow2(vec n) {  // 2^n for integral n in the normal range
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
INLINE vec v_inf_where_above(vec value, vec x, float limit) {  // value, or +inf where x > limit
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_GT_OQ), value, _mm512_set1_ps(INFINITY));
}
INLINE vec v_load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
INLINE vec v_round_bf16(vec f) { return _mm512_castsi512_ps(_mm512_slli_epi32(to_bf16_16(f), 16)); }
INLINE void v_store_bf16(uint16_t *p, vec f) { _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(to_bf16_16(f))); }
#else
#define VW 8
typedef __m256 vec;
INLINE vec v_set1(float f) { return _mm256_set1_ps(f); }
INLINE vec v_load(const float *p) { return _mm256_loadu_ps(p); }
INLINE void v_store(float *p, vec a) { _mm256_storeu_ps(p, a); }
INLINE vec v_add(vec a, vec b) { return _mm256_add_ps(a, b); }
INLINE vec v_sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
INLINE vec v_mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
INLINE vec v_div(vec a, vec b) { return _mm256_div_ps(a, b); }
INLINE vec v_min(vec a, vec b) { return _mm256_min_ps(a, b); }
INLINE vec v_max(vec a, vec b) { return _mm256_max_ps(a, b); }
INLINE vec v_floor(vec a) { return _mm256_floor_ps(a); }
INLINE vec v_pow2(vec n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
INLINE vec v_inf_where_above(vec value, vec x, float limit) {
    return _mm256_blendv_ps(value, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(limit), _CMP_GT_OQ));
}
INLINE vec v_load_bf16(const uint16_t *p) { return load_bf16(p); }
INLINE vec v_round_bf16(vec f) { return round_bf16_8(f); }
INLINE void v_store_bf16(uint16_t *p, vec f) { store_bf16(p, f); }
#endif
_Static_assert(PARTIALS % VW == 0, "a vector holds whole partial sums");

// A row whose width is not a multiple of PARTIALS (no model here has one): element by element.
static void add_rms_norm_row_scalar(float *x, const uint16_t *delta, const float *weight, uint16_t *out, float *out_f32,
                                    int hidden, float eps) {
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
    for (int i = 0; i < hidden; i++) {
        const float y = x[i] * inv * weight[i];
        if (out_f32) out_f32[i] = y;
        else out[i] = to_bf16(y);
    }
}

// The same operations, VW elements at a time: element i goes into partial sum i % 16.
// The output in bfloat16 (out), or with out_f32 in float32 (the final norm's).
static void add_rms_norm_row(float *x, const uint16_t *delta, const float *weight, uint16_t *out, float *out_f32,
                             int hidden, float eps) {
    if (hidden % PARTIALS) {
        add_rms_norm_row_scalar(x, delta, weight, out, out_f32, hidden, eps);
        return;
    }
    vec partial[PARTIALS / VW];
    for (int v = 0; v < PARTIALS / VW; v++) partial[v] = v_set1(0.0f);
    for (int i = 0; i < hidden; i += PARTIALS) {
        for (int v = 0; v < PARTIALS / VW; v++) {
            vec xv = v_load(x + i + VW * v);
            if (delta) {
                xv = v_add(xv, v_load_bf16(delta + i + VW * v));
                v_store(x + i + VW * v, xv);
            }
            partial[v] = v_add(partial[v], v_mul(xv, xv));
        }
    }
    float partials[PARTIALS];
    for (int v = 0; v < PARTIALS / VW; v++) v_store(partials + VW * v, partial[v]);
    float sum = 0.0f;
    for (int j = 0; j < PARTIALS; j++) sum += partials[j];
    const vec inv = v_set1(1.0f / sqrtf(sum / (float)hidden + eps));
    for (int i = 0; i < hidden; i += VW) {
        const vec y = v_mul(v_mul(v_load(x + i), inv), v_load(weight + i));
        if (out_f32) v_store(out_f32 + i, y);
        else v_store_bf16(out + i, y);
    }
}

// x: [rows][hidden] float32, updated in place when delta (bfloat16, same shape) is given;
// weight: [hidden] float32; out: [rows][hidden] bfloat16.
void add_rms_norm(float *x, const uint16_t *delta, const float *weight, uint16_t *out, int rows, int hidden,
                  float eps) {
    #pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        add_rms_norm_row(x + (size_t)r * hidden, delta ? delta + (size_t)r * hidden : 0, weight,
                         out + (size_t)r * hidden, NULL, hidden, eps);
    }
}

// add_rms_norm with out: [rows][hidden] float32, the model's final norm, whose output the
// head reads in float32 (its top logits are float32 products with it). One C call in
// place of the ~6 torch ops of F.rms_norm: after a forward has streamed its weights
// through the caches those took ~0.1 ms a step here.
void add_rms_norm_f32(float *x, const uint16_t *delta, const float *weight, float *out, int rows, int hidden,
                      float eps) {
    #pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        add_rms_norm_row(x + (size_t)r * hidden, delta ? delta + (size_t)r * hidden : 0, weight, NULL,
                         out + (size_t)r * hidden, hidden, eps);
    }
}

// e^x in float32 for the gated activations: the Cephes expf polynomial after the usual reduction
// x = n ln2 + r (ln2 split in two so n ln2 is exact), |r| <= ln2 / 2; within 2 float32
// ulps, which the rounding to bfloat16 below nearly always absorbs. Written twice, for
// one float and for a vector (exp_poly_v), with the same operations in the same order and no FMA contraction (-ffp-contract=off): every element
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

INLINE vec exp_poly_v(vec x) {  // exp_poly, VW lanes
    const vec clamped = v_min(v_max(x, v_set1(EXP_LO)), v_set1(EXP_HI));
    const vec n = v_floor(v_add(v_mul(clamped, v_set1(LOG2E)), v_set1(0.5f)));
    const vec r = v_sub(v_sub(clamped, v_mul(n, v_set1(LN2_HI))), v_mul(n, v_set1(LN2_LO)));
    vec p = v_set1(EXP_POLY[0]);
    for (int i = 1; i < 6; i++) p = v_add(v_mul(p, r), v_set1(EXP_POLY[i]));
    p = v_add(v_add(v_mul(p, v_mul(r, r)), r), v_set1(1.0f));
    return v_inf_where_above(v_mul(p, v_pow2(n)), x, EXP_HI);
}

// The gated MLP's activations, both g / (1 + e^z): SiLU's z = -g, and GELU's tanh
// approximation (Gemma's) 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3), as
// z = -2u (the same function: 1 + tanh(u) = 2 / (1 + e^(-2u))), which keeps the digits of
// a very negative g's tiny result where 1 + tanh(u) would cancel them. out = bf16(bf16(
// act(gate)) * up), the roundings of torch's F.silu(gate) * up and F.gelu(gate,
// approximate="tanh") * up on bfloat16 tensors. Each element is one sequence of float32
// operations, one float or VW at a time.
#define GELU_C 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_K 0.044715f

static inline uint16_t act_times(float g, float u, const int GELU) {
    const float z = GELU ? -2.0f * (GELU_C * (g + GELU_K * (g * g * g))) : -g;
    return to_bf16(from_bf16(to_bf16(g / (1.0f + exp_poly(z)))) * u);
}

INLINE vec act_v(vec g, const int GELU) {
    const vec z = GELU ? v_mul(v_set1(-2.0f), v_mul(v_set1(GELU_C), v_add(g, v_mul(v_set1(GELU_K), v_mul(v_mul(g, g), g)))))
                       : v_sub(v_set1(0.0f), g);
    return v_round_bf16(v_div(g, v_add(v_set1(1.0f), exp_poly_v(z))));
}

// gate_up: [rows][2 * inter] bfloat16 (gate, then up); out: [rows][inter] bfloat16.
INLINE void gated_mul(const uint16_t *gate_up, uint16_t *out, int rows, int inter, const int GELU) {
    #pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + (size_t)r * 2 * inter, *up = gate + inter;
        uint16_t *y = out + (size_t)r * inter;
        int i = 0;
        // Four vectors per iteration: exp's polynomial is a chain of dependent operations,
        // and independent chains side by side keep the vector units busy (SiLU, 1 vector
        // per iteration: 3.5 ns per element here, 4: 2.0).
        for (; i + 4 * VW <= inter; i += 4 * VW) {
            vec a[4];
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) a[j] = act_v(v_load_bf16(gate + i + VW * j), GELU);
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) v_store_bf16(y + i + VW * j, v_mul(a[j], v_load_bf16(up + i + VW * j)));
        }
        for (; i + VW <= inter; i += VW) v_store_bf16(y + i, v_mul(act_v(v_load_bf16(gate + i), GELU), v_load_bf16(up + i)));
        for (; i < inter; i++) y[i] = act_times(from_bf16(gate[i]), from_bf16(up[i]), GELU);
    }
}

void silu_mul(const uint16_t *gate_up, uint16_t *out, int rows, int inter) { gated_mul(gate_up, out, rows, inter, 0); }
void gelu_tanh_mul(const uint16_t *gate_up, uint16_t *out, int rows, int inter) { gated_mul(gate_up, out, rows, inter, 1); }

// add_rms_norm (x, delta, weight, out, rows, hidden, eps), silu_mul and gelu_tanh_mul
// (gate_up, out, rows, inter) with op.h's arguments.
void add_rms_norm_op(const int64_t *a) {
    add_rms_norm(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), (int)a[4], (int)a[5], op_float(a[6]));
}

void add_rms_norm_f32_op(const int64_t *a) {
    add_rms_norm_f32(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), (int)a[4], (int)a[5], op_float(a[6]));
}
void silu_mul_op(const int64_t *a) { silu_mul(OP_PTR(a[0]), OP_PTR(a[1]), (int)a[2], (int)a[3]); }
void gelu_tanh_mul_op(const int64_t *a) { gelu_tanh_mul(OP_PTR(a[0]), OP_PTR(a[1]), (int)a[2], (int)a[3]); }

// The output head's coarse logits widened, and each row's candidates for the exact refine
// (LlamaModel.logits): out [rows][vocab] float32 = coarse [rows][vocab] bfloat16 (exact),
// top [rows][count] the indices of the row's count largest values, largest first, equal
// values in index order; a NaN is never a candidate, and a row with fewer than count
// non-NaN values fills the rest with -1. Why here: torch's .float(), topk and argmax over
// a 49,152-token vocabulary are ~0.15 ms of a ~7 ms one-token step on a 2-core CPU, one pass
// here ~0.02 ms. The caller checks 1 <= count <= vocab.
static void insert_candidate(float *value, int32_t *index, int *filled, int count, float v, int32_t i) {
    int at = *filled < count ? *filled : count - 1;  // the slot it takes before moving up
    if (*filled < count) (*filled)++;
    while (at > 0 && value[at - 1] < v) {  // strictly: an equal earlier value stays ahead
        value[at] = value[at - 1];
        index[at] = index[at - 1];
        at--;
    }
    value[at] = v;
    index[at] = i;
}

void top_logits(const uint16_t *coarse, float *out, int32_t *top, int rows, int vocab, int count) {
    #pragma omp parallel for schedule(static) if (rows >= 2)  // a row is a whole vocabulary: worth a fork
    for (int r = 0; r < rows; r++) {
        const uint16_t *c = coarse + (size_t)r * vocab;
        float *y = out + (size_t)r * vocab, value[count];
        int32_t *index = top + (size_t)r * count;
        int filled = 0, i = 0;
        for (; i + VW <= vocab; i += VW) v_store(y + i, v_load_bf16(c + i));
        for (; i < vocab; i++) y[i] = from_bf16(c[i]);
        i = 0;
        for (; i < vocab && filled < count; i++)
            if (y[i] == y[i]) insert_candidate(value, index, &filled, count, y[i], i);
        for (; i + 8 <= vocab; i += 8) {  // a block with no value above the smallest kept one is skipped
            const __m256 above = _mm256_cmp_ps(_mm256_loadu_ps(y + i), _mm256_set1_ps(value[count - 1]), _CMP_GT_OQ);
            if (!_mm256_movemask_ps(above)) continue;
            for (int j = i; j < i + 8; j++)
                if (y[j] > value[count - 1]) insert_candidate(value, index, &filled, count, y[j], j);
        }
        for (; i < vocab; i++)
            if (y[i] > value[count - 1]) insert_candidate(value, index, &filled, count, y[i], i);
        for (int j = filled; j < count; j++) index[j] = -1;
    }
}

// logits[n][top[n][r]] = hidden[n] . rows[n][r] for r < count: the head's top candidates'
// exact logits (hidden [n][H] float32, rows [n][count][H] float32: their exact weights,
// logits [n][vocab]), in place of their coarse values. A dot product keeps 16 partial sums
// (element i into partial i % 16) added in a fixed order, so a row's values do not depend
// on the rows beside it. One C call where torch's einsum and scatter took ~0.1 ms a step
// after a forward had streamed its weights through the caches.
void refine_logits(const float *hidden, const float *rows, const int64_t *top, float *logits, int n, int count, int H,
                   int vocab) {
    #pragma omp parallel for schedule(static) if (n >= PARALLEL_ROWS)
    for (int t = 0; t < n; t++) {
        const float *h = hidden + (size_t)t * H;
        for (int r = 0; r < count; r++) {
            const float *w = rows + ((size_t)t * count + r) * H;
            float partials[PARTIALS] = {0};
            int i = 0;
            if (H % PARTIALS == 0) {
                vec partial[PARTIALS / VW];
                for (int v = 0; v < PARTIALS / VW; v++) partial[v] = v_set1(0.0f);
                for (; i < H; i += PARTIALS)
                    for (int v = 0; v < PARTIALS / VW; v++)
                        partial[v] = v_add(partial[v], v_mul(v_load(h + i + VW * v), v_load(w + i + VW * v)));
                for (int v = 0; v < PARTIALS / VW; v++) v_store(partials + VW * v, partial[v]);
            } else {
                for (; i < H; i++) partials[i % PARTIALS] += h[i] * w[i];
            }
            float sum = 0.0f;
            for (int j = 0; j < PARTIALS; j++) sum += partials[j];
            const int64_t id = top[(size_t)t * count + r];
            if (id >= 0 && id < vocab) logits[(size_t)t * vocab + id] = sum;
        }
    }
}

// src [rows][width] bfloat16 into columns [offset, offset + width) of dst's rows (row
// stride ld): a forward plan's step that puts one part of a weight split between kernel
// kinds (models/linear.py, SplitWeight) beside the others, as torch.cat does in the loop.
void copy_columns(const uint16_t *src, uint16_t *dst, int rows, int width, int ld, int offset) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * ld + offset, src + (size_t)r * width, (size_t)width * sizeof(uint16_t));
}

void copy_columns_op(const int64_t *a) {
    copy_columns(OP_PTR(a[0]), OP_PTR(a[1]), (int)a[2], (int)a[3], (int)a[4], (int)a[5]);
}

// RMSNorm in place over groups of a bfloat16 row: x [rows][stride], the groups at columns
// [g * width, (g + 1) * width) for g < groups, each x = bf16(x * (1 / sqrt(mean(x^2) + eps))
// * weight) with weight [width] float32: add_rms_norm's arithmetic on a float32 copy of
// the group (exact). What it serves: Qwen3's and Gemma 3's per-head q and k norms (groups
// = heads, width = head_dim, the q heads then the k heads of the fused projection), and
// Gemma's norms of a layer's attention and MLP outputs (one group of the hidden size).
void rms_norm_groups(uint16_t *x, int rows, int stride, int groups, int width, const float *weight, float eps) {
    #pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        float row[width];
        for (int g = 0; g < groups; g++) {
            uint16_t *group = x + (size_t)r * stride + (size_t)g * width;
            for (int i = 0; i < width; i++) row[i] = from_bf16(group[i]);
            add_rms_norm_row(row, 0, weight, group, NULL, width, eps);
        }
    }
}

void rms_norm_groups_op(const int64_t *a) {
    rms_norm_groups(OP_PTR(a[0]), (int)a[1], (int)a[2], (int)a[3], (int)a[4], OP_PTR(a[5]), op_float(a[6]));
}

