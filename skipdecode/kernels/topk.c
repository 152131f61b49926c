/* The k largest values of each row, for the LM head's screen (q4.RescoredHead): their indices, in no
   particular order (the head rescores them and scatters the exact logits back, so only the set matters).

   torch.topk over a 49152-token vocabulary took longer than the screen's product (about 0.2 ms a row here).
   Here a row is one pass: 16 values at a time compared with the smallest of the k kept so far (a min-heap),
   and only the few that beat it enter the heap. Ties at the k-th value may keep another of the tied indices
   than torch.topk would; the set is otherwise the same. */

#include <immintrin.h>
#include <stdint.h>

static void sift_down(float *v, int64_t *at, int64_t k, int64_t i) {
    for (;;) {
        int64_t small = i, l = 2 * i + 1, r = l + 1;
        if (l < k && v[l] < v[small]) small = l;
        if (r < k && v[r] < v[small]) small = r;
        if (small == i) return;
        const float tv = v[i];
        const int64_t ta = at[i];
        v[i] = v[small], at[i] = at[small], v[small] = tv, at[small] = ta;
        i = small;
    }
}

/* out [rows, k] = the indices of the k largest of each row of x [rows, n] (k <= n, k <= 1024). Returns 0, or
   -1 on bad sizes. */
int top_k(const float *x, int64_t n, int64_t k, int64_t rows, int64_t *out) {
    if (k <= 0 || k > n || k > 1024) return -1;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * n;
        float v[1024];
        int64_t *at = out + r * k;
        for (int64_t i = 0; i < k; i++) v[i] = row[i], at[i] = i;
        for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(v, at, k, i);
        int64_t i = k;
#if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16) {
            __mmask16 above = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), _mm512_set1_ps(v[0]), _CMP_GT_OQ);
            while (above) {
                const int j = __builtin_ctz(above);
                above &= above - 1;
                if (row[i + j] > v[0]) v[0] = row[i + j], at[0] = i + j, sift_down(v, at, k, 0);
            }
        }
#endif
        for (; i < n; i++)
            if (row[i] > v[0]) v[0] = row[i], at[0] = i, sift_down(v, at, k, 0);
    }
    return 0;
}
