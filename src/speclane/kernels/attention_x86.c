// Attention over the KV cache for bfloat16 models, x86-64. Built twice by build.py, for
// AVX2 + FMA and for AVX-512 (F + BW), and loaded by attention_cpu.py.
//
// Why our own: a row's result must not depend on which other rows share the forward.
// SDPA computes a verify round's K+1 queries (masked) with other kernels than a decode
// step's single query, so in bfloat16 the same position got slightly different
// attention outputs with and without speculation and a near-tie could flip a greedy
// token. Here every (query row, head) is computed by the same operations in the same
// order, from its own query and the keys and values it sees, in segments of SEGMENT keys
// (the row's j-th key is in segment j / SEGMENT):
//   score_j = scale * (q . k_j)                 (float32; the dot product in 16 lanes, then a fixed tree)
//   per segment s: m_s = max score, p_j = exp(score_j - m_s), l_s = sum p_j, o_s = sum p_j v_j
//   out = sum_s e_s o_s / sum_s e_s l_s,  e_s = exp(m_s - max_s m_s)   (segments in order)
// so a decode step and a verify round give the same bits for the same position. It is
// also cheaper per call than SDPA at these sizes (one call per layer, no masks, no
// permuted copies).
//
// The work is shared without changing a query's operations. An item is one segment's keys
// (or all of a row's, segment by segment) for the queries that read them: a row's heads of
// one key/value head (grouped-query attention), and the rows of one sequence that see the
// same keys (a verify round, a prompt's chunk), so each key is unpacked once for all of them
// and each segment's values are weighed from L1. Where rows are few (a one-token step: one
// row of a few key/value heads on 2 threads) each segment is an item of its own, as flash
// decoding splits a long context, and the partial sums are combined after; the dot
// products of 16 keys are summed together, lane tree for lane tree as one key's would be
// (sum_each).
//
// bfloat16 -> float32 is a 16-bit shift; interleaving a zero word below each value
// (unpacklo/unpackhi) does it in one instruction per vector but leaves the dimensions in
// the order the interleave takes them. Keys, values and the query are all read that way,
// so the dot products pair the right dimensions; the output is put back in order at the
// end. A "wide" vector is 16 floats: one AVX-512 register, or two AVX2 registers holding
// the same lanes, so both builds do the same operations on the same lanes (same bits).
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "op.h"

#define MAX_HEAD_DIM 256
#define ITEMS_PER_THREAD 4  // work items per thread a forward's attention is split into, where rows allow

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

#define BLOCK 32  // dimensions per pair of wide vectors (32 bfloat16 = 64 bytes)
// A key's score sums its 16 lanes of products by one fixed tree (the key tree): s_i = l_i +
// l_i+8, t_i = s_i + s_i+4, u_i = t_i + t_i+2, then u_0 + u_1. sum_each follows it for
// KEY_GROUP keys at once, so a key's bits do not depend on the keys beside it.
#define KEY_GROUP 16  // keys whose dot products are summed together (sum_each)

