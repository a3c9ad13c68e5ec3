// Attention over the KV cache for bfloat16 models, x86-64 AVX2 + FMA. Built and loaded
// by attention_cpu.py.
//
// Why our own: a row's result must not depend on which other rows share the forward.
// SDPA computes a verify round's K+1 queries (masked) with other kernels than a decode
// step's single query, so in bfloat16 the same position got slightly different
// attention outputs with and without speculation and a near-tie could flip a greedy
// token. Here every (query row, head) is computed alone, by the same operations in the
// same order, from its own query and the first `len` cached keys and values:
//   score_j = scale * (q . k_j)   (float32; the dot product in 8 lanes, then a fixed tree)
//   p_j     = exp(score_j - max)  (float32)
//   out     = sum_j p_j v_j / sum_j p_j
// so a decode step and a verify round give the same bits for the same position. It is
// also cheaper per call than SDPA at these sizes (one call per layer, no masks, no
// permuted copies).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define MAX_HEAD_DIM 256

// exp for x <= 0 (scores minus their maximum): Cephes' single-precision polynomial.
INLINE __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);  // operands in this order keep a NaN
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

INLINE float hsum(__m256 v) {  // a fixed tree: lanes (0+4, 1+5, 2+6, 3+7), then pairs
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// One (query row, head): q [D] float32, keys/values [len][D] bfloat16 -> out [D] bfloat16.
static void attend_one(const float *q, const uint16_t *keys, const uint16_t *values, int len, int D, float scale,
                       float *scores, uint16_t *out) {
    const int vecs = D / 8;
    float maximum = -INFINITY;
    for (int j = 0; j < len; j++) {
        const uint16_t *k = keys + (size_t)j * D;
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), load_bf16(k));
        for (int v = 1; v < vecs; v++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * v), load_bf16(k + 8 * v), acc);
        scores[j] = hsum(acc) * scale;
        maximum = scores[j] > maximum ? scores[j] : maximum;
    }
    __m256 top = _mm256_set1_ps(maximum), total = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= len; j += 8) {
        __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + j), top));
        _mm256_storeu_ps(scores + j, p);
        total = _mm256_add_ps(total, p);
    }
    float sum = hsum(total);
    if (j < len) {  // the last partial block, padded with -inf (exp = 0)
        float tail[8];
        for (int i = 0; i < 8; i++) tail[i] = j + i < len ? scores[j + i] : -INFINITY;
        __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(tail), top));
        p = _mm256_and_ps(p, _mm256_cmp_ps(_mm256_loadu_ps(tail), _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ));
        _mm256_storeu_ps(tail, p);
        for (int i = 0; j + i < len; i++) scores[j + i] = tail[i];
        sum += hsum(p);
    }
    __m256 acc[MAX_HEAD_DIM / 8];
    for (int v = 0; v < vecs; v++) acc[v] = _mm256_setzero_ps();
    for (int i = 0; i < len; i++) {
        const __m256 p = _mm256_set1_ps(scores[i]);
        const uint16_t *val = values + (size_t)i * D;
        for (int v = 0; v < vecs; v++) acc[v] = _mm256_fmadd_ps(p, load_bf16(val + 8 * v), acc[v]);
    }
    const __m256 inverse = _mm256_set1_ps(1.0f / sum);
    for (int v = 0; v < vecs; v++) {
        float o[8];
        _mm256_storeu_ps(o, _mm256_mul_ps(acc[v], inverse));
        for (int i = 0; i < 8; i++) out[8 * v + i] = to_bf16(o[i]);
    }
}

// q: [T][H][D] bfloat16; k_cache, v_cache: one layer's [slots][KVH][max_len][D] bfloat16;
// row_slot[t], row_len[t]: the cache row of query t and how many keys it sees (its
// position + 1, 1 <= len <= max_len). out: [T][H][D] bfloat16. D % 8 == 0, D <= 256,
// H % KVH == 0 (checked by the caller).
void attention(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *row_slot,
               const int32_t *row_len, uint16_t *out, int T, int H, int KVH, int D, int max_len, float scale) {
    const int group = H / KVH;
    const size_t head_stride = (size_t)max_len * D, slot_stride = (size_t)KVH * head_stride;
    #pragma omp parallel
    {
        // Scores on the heap, one buffer per thread: max_len floats can exceed a worker's stack.
        float *scores = malloc(sizeof(float) * (size_t)max_len);
        #pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < T * H; item++) {
            const int t = item / H, h = item % H, len = row_len[t];
            float qf[MAX_HEAD_DIM];
            for (int v = 0; v < D / 8; v++) _mm256_storeu_ps(qf + 8 * v, load_bf16(q + (size_t)item * D + 8 * v));
            const size_t at = (size_t)row_slot[t] * slot_stride + (size_t)(h / group) * head_stride;
            attend_one(qf, k_cache + at, v_cache + at, len, D, scale, scores, out + (size_t)item * D);
        }
        free(scores);
    }
}
