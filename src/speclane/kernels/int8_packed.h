// The int8-group kernel's weights in fewer bits (included by int8_entry.h, so by every int8
// kernel file). A weight whose integers fit 5 or 6 bits (GGUF's Q5_0, Q5_1, Q5_K: 5; Q6_K:
// 6) keeps them so in memory instead of one byte each: a one-token step reads 5.5 or 6.5
// bits a weight with its scales instead of 8.5, and the model's resident memory stays near
// its file's. The kernels decode a tile's pair of input columns to the int8 layout's 32
// bytes in registers, and from there every path is the int8 one: the same bits.
//
// A weight's format (int8_cpu.pack): bits | (signed << 4); bits 8 is the int8 layout, 5 or
// 6 this one. A stored value is u = q + bias (bias 2^(bits-1) where signed, else 0), in
// 0 .. 2^bits - 1. Per column tile of 16 output columns, per pair p of input columns (2p,
// 2p + 1), PAIR_BYTES(bits) bytes: 16 bytes of low nibbles (byte j: column j's u at input
// 2p in bits 0-3, at input 2p + 1 in bits 4-7), then bits - 4 planes of 32 bits (plane h,
// bit i: bit 4 + h of value i of the pair, values in the int8 layout's order: input 2p's
// 16 columns, then input 2p + 1's).
#ifndef SPECLANE_INT8_PACKED_H
#define SPECLANE_INT8_PACKED_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define FORMAT_BITS(format) ((format) & 15)
#define FORMAT_BIAS(format) ((format) & 16 ? 1 << (FORMAT_BITS(format) - 1) : 0)
#define PAIR_BYTES(bits) (16 + 4 * ((bits) - 4))

// Bytes of one column tile of K inputs: 16 bytes an input in the int8 layout.
static inline size_t tile_bytes(int format, int K) {
    return FORMAT_BITS(format) == 8 ? (size_t)K * 16 : (size_t)(K / 2) * PAIR_BYTES(FORMAT_BITS(format));
}

// Byte i of the result: 0xFF where bit i of ``word`` is set, else 0.
static inline __m256i expand_bits(uint32_t word) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)word), pick);  // per 128-bit lane: bytes 0-1, 2-3
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
}

// A pair's 32 values as int8, in the int8 layout's order (input 2p's 16 columns, then
// input 2p + 1's), from its PAIR_BYTES at ``pair``.
static inline __m256i decode_pair(const uint8_t *pair, int bits, int bias) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)pair), low = _mm_set1_epi8(15);
    __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
    for (int h = 0; h < bits - 4; h++) {
        uint32_t plane;
        memcpy(&plane, pair + 16 + 4 * h, sizeof plane);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        v = _mm256_mask_add_epi8(v, (__mmask32)plane, v, _mm256_set1_epi8((char)(16 << h)));  // the plane as a byte mask
#else
        v = _mm256_or_si256(v, _mm256_and_si256(expand_bits(plane), _mm256_set1_epi8((char)(16 << h))));
#endif
    }
    return _mm256_sub_epi8(v, _mm256_set1_epi8((char)bias));
}

// The 32 int8 values of inputs k, k + 1 (k even) of the column tile at ``tile``.
static inline __m256i pair_values(const uint8_t *tile, int format, int k) {
    const int bits = FORMAT_BITS(format);
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)(tile + (size_t)k * 16));
    return decode_pair(tile + (size_t)(k / 2) * PAIR_BYTES(bits), bits, FORMAT_BIAS(format));
}

#endif
