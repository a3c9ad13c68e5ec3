// How a matmul's few-row calls share their tiles between threads (included by the int4 and
// int8 vector kernels): dynamically, so that a thread slowed by another process on its core
// takes fewer tiles instead of holding the others at the barrier (a tile's outputs are one
// thread's, so the split never changes a bit), and in CHUNKS_PER_CALL contiguous runs of
// tiles a call rather than one tile at a time.
//
// Why runs: a call of a few rows streams its weight from memory once, and the stream's speed
// sets a one-token step's. A thread that takes every other tile reads every other few KB,
// and the hardware prefetcher starts over at each; a thread on a run of tiles reads one
// sequential stream. The 120 layer matmuls of the default model at one row (random int4
// weights, ~66 MB, benchmarks/kernels.py's shapes; an AMD EPYC Zen 4, 2 threads): 0.82-0.87x
// the time of one tile at a time; 16 runs a call was within noise of a static split (one
// run a thread), which a slowed thread would hold up.
#ifndef SPECLANE_SPLIT_H
#define SPECLANE_SPLIT_H

#define CHUNKS_PER_CALL 16

// The loop iterations a thread takes at a time, of ``iterations`` in a call.
static inline int iterations_per_chunk(int iterations) {
    const int chunk = (iterations + CHUNKS_PER_CALL - 1) / CHUNKS_PER_CALL;
    return chunk > 0 ? chunk : 1;
}

#endif
