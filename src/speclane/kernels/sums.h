// Integer running sums kept one register each (included by the integer matmul kernels).
//
// A kernel's int32 (or int16) sums are updated in place, one multiply-add result at a time.
// Integer addition is associative, so GCC regroups the adds of a fully unrolled loop into
// trees of products that it keeps on the stack, where the registers run out: the AVX2 int4
// kernel's loop (6 rows x 2 vectors of sums) took 1.25-1.3x the time at 4-48 rows, its
// int8-input kernel 1.25-1.3x at 4-64 rows (Zen 3). An empty asm statement that takes a sum
// in a register and gives it back pins each step to that register; it emits no instruction
// and changes no bit (the same adds, in the same order a lane's exact integers allow).
#ifndef SPECLANE_SUMS_H
#define SPECLANE_SUMS_H

#define KEEP_IN_REGISTER(sum) __asm__("" : "+v"(sum))

#endif
