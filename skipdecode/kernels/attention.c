/* Attention for the 4-bit CPU path, in float32, with each query row's sums in an order that depends on
   the row alone.

   out[b, h, s] = softmax(q k^T / sqrt(hd) + mask) v over the columns the additive mask leaves (-inf hides
   one), for grouped-query heads. PyTorch's float32 SDPA sums over keys in vector lanes tied to the column
   index, so left padding (a row in a batch) or a prefill's rows round differently than a row decoded
   alone; the engine ran it in float64 to hide that (0.9 ms of a 6 ms step). Here the scores, the softmax
   and the weighted sum run over the row's visible columns in their order, lanes along the head dimension
   only, with one exp (kernels.h) whether the compiler vectorizes a loop or not: a row attends with the same
   bits alone, in a batch, in a prefill and in a verify pass. Built with -ffp-contract=off. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

#define LANES 16

/* a . b in LANES lanes along the vector, then halves added pairwise: the same order for every call */
static inline float dot(const float *a, const float *b, int64_t n) {
    float part[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) part[j] = fmaf(a[i + j], b[i + j], part[j]);
    for (int j = 0; i + j < n; j++) part[j] = fmaf(a[i + j], b[i + j], part[j]);
    for (int w = LANES / 2; w; w /= 2)
        for (int j = 0; j < w; j++) part[j] += part[j + w];
    return part[0];
}

#if defined(__AVX512F__)
/* hd = 64 (SmolLM2's heads) in four registers: the dot's 16 lanes summed by _mm512_reduce_add_ps, the
   weighted sum in four accumulators; the same operations for every column */
static inline float dot64(const __m512 q[4], const float *k) {
    __m512 s = _mm512_mul_ps(q[0], _mm512_loadu_ps(k));
    for (int j = 1; j < 4; j++) s = _mm512_fmadd_ps(q[j], _mm512_loadu_ps(k + 16 * j), s);
    return _mm512_reduce_add_ps(s);
}
#endif

/* One query row over its visible columns (kernels.h). */
void attention_row(const float *qr, const float *kr, const float *vr, int64_t kt, const float *mr, int64_t T,
                   int64_t hd, float *o, float *scores, int64_t *seen) {
    const float scale = 1.0f / sqrtf((float)hd);
    int64_t count = 0;
    float top = -INFINITY;
#if defined(__AVX512F__)
    if (hd == 64) {
        __m512 qv[4];
        for (int j = 0; j < 4; j++) qv[j] = _mm512_loadu_ps(qr + 16 * j);
        for (int64_t t = 0; t < T; t++) {
            if (mr && mr[t] == -INFINITY) continue;
            const float score = dot64(qv, kr + t * kt) * scale + (mr ? mr[t] : 0.0f);
            scores[count] = score, seen[count++] = t;
            top = fmaxf(top, score);
        }
        for (int64_t c = 0; c < count; c++) scores[c] = exp_any(scores[c] - top);
        __m512 av[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        float total = 0.0f;
        for (int64_t c = 0; c < count; c++) {
            const __m512 e = _mm512_set1_ps(scores[c]);
            const float *vt = vr + seen[c] * kt;
            total += scores[c];
            for (int j = 0; j < 4; j++) av[j] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vt + 16 * j), av[j]);
        }
        const __m512 inverse = _mm512_set1_ps(count ? 1.0f / total : 0.0f);
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(o + 16 * j, _mm512_mul_ps(av[j], inverse));
        return;
    }
#endif
    for (int64_t t = 0; t < T; t++) {
        if (mr && mr[t] == -INFINITY) continue;
        const float score = dot(qr, kr + t * kt, hd) * scale + (mr ? mr[t] : 0.0f);
        scores[count] = score, seen[count++] = t;
        top = fmaxf(top, score);
    }
    for (int64_t c = 0; c < count; c++) scores[c] = exp_any(scores[c] - top);
    for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
    float total = 0.0f;
    for (int64_t c = 0; c < count; c++) {
        const float e = scores[c];
        const float *vt = vr + seen[c] * kt;
        total += e;
        for (int64_t i = 0; i < hd; i++) o[i] = fmaf(e, vt[i], o[i]);
    }
    const float inverse = count ? 1.0f / total : 0.0f; /* a row that sees no column gets zeros */
    for (int64_t i = 0; i < hd; i++) o[i] = o[i] * inverse;
}

/* q [B, H, S, hd] and out [B, H, S, hd] (strides in elements for b, h, s; hd contiguous), keys and
   values [B, Hkv, T, hd] (strides for b, h, t), mask [B, 1, S, T] (strides for b, s; NULL: every column).
   Returns 0, or -1 when scratch memory is short. */
int attention(const float *q, int64_t qb, int64_t qh, int64_t qs, const float *k, const float *v, int64_t kb,
              int64_t kh, int64_t kt, const float *mask, int64_t mb, int64_t ms, float *out, int64_t ob,
              int64_t oh, int64_t os, int64_t B, int64_t H, int64_t Hkv, int64_t S, int64_t T, int64_t hd) {
    const int64_t group = H / Hkv, tasks = B * H * S;
    int failed = 0;
#pragma omp parallel if (tasks * T * hd >= 65536) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (size_t)T);
        int64_t *seen = malloc(sizeof(int64_t) * (size_t)T);
        if (!scores || !seen) failed = 1;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            if (!scores || !seen) continue;
            const int64_t b = task / (H * S), h = task / S % H, s = task % S;
            attention_row(q + b * qb + h * qh + s * qs, k + b * kb + (h / group) * kh, v + b * kb + (h / group) * kh,
                          kt, mask ? mask + b * mb + s * ms : NULL, T, hd, out + b * ob + h * oh + s * os, scores, seen);
        }
        free(scores), free(seen);
    }
    return failed ? -1 : 0;
}
