// One MTP draft step in one call: the head's block over n new entries, then the draft
// logits of the last one and their argmax (models/mtp_kernel_step.py, "fused").
//
// Why: a draft step is ~25 small calls (norms, int4 matmuls, RoPE + attention, the
// residual adds), each cheap in C but paying ctypes and torch's dispatch; right after a
// target forward has streamed ~100 MB through the caches that glue cost ~half the step
// (~1 ms of a ~1.9 ms round of two drafts on an AMX Xeon; benchmarks/mtp_drafting_cost.py).
//
// Nothing here computes a new way: the step calls the very kernels the torch-level step
// calls (the int4 matmul, add + RMSNorm, SiLU * up and rope_write_attention builds this
// process already loaded, passed in as function pointers), in the same order, on the same
// bfloat16 and float32 buffers. So its outputs are the torch-level step's bits (a test
// checks it), and the kernels keep one definition each.

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "bf16.h"

typedef void (*int4_fn)(const uint16_t *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *minimum,
                        uint16_t *y, int M, int N, int K);
typedef void (*norm_fn)(float *x, const uint16_t *delta, const float *weight, uint16_t *out, int rows, int hidden,
                        float eps);
typedef void (*silu_fn)(const uint16_t *gate_up, uint16_t *out, int rows, int inter);
typedef void (*attention_fn)(const uint16_t *qkv, const uint16_t *cos, const uint16_t *signed_sin, uint16_t *k_cache,
                             uint16_t *v_cache, const int32_t *row_slot, const int32_t *row_len, uint16_t *q_out,
                             uint16_t *out, int T, int H, int KVH, int D, int max_len, float scale, int window,
                             float softcap);

typedef struct {
    const uint8_t *packed;
    const uint16_t *scale, *minimum;
} q4_weight_ref;

// The head: its kernels, shape, weights and scratch (for up to max_rows rows), filled once
// by the Python side (ctypes.Structure in mtp_kernel_step.py: keep the field order).
typedef struct {
    int4_fn int4;
    norm_fn norm;
    silu_fn silu;
    attention_fn attention;
    int hidden, inter, heads, kv_heads, head_dim, vocab, max_rows;
    float eps, scale;
    const float *hidden_norm, *embed_norm, *attn_norm, *mlp_norm, *final_norm, *embed;
    q4_weight_ref fc, qkv, o, gate_up, down, head;
    // scratch, bfloat16: joined [rows][2H], wide [rows][max(2I, (heads + 2 kv) D)], act
    // [rows][I], narrow and narrow2 [rows][H], q [rows][heads][D]; float32: x [rows][H]
    uint16_t *joined, *wide, *act, *narrow, *narrow2, *q;
    float *x;
    // mtp_draft_greedy's: out [rows][H] and carry [H] float32, logits [vocab] bfloat16;
    // vocab_ids [vocab]: the target's token id of each draft-vocabulary row
    float *out, *carry;
    uint16_t *logits;
    const int64_t *vocab_ids;
} mtp_head;

static void matmul(const mtp_head *m, const q4_weight_ref *w, const uint16_t *x, uint16_t *y, int rows, int n, int k) {
    m->int4(x, w->packed, w->scale, w->minimum, y, rows, n, k);
}

