// The int4 weight layout's shared pieces (included by int4_x86.c and int4_amx.c).
//
// packed: [N/16][K/2][16] bytes, byte j of pair p = q[n0+j][2p] | q[n0+j][2p+1] << 4;
// scale, minimum: [N/16][K/32][16] float16. See int4_x86.c for the arithmetic.
#ifndef SPECLANE_Q4_H
#define SPECLANE_Q4_H

#include <pthread.h>
#include <stdlib.h>

#include "bf16.h"

// The sum of 32 bfloat16 inputs in one fixed order (the same code in every build):
// x[i] + x[i+16], then halves folded 8, 4, 2, 1.
INLINE float group_sum(const uint16_t *x) {
    const __m256 c = _mm256_add_ps(_mm256_add_ps(load_bf16(x), load_bf16(x + 16)),
                                   _mm256_add_ps(load_bf16(x + 8), load_bf16(x + 24)));
    const __m128 d = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    const __m128 e = _mm_add_ps(d, _mm_movehl_ps(d, d));
    return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

// A call's scratch (the inputs' group sums, and what else a kernel keeps per row) lives in
// a buffer of the calling thread's that grows to the largest call and is kept: a prefill's calls would otherwise each map and fault in a fresh ~0.5 MB, and
// a one-row call would pay an allocation that is a good part of its own cost. A thread's
// buffer is freed when the thread exits (a thread-specific key's destructor).
typedef struct {
    float *data;
    size_t floats;
} input_buffer;

static pthread_key_t buffer_key;
static pthread_once_t buffer_key_once = PTHREAD_ONCE_INIT;

static void free_buffer(void *p) {
    input_buffer *buffer = p;
    free(buffer->data);
    free(buffer);
}

static void create_buffer_key(void) {
    if (pthread_key_create(&buffer_key, free_buffer)) abort();
}

// Out of memory for a few MB aborts: the process could not go on anyway, and this call
// has no way to report it.
static float *input_buffer_for(size_t floats) {
    pthread_once(&buffer_key_once, create_buffer_key);
    input_buffer *buffer = pthread_getspecific(buffer_key);
    if (!buffer) {
        if (!(buffer = calloc(1, sizeof *buffer)) || pthread_setspecific(buffer_key, buffer)) abort();
    }
    if (floats > buffer->floats) {
        free(buffer->data);
        buffer->floats = (floats + 15) / 16 * 16;
        if (!(buffer->data = aligned_alloc(64, buffer->floats * sizeof(float)))) abort();
    }
    return buffer->data;
}

#ifdef __AVX512BF16__
// 0..15 as bfloat16 (exact), twice: vpermw reads an index's low 5 bits (see unpack_pair).
static const uint16_t Q_BF16[32] __attribute__((aligned(64))) = {
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
    0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
INLINE __m512i unpack_pair_bf16(const uint8_t *bytes) {
    // Byte b = q0 | q1 << 4 in each lane; b | b << 12 holds q1 in its high word and q0 (with
    // q1's low bit above it, at bit 4: hence the table's second copy) in its low word.
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
    return _mm512_permutexvar_epi16(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)), _mm512_load_si512(Q_BF16));
}
#endif

#endif
