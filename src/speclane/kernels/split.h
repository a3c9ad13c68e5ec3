// How a matmul's calls share their tiles between threads (included by the int4 and
// int8 vector kernels): dynamically, so that a thread slowed by another process on its core
// takes fewer tiles instead of holding the others at the barrier (a tile's outputs are one
// thread's, so the split never changes a bit), and in CHUNKS_PER_CALL contiguous runs of
// tiles a call (CHUNKS_PER_THREAD a thread on more than 4 threads) rather than one tile at a time.
//
// Why runs: a call streams its weight from memory once (a call of many rows runs its blocks
// of rows over a tile while the tile is in L1), and at a few rows the stream's speed sets a
// one-token step's. A thread that takes every other tile reads every other few KB,
// and the hardware prefetcher starts over at each; a thread on a run of tiles reads one
// sequential stream. The 120 layer matmuls of the default model at one row (random int4
// weights, ~66 MB, benchmarks/kernels.py's shapes; an AMD EPYC Zen 4, 2 threads): 0.82-0.87x
// the time of one tile at a time; 16 runs a call within 3% of 2, 4 or 8 (one stream of the
// model, alternated) and 1.08x as fast as 32, while a thread slowed to half its speed holds
// up a call by at most one run of 16, where a static split would wait on its whole half.
#ifndef SPECLANE_SPLIT_H
#define SPECLANE_SPLIT_H

#include <omp.h>

#define CHUNKS_PER_CALL 16
#define CHUNKS_PER_THREAD 4  // on many threads, at least this many runs each

// The loop iterations a thread takes at a time, of ``iterations`` in a call.
static inline int iterations_per_chunk(int iterations) {
    const int threads = omp_get_max_threads();
    const int chunks = threads * CHUNKS_PER_THREAD > CHUNKS_PER_CALL ? threads * CHUNKS_PER_THREAD : CHUNKS_PER_CALL;
    const int chunk = (iterations + chunks - 1) / chunks;
    return chunk > 0 ? chunk : 1;
}

#endif
