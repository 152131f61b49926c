#!/usr/bin/env bash
# The int8 kernel's two weight layouts, one step's 120 products (random blocks of SmolLM2-135M's shapes, 66 MB),
# in turns in one process, best of N rounds each: the layout before the native layers (pairs of blocks a row,
# 8 input rows a pass; q8.c at commit 276b546, today's w4a8.c) and today's (16 rows interleaved a block, one unpack for every
# input row of a pass). Cited by docs/research/native-step.md.
#     bash experiments/q8_layouts.sh [rounds]        # OMP_NUM_THREADS=1 by default: one core, fewer waits
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git show 276b546:skipdecode/q8.c | sed 's/^int q8_matmul/int old_q8_matmul/; s/^const char \*q8_isa/static const char *old_isa/' > "$work/old.c"
cat > "$work/main.c" <<'C'
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int old_q8_matmul(const uint8_t *codes, const uint16_t *d, const uint16_t *m, int64_t n, int64_t k, const float *x,
                  int64_t rows, float *y);
int q8_matmul(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t rows, float *y);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    const int64_t shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
    void *old[120][3], *new[120];
    float *x = malloc(sizeof(float) * 64 * 1536), *y = malloc(sizeof(float) * 64 * 3072);
    for (int i = 0; i < 64 * 1536; i++) x[i] = (float)((i * 7919) % 201 - 100) / 50.0f;
    for (int p = 0; p < 120; p++) { /* codes 5 and 3, d = m = 2^-13: finite sums, the same work as real blocks */
        const int64_t n = shapes[p % 4][0], k = shapes[p % 4][1], pairs = (k / 32 + 1) / 2;
        old[p][0] = malloc(n * pairs * 32), old[p][1] = malloc(n * pairs * 4), old[p][2] = malloc(n * pairs * 4);
        memset(old[p][0], 0x35, n * pairs * 32), memset(old[p][1], 0x0C, n * pairs * 4), memset(old[p][2], 0x0C, n * pairs * 4);
        new[p] = malloc((n / 16) * (k / 32) * 320), memset(new[p], 0x0C, (n / 16) * (k / 32) * 320);
    }
    for (int rows = 1; rows <= 64; rows *= 4) {
        double best[2] = {1e9, 1e9};
        for (int r = 0; r < reps; r++)
            for (int v = 0; v < 2; v++) {
                const double t = now();
                for (int p = 0; p < 120; p++) {
                    const int64_t n = shapes[p % 4][0], k = shapes[p % 4][1];
                    if (v == 0) old_q8_matmul(old[p][0], old[p][1], old[p][2], n, k, x, rows, y);
                    else q8_matmul(new[p], n, k, x, rows, y);
                }
                const double s = now() - t;
                if (s < best[v]) best[v] = s;
            }
        printf("%2d row(s): pairs a row %.3f ms, 16 rows interleaved %.3f ms a step: %.2fx\n", rows, best[0] * 1e3,
               best[1] * 1e3, best[0] / best[1]);
    }
    return 0;
}
C
gcc -O3 -march=native -ffp-contract=off -fopenmp -Iskipdecode/kernels -o "$work/layouts" "$work/main.c" "$work/old.c" skipdecode/kernels/w4a8.c -lm
echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}, load average $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$work/layouts" "${1:-20}"
