// The calling convention of a forward plan's steps (plan.c, run by models/forward_plan.py):
// each kernel entry point a plan calls has an ``_op`` twin taking its arguments as one array
// of int64 (pointers as addresses, ints as they are, a float as its 32 bits), so that one C
// loop can call a layer's kernels in turn without Python between them.
#ifndef SPECLANE_OP_H
#define SPECLANE_OP_H

#include <stdint.h>
#include <string.h>

#define OP_PTR(a) ((void *)(intptr_t)(a))

static inline float op_float(int64_t a) {
    const int32_t bits = (int32_t)a;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
