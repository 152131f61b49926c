/* What the C kernels share (w4a8.c: the 4-bit products; attention.c; layer.c: a decoder layer in one call). */
#ifndef SKIPDECODE_KERNELS_H
#define SKIPDECODE_KERNELS_H

#include <math.h>
#include <stdint.h>

#define GROUP 32 /* weights per Q4_1 block, along the input */
#define ROWS 16  /* weight rows interleaved in one unit of the layout (one AVX-512 lane each) */
#define UNIT (ROWS * GROUP / 2 + 2 * ROWS * 2) /* bytes of one block of ROWS rows: codes, then d and m */

/* One input row quantized as llama.cpp's Q8_1, per block of 32: codes q, scale dx, dx * sum(q) in sx. */
void q8_quantize(const float *x, int64_t k, int8_t *q, float *dx, float *sx);

/* y[r, n] for weight rows n in units [u0, u1) (ROWS each; n < n_out only) and input rows r < rows, whose
   quantized activations are q [rows, k], dx and sx [rows, k / GROUP]; y's rows ldy floats apart. */
void q8_units(const uint8_t *w, int64_t k, int64_t u0, int64_t u1, int64_t n_out, const int8_t *q,
              const float *dx, const float *sx, int64_t rows, float *y, int64_t ldy);

/* One query row of attention (attention.c): out[hd] = softmax(q . k_t / sqrt(hd) + mask_t) v over the columns
   t < T that mask leaves (NULL: all), keys and values kt floats apart; scores and seen: T entries of scratch. */
void attention_row(const float *q, const float *k, const float *v, int64_t kt, const float *mask, int64_t T,
                   int64_t hd, float *out, float *scores, int64_t *seen);

/* e^x (Cephes' expf: range reduction by ln 2, a degree-5 polynomial; within 2 ulp), branch-free so that a
   vector lane and a scalar call compute the same operations; 0 below -87, inf above 88 */
static inline float exp_any(float x) {
    const float low = x < -87.0f ? -87.0f : x, c = low > 88.0f ? 88.0f : low;
    const float n = nearbyintf(c * 1.44269504088896341f);
    const float r = fmaf(n, -0.693359375f, c);
    const float f = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, f, 1.3981999507e-3f);
    p = fmaf(p, f, 8.3334519073e-3f);
    p = fmaf(p, f, 4.1665795894e-2f);
    p = fmaf(p, f, 1.6666665459e-1f);
    p = fmaf(p, f, 5.0000001201e-1f);
    p = fmaf(p * f, f, f) + 1.0f;
    union { uint32_t i; float f; } scale = {.i = (uint32_t)((int32_t)n + 127) << 23};
    const float e = p * scale.f;
    return x < -87.0f ? 0.0f : (x > 88.0f ? INFINITY : e);
}

#endif
