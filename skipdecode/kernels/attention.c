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

/* kernels.h: Q, O [B, H, S, hd]; K and V [B, Hkv, T, hd]; M [B, 1, S, T] */
int attention(const Tensor *Q, const Tensor *K, const Tensor *V, const Tensor *M, const Tensor *O) {
    const int64_t B = Q->ne[0], H = Q->ne[1], S = Q->ne[2], hd = Q->ne[3], Hkv = K->ne[1], T = K->ne[2];
    const float *q = Q->data, *k = K->data, *v = V->data, *mask = M->data;
    float *out = O->data;
    const int64_t qb = Q->nb[0], qh = Q->nb[1], qs = Q->nb[2], kb = K->nb[0], kh = K->nb[1], kt = K->nb[2];
    const int64_t mb = M->nb[0], ms = M->nb[2], ob = O->nb[0], oh = O->nb[1], os = O->nb[2];
    for (int i = 0; i < DIMS; i++)
        if (K->ne[i] != V->ne[i] || K->nb[i] != V->nb[i] || O->ne[i] != Q->ne[i]) return -2;
    if (Q->nb[3] != 1 || K->nb[3] != 1 || O->nb[3] != 1 || K->ne[0] != B || K->ne[3] != hd || !Hkv || H % Hkv ||
        (mask && (M->nb[3] != 1 || M->ne[0] != B || M->ne[2] != S || M->ne[3] != T)))
        return -2;
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