#ifdef __AVX512F__
typedef __m512 wide;
// 32 bfloat16 -> lo: dims 0-3, 8-11, 16-19, 24-27; hi: dims 4-7, 12-15, 20-23, 28-31 (float32).
INLINE void load_block(const uint16_t *p, wide *lo, wide *hi) {
    const __m512i x = _mm512_loadu_si512(p), zero = _mm512_setzero_si512();
    *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, x));
    *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, x));
}
INLINE wide w_zero(void) { return _mm512_setzero_ps(); }
INLINE wide w_set1(float f) { return _mm512_set1_ps(f); }
INLINE wide w_mul(wide a, wide b) { return _mm512_mul_ps(a, b); }
INLINE wide w_fma(wide a, wide b, wide c) { return _mm512_fmadd_ps(a, b, c); }
// A block's lo and hi (load_block's lane order) -> its 32 dimensions in order, bfloat16:
// 4-dimension runs of lo and hi alternate (0-3 lo, 4-7 hi, 8-11 lo, ...).
INLINE void store_block(uint16_t *out, wide lo, wide hi) {
    const __m256i l = _mm512_cvtepi32_epi16(to_bf16_16(lo)), h = _mm512_cvtepi32_epi16(to_bf16_16(hi));
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
    _mm512_storeu_si512(out, _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), both));
}
// The sums of KEY_GROUP wide vectors, each by the key tree, four vectors' steps per
// instruction: each step adds the two halves of every vector's segment, and pairs of
// inputs share an output (segments of 8, 4, 2, then 1 lane). acc[k] -> sums[k].
INLINE void sum_each(const wide *acc, float *sums) {
    __m512 half[8], quarter[4], eighth[2];
    for (int i = 0; i < 8; i++)  // [key 2i lanes 0-7 + 8-15 | key 2i + 1 ...]
        half[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                                _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)  // 4-lane segments: keys 4i .. 4i + 3
        quarter[i] = _mm512_add_ps(_mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0x88),
                                   _mm512_shuffle_f32x4(half[2 * i], half[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)  // 2-lane segments: 128-bit lane g holds keys 8i + g, 8i + g + 4
        eighth[i] = _mm512_add_ps(_mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0x44),
                                  _mm512_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0xEE));
    const __m512 all = _mm512_add_ps(_mm512_shuffle_ps(eighth[0], eighth[1], 0x88),
                                     _mm512_shuffle_ps(eighth[0], eighth[1], 0xDD));  // lane 4g + s: key g + 4s
    _mm512_storeu_ps(sums, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), all));
}
#else
typedef struct { __m256 a, b; } wide;  // lanes 0-7, lanes 8-15
INLINE void load_block(const uint16_t *p, wide *lo, wide *hi) {
    const __m256i x0 = _mm256_loadu_si256((const __m256i *)p), x1 = _mm256_loadu_si256((const __m256i *)(p + 16));
    const __m256i zero = _mm256_setzero_si256();
    lo->a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x0));
    lo->b = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x1));
    hi->a = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x0));
    hi->b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x1));
}
INLINE wide w_zero(void) { return (wide){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
INLINE wide w_set1(float f) { return (wide){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
INLINE wide w_mul(wide x, wide y) { return (wide){_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
INLINE wide w_fma(wide x, wide y, wide z) { return (wide){_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
INLINE void store_block(uint16_t *out, wide lo, wide hi) {  // see the AVX-512 store_block
    const __m128i la = pack_bf16_8(lo.a), lb = pack_bf16_8(lo.b), ha = pack_bf16_8(hi.a), hb = pack_bf16_8(hi.b);
    _mm_storeu_si128((__m128i *)out, _mm_unpacklo_epi64(la, ha));
    _mm_storeu_si128((__m128i *)(out + 8), _mm_unpackhi_epi64(la, ha));
    _mm_storeu_si128((__m128i *)(out + 16), _mm_unpacklo_epi64(lb, hb));
    _mm_storeu_si128((__m128i *)(out + 24), _mm_unpackhi_epi64(lb, hb));
}
// The AVX-512 sum_each's steps on 8-lane vectors, eight keys per output.
INLINE void sum_each(const wide *acc, float *sums) {
    for (int k0 = 0; k0 < KEY_GROUP; k0 += 8) {
        __m256 quarter[4], eighth[2];
        for (int i = 0; i < 4; i++) {  // [key 2i: t | key 2i + 1: t], t_i = s_i + s_i+4
            const wide a = acc[k0 + 2 * i], b = acc[k0 + 2 * i + 1];
            const __m256 x = _mm256_add_ps(a.a, a.b), y = _mm256_add_ps(b.a, b.b);  // s: lanes 0-7 + lanes 8-15
            quarter[i] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
        }
        for (int i = 0; i < 2; i++)  // 128-bit lane g holds keys 4i + g, 4i + g + 2
            eighth[i] = _mm256_add_ps(_mm256_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0x44),
                                      _mm256_shuffle_ps(quarter[2 * i], quarter[2 * i + 1], 0xEE));
        const __m256 all = _mm256_add_ps(_mm256_shuffle_ps(eighth[0], eighth[1], 0x88),
                                         _mm256_shuffle_ps(eighth[0], eighth[1], 0xDD));  // lane 4g + s: key g + 2s
        _mm256_storeu_ps(sums + k0, _mm256_permutevar8x32_ps(all, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
}
#endif

// Where a row's keys live: the cache is [blocks][KVH][block_size][D] (one layer), and a
// sequence's position p is at offset p % block_size of block table[p / block_size]. A
// slot cache [slots][KVH][max_len][D] is the same thing with one block of max_len per
// sequence. The position's bits do not depend on which block holds it: every key is read
// and combined by the same operations in the same order, only its address differs.
typedef struct {
    const int32_t *table;  // the row's block table
    int block_size;        // positions per block
    size_t block_stride;   // elements per block: KVH * block_size * D
} paging;

// The positions a row sees: the run [first, len), then each of `extra` alone (in a draft
// tree: the row's ancestors and the row itself, ascending; none outside a tree). Keys are
// read and combined in that order, so a tree row sees the same keys in the same order as
// the chain row of its path does, and gets the same bits.
typedef struct {
    int first, len;        // the contiguous run
    const int32_t *extra;  // then these positions
    int num_extra;
} key_runs;

// Position p's D values of a head's keys or values (head: the cache plus the head's offset).
INLINE const uint16_t *at_position(const uint16_t *head, paging pg, int p, int D) {
    return head + (size_t)pg.table[p / pg.block_size] * pg.block_stride + (size_t)(p % pg.block_size) * D;
}

// The 16 lanes of products of a query (qlo, qhi: load_block's halves of each block) with
// one key, which the key tree sums: from the key's bfloat16 values ...
INLINE wide key_products(const wide *qlo, const wide *qhi, int blocks, const uint16_t *k) {
    wide lo, hi;
    load_block(k, &lo, &hi);
    wide acc = w_fma(qhi[0], hi, w_mul(qlo[0], lo));
    for (int b = 1; b < blocks; b++) {
        load_block(k + BLOCK * b, &lo, &hi);
        acc = w_fma(qhi[b], hi, w_fma(qlo[b], lo, acc));
    }
    return acc;
}

// The segments (see the top of the file): one of 64 keys holds a row's heads' queries, its
// keys and values in L1 together (8 + 8 KiB at D = 64), and splits a one-token step's 200
// keys into 4 items for each key/value head.
#define SEGMENT 64
#define MAX_QUERIES 64  // query vectors (rows x heads) an item scores together
#define MAX_ITEM_HEADS 16  // query heads of one row in an item (a larger group is split)
#define MAX_GROUP_ROWS 8  // rows of one sequence an item scores together (16: their sums spilled out of L1)
// One (segment, query) partial: o [D] in load_block's lanes, then m and l; 64-byte aligned.
#define PARTIAL(D) ((D) + 16)

// A query vector of a segment's item: one head of one row.
typedef struct {
    const uint16_t *q;  // its D bfloat16 values
    int n;              // how many of the segment's keys it sees (the first n)
    float *part;        // its partial (PARTIAL)
} query;

// KEY_GROUP keys' products -> the first `count` scores: scale * (q . k), soft-capped where
// softcap > 0. sum_each adds each key's lanes by the key tree: the same bits as a
// reduction per key, without one.
INLINE void finish_scores(const wide *acc, int count, float scale, float softcap, float *scores) {
    float sums[KEY_GROUP];
    sum_each(acc, sums);
    for (int i = 0; i < KEY_GROUP; i += 8) {
        _mm256_storeu_ps(sums + i, _mm256_mul_ps(_mm256_loadu_ps(sums + i), _mm256_set1_ps(scale)));
        if (softcap > 0.0f)
            for (int l = 0; l < 8; l++) sums[i + l] = softcap * tanhf(sums[i + l] / softcap);
    }
    memcpy(scores, sums, sizeof(float) * (size_t)count);
}

// The next segment's keys and values, fetched to L2 a key at a time while this segment's
// are scored: an item of many rows reads from memory, and a burst of a whole segment's
// prefetches at its start left the loads waiting behind them. Against that burst
// (benchmarks/attention_ab.py, 80 shuffled rounds, Zen 3): the attention's time at 200
// cached keys x 16 / 8 sequences 0.87x / 0.83x, at 800 keys x 8 sequences 0.73x.
// There is a next segment only after a full one (its row with the most keys sees all
// SEGMENT of this one's), so scoring this segment's keys fetches every one of the next's.
// Where nothing fetched a segment ahead (the first of an item, or each segment that is an
// item of its own, as in a one-token step), its own keys and values are fetched to L1
// while it is scored: the keys KEYS_AHEAD ahead of the one being scored, and each value
// beside its key (the values are read once the scores are done).
#define KEYS_AHEAD 4
typedef struct {
    const uint16_t *const *key, *const *val;
    int n;  // 0: nothing ahead
    const uint16_t *const *now_key, *const *now_val;  // this segment's
    int now_n;
} ahead;

// A position's 2 * D bytes (keys or values) to L1 (T0) or L2 (T1); the branch keeps
// _mm_prefetch's hint a constant.
INLINE void fetch_lines(const uint16_t *p, int D, int hint) {
    for (int line = 0; line < 2 * D; line += 64) {
        if (hint == _MM_HINT_T0) _mm_prefetch((const char *)p + line, _MM_HINT_T0);
        else _mm_prefetch((const char *)p + line, _MM_HINT_T1);
    }
}

INLINE void fetch_ahead(ahead next, int i, int D) {
    if (i + KEYS_AHEAD < next.now_n) fetch_lines(next.now_key[i + KEYS_AHEAD], D, _MM_HINT_T0);
    if (i < next.now_n) fetch_lines(next.now_val[i], D, _MM_HINT_T0);
    if (i >= next.n) return;
    fetch_lines(next.key[i], D, _MM_HINT_T1);
    fetch_lines(next.val[i], D, _MM_HINT_T1);
}

// The scores of the first `n` keys (key[i]: its bfloat16 values) for each of `count` queries,
// query i's into scores + i * SEGMENT. Each key is unpacked once, block by block, for all
// the queries; a query's products are key_products' operations. A short last group repeats
// the first key. work: count * (2 * D / BLOCK + KEY_GROUP) wide vectors.
static void score_keys(const query *qs, int count, int D, const uint16_t *const *key, int n, float scale,
                       float softcap, float *scores, wide *work, ahead next) {
    const int blocks = D / BLOCK;
    wide *qv = work, *acc = work + (size_t)count * 2 * blocks;  // [count][blocks][lo, hi], [count][KEY_GROUP]
    if (count == 1) {  // one query: its halves in registers (key_products)
        wide qlo[MAX_HEAD_DIM / BLOCK], qhi[MAX_HEAD_DIM / BLOCK];
        for (int b = 0; b < blocks; b++) load_block(qs[0].q + BLOCK * b, &qlo[b], &qhi[b]);
        for (int g = 0; g < n; g += KEY_GROUP) {
            for (int k = 0; k < KEY_GROUP; k++) {
                fetch_ahead(next, g + k, D);
                acc[k] = key_products(qlo, qhi, blocks, key[g + k < n ? g + k : 0]);
            }
            finish_scores(acc, n - g < KEY_GROUP ? n - g : KEY_GROUP, scale, softcap, scores + g);
        }
        return;
    }
    for (int i = 0; i < count; i++)
        for (int b = 0; b < blocks; b++) load_block(qs[i].q + BLOCK * b, &qv[(i * blocks + b) * 2], &qv[(i * blocks + b) * 2 + 1]);
    for (int g = 0; g < n; g += KEY_GROUP) {
        for (int k = 0; k < KEY_GROUP; k++) {
            const uint16_t *keyk = key[g + k < n ? g + k : 0];
            fetch_ahead(next, g + k, D);
            wide lo, hi;
            load_block(keyk, &lo, &hi);
            for (int i = 0; i < count; i++)
                acc[i * KEY_GROUP + k] = w_fma(qv[i * blocks * 2 + 1], hi, w_mul(qv[i * blocks * 2], lo));
            for (int b = 1; b < blocks; b++) {
                load_block(keyk + BLOCK * b, &lo, &hi);
                for (int i = 0; i < count; i++) {
                    const wide *q = &qv[(i * blocks + b) * 2];
                    acc[i * KEY_GROUP + k] = w_fma(q[1], hi, w_fma(q[0], lo, acc[i * KEY_GROUP + k]));
                }
            }
        }
        for (int i = 0; i < count; i++)
            finish_scores(&acc[i * KEY_GROUP], n - g < KEY_GROUP ? n - g : KEY_GROUP, scale, softcap,
                          scores + (size_t)i * SEGMENT + g);
    }
}

// The largest of scores[0 .. n) (a NaN is passed over; -inf where all are NaN).
static float max_score(const float *scores, int n) {
    __m256 top = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) top = _mm256_max_ps(_mm256_loadu_ps(scores + j), top);  // a NaN lane keeps top
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, top);
    for (int i = 0; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    for (; j < n; j++) m = scores[j] > m ? scores[j] : m;
    return m;
}

// The keys' weights exp(score - max) in place, and their sum.
static float softmax_weights(float *scores, int count, float maximum) {
    __m256 top = _mm256_set1_ps(maximum), total = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= count; j += 8) {
        __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(scores + j), top));
        _mm256_storeu_ps(scores + j, p);
        total = _mm256_add_ps(total, p);
    }
    float sum = hsum(total);
    if (j < count) {  // the last partial block, padded with -inf (exp = 0)
        float tail[8];
        for (int i = 0; i < 8; i++) tail[i] = j + i < count ? scores[j + i] : -INFINITY;
        __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(tail), top));
        p = _mm256_and_ps(p, _mm256_cmp_ps(_mm256_loadu_ps(tail), _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ));
        _mm256_storeu_ps(tail, p);
        for (int i = 0; j + i < count; i++) scores[j + i] = tail[i];
        sum += hsum(p);
    }
    return sum;
}

#define VALUE_HEADS 3  // queries whose value sums one pass over a segment's values keeps in registers

// Queries qs[0 .. heads) (at most VALUE_HEADS, each seeing the segment's first n keys): o +=
// sum_i weight_i v_i over blocks b .. b + nb of the dimensions (nb 1, or 2 for one query),
// the values in order, into their partials (load_block's lanes); weights: query i's at
// weights + i * SEGMENT. Always inlined with constant heads and nb: the sums stay in
// registers. A lane's sum does not depend on which queries or blocks share a pass.
INLINE void weigh_blocks(const uint16_t *const *val, int n, const query *qs, int heads, int b, int nb,
                         const float *weights) {
    wide alo[VALUE_HEADS][2], ahi[VALUE_HEADS][2];
    for (int h = 0; h < heads; h++)
        for (int j = 0; j < nb; j++) alo[h][j] = ahi[h][j] = w_zero();
    for (int i = 0; i < n; i++)
        for (int j = 0; j < nb; j++) {
            wide lo, hi;
            load_block(val[i] + BLOCK * (b + j), &lo, &hi);
            for (int h = 0; h < heads; h++) {
                const wide w = w_set1(weights[(size_t)h * SEGMENT + i]);
                alo[h][j] = w_fma(w, lo, alo[h][j]);
                ahi[h][j] = w_fma(w, hi, ahi[h][j]);
            }
        }
    for (int h = 0; h < heads; h++)
        for (int j = 0; j < nb; j++) {
            wide *o = (wide *)qs[h].part + 2 * (b + j);
            o[0] = alo[h][j];
            o[1] = ahi[h][j];
        }
}

#ifndef __AVX512F__
// weigh_blocks for VALUE_HEADS queries and one block, in the AVX2 build: there a wide vector
// is two registers, and three queries' sums (12 registers) beside a block's four converted
// values, the weight and a zero spilled two sums to the stack, whose every step then waited
// on a store and a load (perf annotate: the loop's hottest instructions at 16 sequences).
// Here each 256-bit half of the block is its own pass over the values (6 sums in
// registers); a lane's sum is the same FMAs in the same order, so the same bits (checked
// against the one-pass build on 1-16 rows). benchmarks/attention_ab.py, 60 shuffled rounds:
// the attention at 200 keys x 8 / 16 sequences 0.78x / 0.95x the time, one row 0.95x.
INLINE void weigh_block_by_halves(const uint16_t *const *val, int n, const query *qs, int b, const float *weights) {
    const __m256i zero = _mm256_setzero_si256();
    for (int half = 0; half < 2; half++) {
        __m256 alo[VALUE_HEADS], ahi[VALUE_HEADS];
        for (int h = 0; h < VALUE_HEADS; h++) alo[h] = ahi[h] = _mm256_setzero_ps();
        for (int i = 0; i < n; i++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(val[i] + BLOCK * b + 16 * half));
            const __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x));
            const __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
            for (int h = 0; h < VALUE_HEADS; h++) {
                const __m256 w = _mm256_set1_ps(weights[(size_t)h * SEGMENT + i]);
                alo[h] = _mm256_fmadd_ps(w, lo, alo[h]);
                ahi[h] = _mm256_fmadd_ps(w, hi, ahi[h]);
            }
        }
        for (int h = 0; h < VALUE_HEADS; h++) {  // load_block's lanes: .a from the first half, .b the second
            wide *o = (wide *)qs[h].part + 2 * b;
            if (half) {
                o[0].b = alo[h];
                o[1].b = ahi[h];
            } else {
                o[0].a = alo[h];
                o[1].a = ahi[h];
            }
        }
    }
}
#endif

// One segment's partials for `count` queries that read its keys key[i] and values val[i]
// (each query the first qs[].n of them). Scratch: scores [count][SEGMENT], work (score_keys).
static void attend_segment(const query *qs, int count, const uint16_t *const *key, const uint16_t *const *val, int D,
                           float scale, float softcap, float *scores, wide *work, ahead next) {
    int n = 0;
    for (int i = 0; i < count; i++) n = qs[i].n > n ? qs[i].n : n;
    score_keys(qs, count, D, key, n, scale, softcap, scores, work, next);
    for (int i = 0; i < count; i++) {
        float *s = scores + (size_t)i * SEGMENT;
        const float m = max_score(s, qs[i].n);
        qs[i].part[D] = m;
        qs[i].part[D + 1] = softmax_weights(s, qs[i].n, m);
    }
    const int blocks = D / BLOCK;
    for (int i = 0; i < count;) {  // up to VALUE_HEADS queries that see as many keys
        const float *w = scores + (size_t)i * SEGMENT;
        int same = 1;
        while (same < VALUE_HEADS && i + same < count && qs[i + same].n == qs[i].n) same++;
        for (int b = 0; b < blocks;) {
            if (same == 1 && b + 1 < blocks) {  // one query: two blocks a pass
                weigh_blocks(val, qs[i].n, qs + i, 1, b, 2, w);
                b += 2;
                continue;
            }
#ifdef __AVX512F__
            if (same == 3) weigh_blocks(val, qs[i].n, qs + i, 3, b, 1, w);
#else
            if (same == 3) weigh_block_by_halves(val, qs[i].n, qs + i, b, w);
#endif
            else if (same == 2) weigh_blocks(val, qs[i].n, qs + i, 2, b, 1, w);
            else weigh_blocks(val, qs[i].n, qs + i, 1, b, 1, w);
            b += 1;
        }
        i += same;
    }
}

// A query's output from its `segments` partials (seg floats apart): each segment's sums
// scaled by exp(m_s - M), M the largest m, and added in segment order; out = o * (1 / l)
// in bfloat16. One segment gives its own o * (1 / l): exp(0) is 1.
static void combine(const float *part, int segments, size_t seg, int D, uint16_t *out) {
    float top = -INFINITY;
    for (int s = 0; s < segments; s++) top = part[s * seg + D] > top ? part[s * seg + D] : top;
    const int blocks = D / BLOCK;
    wide o[2 * (MAX_HEAD_DIM / BLOCK)];
    for (int v = 0; v < 2 * blocks; v++) o[v] = w_zero();
    float total = 0.0f;
    for (int s = 0; s < segments; s++) {
        const float *p = part + s * seg;
        float scales[8];
        _mm256_storeu_ps(scales, exp_nonpositive(_mm256_set1_ps(p[D] - top)));
        total += scales[0] * p[D + 1];
        const wide w = w_set1(scales[0]), *os = (const wide *)p;
        for (int v = 0; v < 2 * blocks; v++) o[v] = w_fma(w, os[v], o[v]);
    }
    const wide inverse = w_set1(1.0f / total);
    for (int b = 0; b < blocks; b++) store_block(out + BLOCK * b, w_mul(o[2 * b], inverse), w_mul(o[2 * b + 1], inverse));
}

// The block table of query row t: tables[row_seq[t]] (a table is table_width entries), or
// with row_seq NULL, row t's own one-entry table tables[t] (a slot cache).
INLINE const int32_t *row_table(const int32_t *tables, int table_width, const int32_t *row_seq, int t) {
    return tables + (size_t)(row_seq ? row_seq[t] : t) * table_width;
}

// A draft tree's rows (all NULL outside a tree): row t is at position pos[t] (its RoPE
// position; NULL: row_len[t] - 1) and sees, after [0, row_len[t]), the positions
// extra[extra_start[t] .. extra_start[t + 1]) (NULL: none), the last of which holds its
// own key and value. A tree's nodes sit at consecutive cache positions after the fed
// prefix while their RoPE positions are their depths, so siblings share a position.
typedef struct {
    const int32_t *pos, *extra_start, *extra;
} tree_rows;

INLINE int row_position(tree_rows tree, const int32_t *row_len, int t) {
    return tree.pos ? tree.pos[t] : row_len[t] - 1;
}

// Where row t's key and value go: its last extra position, else row_len[t] - 1.
INLINE int row_place(tree_rows tree, const int32_t *row_len, int t) {
    if (tree.extra_start && tree.extra_start[t + 1] > tree.extra_start[t]) return tree.extra[tree.extra_start[t + 1] - 1];
    return row_len[t] - 1;
}

// The keys row t sees: [first, len), then its tree extras, where first = pos + 1 - window
// with a window (window > 0) shorter than pos + 1, else 0.
INLINE key_runs row_runs(tree_rows tree, const int32_t *row_len, int t, int window) {
    const int len = row_len[t], seen = row_position(tree, row_len, t) + 1;
    const int first = window > 0 && seen > window ? (seen - window < len ? seen - window : len) : 0;
    const int extra_first = tree.extra_start ? tree.extra_start[t] : 0;
    return (key_runs){first, len, tree.extra_start ? tree.extra + extra_first : NULL,
                      tree.extra_start ? tree.extra_start[t + 1] - extra_first : 0};
}

// The row's j-th key: [first, len) in order, then its extras.
INLINE int key_position(key_runs k, int j) {
    const int run = k.len - k.first;
    return j < run ? k.first + j : k.extra[j - run];
}

INLINE int row_keys(key_runs k) { return k.len - k.first + k.num_extra; }
INLINE int segments_of(int keys) { return (keys + SEGMENT - 1) / SEGMENT; }

// Consecutive rows of one sequence whose j-th keys are the same positions (no tree, the same
// first key): a verify round's rows, a prompt's chunk. An item scores them together.
typedef struct {
    int row, rows;  // rows [row, row + rows)
    int longest;    // its row with the most keys: its positions cover every row's
    int segments;   // of that row
} row_group;

// Scratch kept between calls, one per thread (the kernel runs at every layer of every step).
typedef struct {
    void *p;
    size_t bytes;
} scratch;
static void *grow(scratch *s, size_t bytes) {
    if (s->bytes < bytes) {
        free(s->p);
        bytes = (bytes + 63) / 64 * 64;
        s->p = aligned_alloc(64, bytes);
        s->bytes = s->p ? bytes : 0;
    }
    return s->p;
}
static __thread scratch thread_scores, thread_work, thread_partials, caller_groups, caller_partials;

// What the caller of attend_rows() works out before its threads start: the row groups, and
// where they are few (fewer than ITEMS_PER_THREAD per thread for each key/value head) the
// partials' buffer, [T][H][segments][PARTIAL(D)], through which each segment is an item.
typedef struct {
    const row_group *groups;
    int count;
    float *partials;  // NULL: each item takes all of its rows' segments
    int segments;     // of the row with the most keys
} row_plan;

static row_plan plan_rows(const int32_t *tables, int table_width, const int32_t *row_seq, const int32_t *row_len,
                          tree_rows tree, int T, int H, int KVH, int D, int window) {
    row_plan plan = {NULL, 0, NULL, 0};
    if (T <= 0) return plan;
    row_group *groups = grow(&caller_groups, sizeof(row_group) * (size_t)T);
    const int alone = tree.pos != NULL || tree.extra_start != NULL;
    for (int t = 0; t < T; t++) {
        const key_runs runs = row_runs(tree, row_len, t, window);
        const int keys = row_keys(runs);
        row_group *last = plan.count ? &groups[plan.count - 1] : NULL;
        if (last && !alone && last->rows < MAX_GROUP_ROWS &&
            row_table(tables, table_width, row_seq, t) == row_table(tables, table_width, row_seq, last->row) &&
            runs.first == row_runs(tree, row_len, last->row, window).first) {
            last->rows++;
            if (keys > row_keys(row_runs(tree, row_len, last->longest, window))) {
                last->longest = t;
                last->segments = segments_of(keys);
            }
        } else {
            groups[plan.count++] = (row_group){t, 1, t, segments_of(keys)};
        }
    }
    plan.groups = groups;
    for (int g = 0; g < plan.count; g++) plan.segments = groups[g].segments > plan.segments ? groups[g].segments : plan.segments;
    if (plan.segments > 1 && plan.count * KVH < ITEMS_PER_THREAD * omp_get_max_threads()) {
        plan.partials = grow(&caller_partials, sizeof(float) * (size_t)T * H * plan.segments * PARTIAL(D));
    }
    return plan;
}

// The addresses of segment r's keys and values (k_head, v_head: the cache plus the head's
// offset): a block's positions one after another, one division a block.
static int segment_addresses(key_runs runs, paging pg, int r, int D, const uint16_t *k_head, const uint16_t *v_head,
                             const uint16_t **key, const uint16_t **val) {
    const int j0 = r * SEGMENT, keys = row_keys(runs), n = keys - j0 < SEGMENT ? keys - j0 : SEGMENT;
    const int run = runs.len - runs.first;  // keys j < run are positions first + j
    int i = 0;
    while (i < n && j0 + i < run) {
        const int p = runs.first + j0 + i, offset = p % pg.block_size;
        const size_t base = (size_t)pg.table[p / pg.block_size] * pg.block_stride;
        for (int o = offset; o < pg.block_size && i < n && j0 + i < run; o++, i++) {
            key[i] = k_head + base + (size_t)o * D;
            val[i] = v_head + base + (size_t)o * D;
        }
    }
    for (; i < n; i++) {  // a tree row's extras
        const int p = key_position(runs, j0 + i);
        key[i] = at_position(k_head, pg, p, D);
        val[i] = at_position(v_head, pg, p, D);
    }
    return n;
}

// Where query (t, h) of an item writes its segment r's partial: base + (t - the group's
// first row) * row + (h - the item's first head) * head + r * PARTIAL(D) floats.
typedef struct {
    float *base;
    size_t row, head;
} partial_place;

// Segment r of a row group's heads h0 .. h0 + heads (of the key/value head at k_head,
// v_head): its queries' partials; with prefetch, the next segment's keys and values are
// fetched to L2 while this one's keys are scored (many rows: the item's next reads).
static void attend_piece(const uint16_t *q, int H, row_group rg, int h0, int heads, int r, key_runs runs, paging pg,
                         const uint16_t *k_head, const uint16_t *v_head, const int32_t *row_len, tree_rows tree,
                         int window, int D, float scale, float softcap, partial_place place, int prefetch, float *scores,
                         wide *work) {
    query qs[MAX_QUERIES];
    int count = 0;
    for (int t = rg.row; t < rg.row + rg.rows; t++) {
        const int n = row_keys(row_runs(tree, row_len, t, window)) - r * SEGMENT;
        if (n <= 0) continue;
        for (int h = h0; h < h0 + heads; h++)
            qs[count++] = (query){q + ((size_t)t * H + h) * D, n < SEGMENT ? n : SEGMENT,
                                  place.base + (size_t)(t - rg.row) * place.row + (size_t)(h - h0) * place.head +
                                      (size_t)r * PARTIAL(D)};
    }
    const uint16_t *key[SEGMENT], *val[SEGMENT], *next_key[SEGMENT], *next_val[SEGMENT];
    const int n = segment_addresses(runs, pg, r, D, k_head, v_head, key, val);
    // This segment's own reads to L1 where no earlier segment fetched them to L2: the
    // first segment, or every segment of an item of its own (without prefetch).
    const int own = !prefetch || r == 0;
    ahead next = {next_key, next_val, 0, key, val, own ? n : 0};
    if (prefetch && r + 1 < rg.segments) next.n = segment_addresses(runs, pg, r + 1, D, k_head, v_head, next_key, next_val);
    attend_segment(qs, count, key, val, D, scale, softcap, scores, work, next);
}

// The attention of every (query row, head) over the cache: q [T][H][D]. A work item is a
// row group's heads of one key/value head (or a part of them, where items would be fewer
// than ITEMS_PER_THREAD per thread), and with the plan's partials one segment of them;
// where row groups alone are that many, an item takes all of a group's key/value heads,
// segment by segment, so that it reads each segment's blocks (every head's keys side by
// side) one after another. The bits are the same whichever.
static void attend_rows(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *tables,
                        int table_width, const int32_t *row_seq, const int32_t *row_len, tree_rows tree,
                        uint16_t *out, int T, int H, int KVH, int D, int block_size, float scale, int window,
                        float softcap, row_plan plan) {
    if (T <= 0) return;  // every thread of the region returns: no barrier waits
    const int group = H / KVH, blocks = D / BLOCK;
    const size_t head_stride = (size_t)block_size * D, partial = PARTIAL(D);
    const int threads = omp_get_num_threads(), wanted = ITEMS_PER_THREAD * threads, few = plan.partials != NULL;
    const int pieces = plan.count * KVH * (few ? plan.segments : 1), split = (wanted + pieces - 1) / pieces;
    int most_rows = 1;
    for (int g = 0; g < plan.count; g++) most_rows = plan.groups[g].rows > most_rows ? plan.groups[g].rows : most_rows;
    int per = group / (split > 1 ? split : 1);  // heads of a row in a piece
    per = per < 1 ? 1 : per > MAX_ITEM_HEADS ? MAX_ITEM_HEADS : per;
    while (per > 1 && per * most_rows > MAX_QUERIES) per--;
    const int parts = (group + per - 1) / per, subs = KVH * parts;  // (key/value head, part) pieces of a row group
    const int whole = !few && plan.count >= wanted;  // an item takes all of a row group's pieces
    const int max_queries = per * most_rows;  // <= MAX_QUERIES: MAX_ITEM_HEADS * MAX_GROUP_ROWS may not be
    float *scores = grow(&thread_scores, sizeof(float) * (size_t)max_queries * SEGMENT);
    wide *work = grow(&thread_work, sizeof(wide) * (size_t)max_queries * (2 * blocks + KEY_GROUP));
    #pragma omp for schedule(dynamic, 1)
    for (int item = 0; item < (whole ? plan.count : pieces * parts); item++) {
        const int s = few ? item % plan.segments : 0, rest = few ? item / plan.segments : item;
        const row_group rg = plan.groups[whole ? item : rest / subs];
        if (s >= rg.segments) continue;
        const int first_sub = whole ? 0 : rest % subs, last_sub = whole ? subs : first_sub + 1;
        const key_runs runs = row_runs(tree, row_len, rg.longest, window);
        const paging pg = {row_table(tables, table_width, row_seq, rg.longest), block_size, (size_t)KVH * head_stride};
        // Without the plan's partials, the item's own: [piece][row][head][segment].
        const size_t own_piece = (size_t)rg.rows * per * rg.segments * partial;
        float *own = few ? NULL : grow(&thread_partials, sizeof(float) * own_piece * (size_t)(last_sub - first_sub));
        for (int r = few ? s : 0; r < (few ? s + 1 : rg.segments); r++)
            for (int sub = first_sub; sub < last_sub; sub++) {
                const int g = sub / parts, part = sub % parts;
                const int h0 = g * group + part * per, heads = group - part * per < per ? group - part * per : per;
                const partial_place place = few ? (partial_place){plan.partials + ((size_t)rg.row * H + h0) * plan.segments * partial,
                                                                  (size_t)H * plan.segments * partial, plan.segments * partial}
                                                : (partial_place){own + (size_t)(sub - first_sub) * own_piece,
                                                                  (size_t)heads * rg.segments * partial, rg.segments * partial};
                attend_piece(q, H, rg, h0, heads, r, runs, pg, k_cache + (size_t)g * head_stride,
                             v_cache + (size_t)g * head_stride, row_len, tree, window, D, scale, softcap, place, !few,
                             scores, work);
            }
        if (few) continue;
        for (int sub = first_sub; sub < last_sub; sub++) {
            const int g = sub / parts, part = sub % parts;
            const int h0 = g * group + part * per, heads = group - part * per < per ? group - part * per : per;
            const float *piece = own + (size_t)(sub - first_sub) * own_piece;
            for (int t = rg.row; t < rg.row + rg.rows; t++) {
                const int segments = segments_of(row_keys(row_runs(tree, row_len, t, window)));
                for (int h = h0; h < h0 + heads; h++)
                    combine(piece + ((size_t)(t - rg.row) * heads + (h - h0)) * rg.segments * partial, segments, partial, D,
                            out + ((size_t)t * H + h) * D);
            }
        }
    }
    if (!few) return;
    #pragma omp for schedule(static)
    for (int th = 0; th < T * H; th++)
        combine(plan.partials + (size_t)th * plan.segments * partial,
                segments_of(row_keys(row_runs(tree, row_len, th / H, window))), partial, D, out + (size_t)th * D);
}

// q: [T][H][D] bfloat16; k_cache, v_cache: one layer's [blocks][KVH][block_size][D]
// bfloat16; tables [sequences][table_width] int32: each sequence's block table; row_seq[t]
// the sequence of query t, row_len[t] how many keys it sees (its position + 1, at most
// table_width * block_size). out: [T][H][D] bfloat16. D % 32 == 0, D <= 256, H % KVH == 0
// (checked by the caller). window: keys a row sees, its own included (a sliding-window
// layer; 0: all). softcap: the scores' soft cap (0: none). row_pos, extra_start, extra: a
// draft tree's rows (tree_rows; all NULL outside a tree).
void paged_attention(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *tables,
                     int table_width, const int32_t *row_seq, const int32_t *row_len, const int32_t *row_pos,
                     const int32_t *extra_start, const int32_t *extra, uint16_t *out, int T, int H, int KVH, int D,
                     int block_size, float scale, int window, float softcap) {
    const tree_rows tree = {row_pos, extra_start, extra};
    const row_plan plan = plan_rows(tables, table_width, row_seq, row_len, tree, T, H, KVH, D, window);
    #pragma omp parallel
    attend_rows(q, k_cache, v_cache, tables, table_width, row_seq, row_len, tree, out, T, H, KVH, D, block_size, scale,
                window, softcap, plan);
}

// paged_attention on a slot cache [slots][KVH][max_len][D]: row_slot[t] is query t's slot.
void attention(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache, const int32_t *row_slot,
               const int32_t *row_len, uint16_t *out, int T, int H, int KVH, int D, int max_len, float scale,
               int window, float softcap) {
    paged_attention(q, k_cache, v_cache, row_slot, 1, NULL, row_len, NULL, NULL, NULL, out, T, H, KVH, D, max_len, scale,
                    window, softcap);
}

// RoPE in the rotate-half layout on one head, in bfloat16 as torch computes llama.py's
// _rotate on bfloat16 tensors: y = bf16(bf16(x * cos) + roll(x, D/2) * signed_sin). The
// product of two bfloat16 values is exact in float32, so a fused or a separate multiply-add
// rounds alike: these are the bits of the torch ops this replaces.
static void rotate_head(const uint16_t *x, const uint16_t *cos, const uint16_t *signed_sin, int D, uint16_t *y) {
    const int half = D / 2;  // a multiple of 16 (D % 32 == 0): 8-float steps never straddle it
    for (int i = 0; i < D; i += 8) {
        const __m256 rolled = load_bf16(x + (i < half ? i + half : i - half));
        const __m256 a = round_bf16_8(_mm256_mul_ps(load_bf16(x + i), load_bf16(cos + i)));
        store_bf16(y + i, _mm256_add_ps(a, _mm256_mul_ps(rolled, load_bf16(signed_sin + i))));
    }
}

// One layer's attention straight from its fused projection: qkv [T][(H + 2 KVH) D]
// bfloat16 (query heads, key heads, value heads). Rotates the queries into q_out [T][H][D]
// and the keys, at each row's position (row_len[t] - 1, or a tree row's pos and place),
// into the cache beside the values (through the row's block table), then attends as
// paged_attention() does (window, softcap, tree rows). cos, signed_sin: [positions][D]
// bfloat16 tables.
// Why fused: in a one-token step the RoPE, the split, the copies and the two cache writes
// were ~6 torch ops per layer, each mostly dispatch on a 2-core CPU.
void paged_rope_write_attention(const uint16_t *qkv, const uint16_t *cos, const uint16_t *signed_sin,
                                uint16_t *k_cache, uint16_t *v_cache, const int32_t *tables, int table_width,
                                const int32_t *row_seq, const int32_t *row_len, const int32_t *row_pos,
                                const int32_t *extra_start, const int32_t *extra, uint16_t *q_out, uint16_t *out, int T,
                                int H, int KVH, int D, int block_size, float scale, int window, float softcap) {
    const tree_rows tree = {row_pos, extra_start, extra};
    const size_t head_stride = (size_t)block_size * D, block_stride = (size_t)KVH * head_stride;
    const int width = (H + 2 * KVH) * D;
    const row_plan plan = plan_rows(tables, table_width, row_seq, row_len, tree, T, H, KVH, D, window);
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            const uint16_t *row = qkv + (size_t)t * width;
            const int position = row_position(tree, row_len, t), slot = row_place(tree, row_len, t);
            const uint16_t *c = cos + (size_t)position * D, *s = signed_sin + (size_t)position * D;
            const int32_t *table = row_table(tables, table_width, row_seq, t);
            const size_t place = (size_t)table[slot / block_size] * block_stride + (size_t)(slot % block_size) * D;
            for (int h = 0; h < H; h++) rotate_head(row + h * D, c, s, D, q_out + ((size_t)t * H + h) * D);
            for (int h = 0; h < KVH; h++) {
                const size_t at = place + (size_t)h * head_stride;
                rotate_head(row + (H + h) * D, c, s, D, k_cache + at);
                memcpy(v_cache + at, row + (H + KVH + h) * D, sizeof(uint16_t) * D);
            }
        }  // the implicit barrier: every row's keys are in the cache before any row attends
        attend_rows(q_out, k_cache, v_cache, tables, table_width, row_seq, row_len, tree, out, T, H, KVH, D, block_size,
                    scale, window, softcap, plan);
    }
}