// Entries for n rows after the cache's `length` ones: hidden [n][H] float32 (target hidden
// states or block outputs), next_tokens [n]; writes the block outputs out [n][H] float32.
// Then, unless logits is NULL, the draft logits of the last row (bfloat16 [vocab]) and
// returns their argmax (the first of equal maxima); else returns -1.
// row_slot / row_len [n]: the kernel cache's rows (slot 0, entry index + 1).
int mtp_step(const mtp_head *m, const float *hidden, const int64_t *next_tokens, int n, uint16_t *k_cache,
             uint16_t *v_cache, const int32_t *row_slot, const int32_t *row_len, int max_len, const uint16_t *cos,
             const uint16_t *signed_sin, float *out, uint16_t *logits) {
    const int H = m->hidden, I = m->inter, qkv_width = (m->heads + 2 * m->kv_heads) * m->head_dim;
    if (n <= 0 || n > m->max_rows) return -2;
    for (int r = 0; r < n; r++) {  // [norm(h) ; norm(embed(next))], each row alone (as torch's cat of two norms)
        m->norm((float *)(hidden + (size_t)r * H), 0, m->hidden_norm, m->joined + (size_t)r * 2 * H, 1, H, m->eps);
        m->norm((float *)(m->embed + (size_t)next_tokens[r] * H), 0, m->embed_norm, m->joined + (size_t)r * 2 * H + H, 1,
                H, m->eps);
    }
    matmul(m, &m->fc, m->joined, m->narrow, n, H, 2 * H);
    float *x = m->x;
    for (size_t i = 0; i < (size_t)n * H; i++) x[i] = from_bf16(m->narrow[i]);  // the float32 residual stream
    m->norm(x, 0, m->attn_norm, m->narrow, n, H, m->eps);
    matmul(m, &m->qkv, m->narrow, m->wide, n, qkv_width, H);
    m->attention(m->wide, cos, signed_sin, k_cache, v_cache, row_slot, row_len, m->q, m->narrow2, n, m->heads,
                 m->kv_heads, m->head_dim, max_len, m->scale, 0, 0.0f);  // every entry, no soft cap
    matmul(m, &m->o, m->narrow2, m->narrow, n, H, m->heads * m->head_dim);
    m->norm(x, m->narrow, m->mlp_norm, m->narrow2, n, H, m->eps);  // x += o, then the MLP's norm
    matmul(m, &m->gate_up, m->narrow2, m->wide, n, 2 * I, H);
    m->silu(m->wide, m->act, n, I);
    matmul(m, &m->down, m->act, m->narrow, n, H, I);
    for (size_t i = 0; i < (size_t)n * H; i++) out[i] = x[i] + from_bf16(m->narrow[i]);
    if (!logits) return -1;
    const float *last = out + (size_t)(n - 1) * H;
    m->norm((float *)last, 0, m->final_norm, m->narrow, 1, H, m->eps);
    matmul(m, &m->head, m->narrow, logits, 1, m->vocab, H);
    int best = 0;
    float best_value = from_bf16(logits[0]);
    for (int v = 1; v < m->vocab; v++) {
        const float value = from_bf16(logits[v]);
        if (value > best_value) best = v, best_value = value;
    }
    return best;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

// A greedy round in one call: the catch-up (mtp_step over n true rows), then k drafts, each
// the argmax of the previous step's logits and, but the last, fed back as the next entry.
// The cache's rows from its current length on: n true entries, then k - 1 speculative ones
// that the caller drops (it advances its length by n only). row_slot / row_len point at the
// cache's current length. drafts [k]: the drafted token ids; catch_up_ms: the catch-up's
// share of the call's time. Returns k, or a negative mtp_step error.
int mtp_draft_greedy(const mtp_head *m, const float *hidden, const int64_t *next_tokens, int n, int k,
                     uint16_t *k_cache, uint16_t *v_cache, const int32_t *row_slot, const int32_t *row_len, int max_len,
                     const uint16_t *cos, const uint16_t *signed_sin, int64_t *drafts, double *catch_up_ms) {
    const double started = now_ms();
    int best = mtp_step(m, hidden, next_tokens, n, k_cache, v_cache, row_slot, row_len, max_len, cos, signed_sin, m->out,
                        m->logits);
    if (best < 0) return best;
    *catch_up_ms = now_ms() - started;
    const int H = m->hidden;
    const float *last = m->out + (size_t)(n - 1) * H;
    for (int j = 0; j < k; j++) {
        drafts[j] = m->vocab_ids[best];
        if (j + 1 == k) break;
        memcpy(m->carry, last, sizeof(float) * H);  // the step writes m->out again
        best = mtp_step(m, m->carry, drafts + j, 1, k_cache, v_cache, row_slot + n + j, row_len + n + j, max_len, cos,
                        signed_sin, m->out, m->logits);
        if (best < 0) return best;
        last = m->out;
    }
    return k;
}
