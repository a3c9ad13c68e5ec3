// A forward plan's runner: a table of steps, each a kernel's ``_op`` entry point (op.h) and
// its arguments, called in order. Why: a one-token step of the default model is ~240 kernel
// calls (8 a layer), each ~5-15 us of Python and ctypes around a few us of work on a 2-core
// CPU; one call into this loop pays that once. The table is built and patched in Python
// (models/forward_plan.py); this file only walks it.
#include <stddef.h>
#include <stdint.h>

typedef void (*op_fn)(const int64_t *args);

// table: [steps][stride] int64; a row is the step's function address, then its arguments.
void run_plan(const int64_t *table, int steps, int stride) {
    for (int i = 0; i < steps; i++) {
        const int64_t *row = table + (size_t)i * stride;
        ((op_fn)(intptr_t)row[0])(row + 1);
    }
}

// A step that does nothing: what benchmarks/decode_breakdown.py puts in place of a kernel's
// step to time a forward without it.
void skip_op(const int64_t *args) { (void)args; }
