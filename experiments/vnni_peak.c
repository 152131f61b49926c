/* The int8 ceiling of this CPU: how many 512-bit vpdpbusd (64 multiply-adds of a u8 and an s8 each) one core
   retires per nanosecond with twelve independent sums in flight, and the same on every core (OpenMP). Beside
   w4a8.c's rate at 16 input rows (experiments/q8_products.py) it says how far the products of a batch-16 step
   are from what the machine can do. Cited by docs/research/native-step.md.

     gcc -O2 -march=native -fopenmp experiments/vnni_peak.c -o /tmp/vnni_peak && /tmp/vnni_peak */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>

__attribute__((noinline)) static void run(const __m512i *w, const int32_t *x, long n, __m512i *out) {
    __m512i a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_si512();
    for (long k = 0; k < n; k++) {
        const __m512i v = w[k & 7];
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], v, _mm512_set1_epi32(x[i]));
    }
    for (int i = 1; i < 12; i++) a[0] = _mm512_add_epi32(a[0], a[i]);
    *out = a[0];
}

int main(void) {
    __m512i w[8], out[64];
    int32_t x[12];
    for (int i = 0; i < 8; i++) w[i] = _mm512_set1_epi8((char)(i + 1));
    for (int i = 0; i < 12; i++) x[i] = i * 0x01010101;
    const long n = 40000000;
    for (int threads = 1; threads <= omp_get_max_threads(); threads++)
        for (int round = 0; round < 3; round++) {
            const double started = omp_get_wtime();
#pragma omp parallel num_threads(threads)
            run(w, x, n, &out[omp_get_thread_num()]);
            const double s = omp_get_wtime() - started;
            printf("%d thread(s), round %d: %.2f vpdpbusd a ns = %.0f GMAC/s\n", threads, round + 1,
                   threads * n * 12 / s / 1e9, threads * n * 12 * 64.0 / s / 1e9);
        }
    return _mm512_reduce_add_epi32(out[0]) == 42;
}
