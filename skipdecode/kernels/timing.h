/* The kernels' switches for timing only, in one place. The experiments that time variants of the kernels
   set them with -D (native.Library(extra=...)); the library's own build (native.py) sets none, and then each
   compiles to nothing: the shipped loops run as if this header were not there, bit for bit.

   -DTILE=8            w4a8.c: input rows a pass over a unit other than its own (experiments/q8_products.py --tile)
   -DQ8_INTEGER_ONLY   w4a8.c: the integer sums alone, no float work a block: wrong values, a bound on what the
                       float work costs (experiments/q8_products.py --define Q8_INTEGER_ONLY)
   -DLAYER_TIMES       layer.c: the wall time of each of its PHASES, summed behind an extra barrier at every
                       MARK, read and zeroed by layer_times() (experiments/layer_phases.py) */
#ifndef SKIPDECODE_TIMING_H
#define SKIPDECODE_TIMING_H

#ifdef Q8_INTEGER_ONLY
#define INTEGER_ONLY 1
#else
#define INTEGER_ONLY 0 /* the branch on it is dead code: the compiler drops it */
#endif

#if defined(LAYER_TIMES) && defined(PHASES) /* in the one file that marks phases (layer.c defines PHASES) */
#include <time.h>
static double phase_ms[PHASES];
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}
/* the sums since the last call, then zero */
int layer_times(double *out) {
    for (int i = 0; i < PHASES; i++) out[i] = phase_ms[i], phase_ms[i] = 0.0;
    return 0;
}
/* the clock a call's first phase starts on */
#define MARK_START double mark = now_ms()
/* every thread done with phase i (a barrier more than the call has where the phase ends without one) */
#define MARK(i)                                          \
    do {                                                 \
        _Pragma("omp barrier") _Pragma("omp master") {   \
            const double t = now_ms();                   \
            phase_ms[i] += t - mark;                     \
            mark = t;                                    \
        }                                                \
    } while (0)
#else
#define MARK_START do {} while (0)
#define MARK(i) do {} while (0)
#endif

#endif
