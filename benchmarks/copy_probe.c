/* The machine's own limit for a paged gather, outside Python and torch: the same bytes copied contiguously and
 * as a gather of RUN-byte runs (RUNS per block, from a pool twice the size, random block order), by one AVX2
 * loop with ordinary stores. If this C gather stays under 0.9 of the contiguous copy, so must any gather that
 * lands in ordinary memory (capkv's `capkv bench transfer` ratios are against torch's contiguous copy).
 *
 *   cc -O2 -mavx2 -o /tmp/copy_probe benchmarks/copy_probe.c && /tmp/copy_probe 8192 4 && /tmp/copy_probe 32768 64
 *   (demo model, 16-token blocks: 8 KiB runs, 4 a block; Llama-3.1-8B, 16-token blocks: 32 KiB runs, 64 a block)
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void copy(char *to, const char *from, size_t n) { /* n: a multiple of 64 */
    for (size_t i = 0; i < n; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(from + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(from + i + 32));
        _mm256_storeu_si256((__m256i *)(to + i), a);
        _mm256_storeu_si256((__m256i *)(to + i + 32), b);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s RUN_BYTES RUNS_PER_BLOCK\n", argv[0]);
        return 2;
    }
    size_t run = strtoul(argv[1], NULL, 10), runs = strtoul(argv[2], NULL, 10), total = (size_t)128 << 20;
    size_t blocks = total / (run * runs), pool = 2 * blocks;
    if (run == 0 || run % 64 || blocks == 0) {
        fprintf(stderr, "RUN_BYTES must be a multiple of 64 and a block under 128 MiB\n");
        return 2;
    }
    char *cache = aligned_alloc(4096, pool * run * runs), *rows = aligned_alloc(4096, total);
    char *source = aligned_alloc(4096, total);
    size_t *order = malloc(pool * sizeof *order);
    memset(cache, 1, pool * run * runs);
    memset(rows, 2, total);
    memset(source, 3, total);
    for (size_t i = 0; i < pool; i++) order[i] = i;
    srand(1);
    for (size_t i = pool - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), kept = order[i];
        order[i] = order[j];
        order[j] = kept;
    }
    double contiguous = 1e9, gather = 1e9;
    for (int round = 0; round < 20; round++) { /* best of 20, alternating */
        double started = now();
        copy(rows, source, total);
        double spent = now() - started;
        if (spent < contiguous) contiguous = spent;
        started = now();
        for (size_t j = 0; j < blocks; j++)
            for (size_t p = 0; p < runs; p++) /* run p of every block lies in plane p, as K and V of a layer do */
                copy(rows + (j * runs + p) * run, cache + p * pool * run + order[j] * run, run);
        spent = now() - started;
        if (spent < gather) gather = spent;
    }
    printf("%zu-byte runs x %zu a block: contiguous %.1f GB/s, gather %.1f GB/s, ratio %.2f\n", run, runs,
           total / contiguous / 1e9, total / gather / 1e9, contiguous / gather);
    return 0;
}