// paged_rope_write_attention on a slot cache [slots][KVH][max_len][D] (the MTP drafter's).
void rope_write_attention(const uint16_t *qkv, const uint16_t *cos, const uint16_t *signed_sin, uint16_t *k_cache,
                          uint16_t *v_cache, const int32_t *row_slot, const int32_t *row_len, uint16_t *q_out,
                          uint16_t *out, int T, int H, int KVH, int D, int max_len, float scale, int window,
                          float softcap) {
    paged_rope_write_attention(qkv, cos, signed_sin, k_cache, v_cache, row_slot, 1, NULL, row_len, NULL, NULL, NULL, q_out,
                               out, T, H, KVH, D, max_len, scale, window, softcap);
}

// paged_rope_write_attention with op.h's arguments, in its order: qkv, cos, signed_sin,
// k_cache, v_cache, tables, table_width, row_seq, row_len, row_pos, extra_start, extra, q_out,
// out, T, H, KVH, D, block_size, scale, window, softcap.
void paged_rope_write_attention_op(const int64_t *a) {
    paged_rope_write_attention(OP_PTR(a[0]), OP_PTR(a[1]), OP_PTR(a[2]), OP_PTR(a[3]), OP_PTR(a[4]), OP_PTR(a[5]), (int)a[6],
                               OP_PTR(a[7]), OP_PTR(a[8]), OP_PTR(a[9]), OP_PTR(a[10]), OP_PTR(a[11]), OP_PTR(a[12]),
                               OP_PTR(a[13]), (int)a[14], (int)a[15], (int)a[16], (int)a[17], (int)a[18], op_float(a[19]),
                               (int)a[20], op_float(a[21]));
}
