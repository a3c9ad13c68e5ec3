// The int8-group kernel's weights in fewer bits (included by int8_entry.h, so by every int8
// kernel file). A weight whose integers fit 5 or 6 bits (GGUF's Q5_0, Q5_1, Q5_K: 5; Q6_K:
// 6) keeps them so in memory instead of one byte each: a one-token step reads 5.5 or 6.5
// bits a weight with its scales instead of 8.5, and the model's resident memory stays near
// its file's. The kernels decode a tile's pair of input columns in registers to what their
// inner loop multiplies by, and from there every path is the int8 layout's: the same bits.
//
// A weight's format (int8_cpu.pack): bits | (signed << 4); bits 8 is the int8 layout, 5 or
// 6 this one. A stored value is u = q + bias (bias 2^(bits-1) where signed, else 0), in
// 0 .. 2^bits - 1. Per column tile of 16 output columns, per pair p of input columns (2p,
// 2p + 1), PAIR_BYTES(bits) bytes: 16 bytes of low nibbles (byte j: column j's u at input
// 2p in bits 0-3, at input 2p + 1 in bits 4-7), then bits - 4 planes of 32 bits (plane h,
// bit 2j + i: bit 4 + h of column j's u at input 2p + i).
//
// Why the planes interleave the two inputs: the AVX-512 kernels multiply pairs, (q[2p][j],
// q[2p+1][j]) in 32-bit lane j (vpdpwssd's and the AMX tile unit's layout), so a plane is
// that layout's word mask as it is, and a pair decodes in five instructions: the nibbles
// spread to words (b | b << 12), the planes' bits added under their mask, and one vpermw /
// vpermt2w that looks each word's u up in a table of q = u - bias, as int16 (the integer
// paths) or as bfloat16 (the tile kernel's weights; every |q| <= 32 is exact in either).
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

// Plane h of the pair at ``pair`` (bits - 4 of them after its 16 nibble bytes).
static inline uint32_t pair_plane(const uint8_t *pair, int h) {
    uint32_t plane;
    memcpy(&plane, pair + 16 + 4 * h, sizeof plane);
    return plane;
}

#ifdef __AVX512BW__
// The pair order's words from the int8 layout's order (word 2j: value j of input k, word 2j
// + 1: value j of input k + 1), and back.
static const uint16_t PAIR_ORDER[32] __attribute__((aligned(64))) = {
    0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
static const uint16_t INT8_ORDER[32] __attribute__((aligned(64))) = {
    0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

// q = u - bias for u = 0 .. 63 as 16-bit words (low: u < 32, high: u >= 32), the lookup of
// pair_words: int16 (pair_table) or bfloat16 (pair_table_bf16).
typedef struct {
    __m512i low, high;
} pair_table;

static inline pair_table pair_table_int16(int format) {
    const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                          15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i bias = _mm512_set1_epi16((short)FORMAT_BIAS(format));
    const pair_table table = {_mm512_sub_epi16(iota, bias), _mm512_sub_epi16(_mm512_add_epi16(iota, _mm512_set1_epi16(32)), bias)};
    return table;
}

#ifdef __AVX512BF16__
static inline __m512i words_to_bf16(__m512i words) {  // int16 words (|q| <= 128: exact) -> bfloat16 words
    const __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(words)));
    const __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(words, 1)));
    return (__m512i)_mm512_cvtne2ps_pbh(high, low);
}

static inline pair_table pair_table_bf16(int format) {
    const pair_table table = pair_table_int16(format);
    const pair_table bf16 = {words_to_bf16(table.low), words_to_bf16(table.high)};
    return bf16;
}
#endif

// The 32 values of inputs k, k + 1 (k even) of the column tile at ``tile`` in the pair order
// (word 2j: column j at input k; 2j + 1: at input k + 1), as ``table``'s words (int16 or
// bfloat16 q). The int8 layout's bytes (format 8) take int16 words only: table unused.
static inline __m512i pair_words(const uint8_t *tile, int format, int k, const pair_table *table) {
    const int bits = FORMAT_BITS(format);
    if (bits == 8)
        return _mm512_permutexvar_epi16(_mm512_load_si512(PAIR_ORDER),
                                        _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(tile + (size_t)k * 16))));
    const uint8_t *pair = tile + (size_t)(k / 2) * PAIR_BYTES(bits);
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)pair));
    // dword j: the low nibble in bits 0-3 (word 2j), the high one in bits 16-19 (word 2j + 1):
    // (b | b << 12) & 0x000F000F
    __m512i u = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
    for (int h = 0; h < bits - 4; h++)
        u = _mm512_mask_add_epi16(u, (__mmask32)pair_plane(pair, h), u, _mm512_set1_epi16((short)(16 << h)));
    return bits == 5 ? _mm512_permutexvar_epi16(u, table->low)  // reads each word's low 5 bits
                     : _mm512_permutex2var_epi16(table->low, u, table->high);  // its low 6
}

