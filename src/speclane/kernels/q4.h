// The int4 weight layout's shared pieces (included by int4_x86.c and int4_amx.c).
//
// packed: [N/16][K/2][16] bytes, byte j of pair p = q[n0+j][2p] | q[n0+j][2p+1] << 4 (the
// AVX2 build of int4_x86.c reads planes instead: see its q4_weight); scale, minimum:
// [N/16][K/32][16] float16. See int4_x86.c for the arithmetic.
#ifndef SPECLANE_Q4_H
#define SPECLANE_Q4_H

#include <stdint.h>

#include "bf16.h"
#include "grid.h"  // round_group, prepare_inputs, input_buffer_for

#define Q4_GROUP 32  // input columns per (scale, minimum) pair: the .c files' GROUP
// The int4 arithmetic's grid (grid.h): products of an input and a q in 0..15 are below
// 2^(E + 5), a group's sum below 2^(E + 10): 2^(E - 14) steps keep it under 2^24.
#define GRID_BITS 14

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