// The same 32 values in the int8 layout's order (input k's 16 columns, then input k + 1's).
static inline __m256i pair_values(const uint8_t *tile, int format, int k) {
    if (FORMAT_BITS(format) == 8) return _mm256_loadu_si256((const __m256i *)(tile + (size_t)k * 16));
    const pair_table table = pair_table_int16(format);
    return _mm512_cvtepi16_epi8(_mm512_permutexvar_epi16(_mm512_load_si512(INT8_ORDER), pair_words(tile, format, k, &table)));
}
#else
// The AVX2 build decodes a pair to the int8 layout's bytes. A plane's 32 bits spread to bytes
// with one byte shuffle and one mask compare, whose patterns do the reordering: the plane
// holds the pair order (bit 2j: column j of input k, bit 2j + 1: column j of input k + 1),
// so byte i < 16 reads bit 2i (byte i / 4 of the word, bit 2 (i % 4)) and byte 16 + j bit
// 2j + 1. (A scalar bit unshuffle before them, 16 dependent operations a plane on every pair
// of inputs, made the Q5 and Q6 weights 3-5x slower than Q4's at one row.)
//
// A format's constants, made once a tile call (pair_decoder) rather than at every pair, where
// they cost three operations a plane: plane h ORs ``add[h]`` into the bytes whose bit compares
// equal to ``when[h]``. That is 16 << h where the bit is set, except a signed format's top
// plane, which folds in the bias: q = u - 2^(bits-1) is negative where its top bit is clear,
// its int8 the lower bits under the sign bits (0xF0 for 5 bits, 0xE0 for 6), so that plane
// ORs in the sign bits where its bit is clear, and no subtraction follows. A 5-bit pair
// decodes in 7 operations (the nibbles in two: the 16 bytes in both halves of a register,
// each half's dwords shifted by 0 or 4, masked).
typedef struct {
    int format;
    __m256i when[2], add[2];
} pair_decoder;

static const uint8_t PLANE_PICK[32] __attribute__((aligned(32))) = {
    0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
static const uint8_t PLANE_BIT[32] __attribute__((aligned(32))) = {
    1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64, 2, 8, 32, 128, 2, 8, 32, 128, 2, 8, 32, 128, 2, 8, 32, 128};

static inline pair_decoder pair_decoder_for(int format) {
    const int bits = FORMAT_BITS(format);
    pair_decoder decoder = {format, {_mm256_setzero_si256(), _mm256_setzero_si256()}, {_mm256_setzero_si256(), _mm256_setzero_si256()}};
    for (int h = 0; h < 2 && h < bits - 4; h++) {
        const int sign_plane = (format & 16) && h == bits - 5;
        decoder.when[h] = sign_plane ? _mm256_setzero_si256() : _mm256_load_si256((const __m256i *)PLANE_BIT);
        decoder.add[h] = _mm256_set1_epi8((char)(sign_plane ? 0xFF << (bits - 1) : 16 << h));
    }
    return decoder;
}

// The 32 int8 values of inputs k, k + 1 (k even) of the column tile at ``tile``, in the int8
// layout's order (input k's 16 columns, then input k + 1's).
static inline __m256i pair_values_of(const uint8_t *tile, const pair_decoder *decoder, int k) {
    const int bits = FORMAT_BITS(decoder->format);
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)(tile + (size_t)k * 16));
    const uint8_t *pair = tile + (size_t)(k / 2) * PAIR_BYTES(bits);
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)pair));
    __m256i v = _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(15));
    const __m256i pick = _mm256_load_si256((const __m256i *)PLANE_PICK), bit = _mm256_load_si256((const __m256i *)PLANE_BIT);
    for (int h = 0; h < bits - 4; h++) {
        const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)pair_plane(pair, h)), pick);  // within each 128-bit lane
        v = _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), decoder->when[h]), decoder->add[h]));
    }
    return v;
}

static inline __m256i pair_values(const uint8_t *tile, int format, int k) {
    const pair_decoder decoder = pair_decoder_for(format);
    return pair_values_of(tile, &decoder, k);
}
#endif

#endif
