/* Q4_1 weights times int8 activations, the way llama.cpp multiplies them (ggml_vec_dot_q4_1_q8_1).

   y[r, n] = sum over blocks b of  d_w d_x sum_i q_w[i] q_x[i]  +  m_w s_x
   with a weight block of 32 as the GGUF file holds it (4-bit codes q_w, float16 scale d_w and minimum m_w:
   w = d_w q_w + m_w) and the activation block quantized here as llama.cpp's Q8_1 (d_x = max |x| / 127,
   q_x = round(x / d_x), s_x = d_x sum q_x; d_x and s_x kept in float32).

   Layout (skipdecode/kernels/w4a8.py writes it from the file's blocks, every value exact): the weight rows in units of
   ROWS = 16, each unit block by block. One block of a unit is UNIT = 320 bytes: 256 bytes of codes, then the
   16 rows' float16 d, then their float16 m. The codes are four runs of 64 bytes, run i holding for each of the
   16 rows (4 bytes a row) codes 4i..4i+3 of the block in the low nibbles and codes 4i+16..4i+19 in the high
   ones. So one 64-byte load and a mask give, in lane n, row n's four codes that meet input codes 4i..4i+3:
   one vpdpbusd against those four input codes broadcast multiplies them for all 16 rows at once. A block's
   integer sums for 16 rows take 8 such products; its scaling (one conversion, one multiply, two fused
   multiply-adds) then serves 16 rows, and the unpacking serves every input row of the tile (up to 16 in the
   AVX-512 form; llama.cpp's
   "repacked" interleaved layouts do the same for its batches and prompts).

   Arithmetic, for every output y[r, n] in one lane and in block order, whatever the tile or thread:
     a = fma(float(isum_b), d_w * d_x, a);   c = fma(m_w, s_x, c);   y = a + c
   so a row of y depends on its own row of x only, and has the same bits alone, in a batch of 16, in a
   prefill or in a verify pass. The AVX2 forms run the same lane operations on 8-lane halves: their bits are
   those of the AVX-512 form. Built with -ffp-contract=off: every fused multiply-add is written out. */

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "timing.h"

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "this kernel needs AVX2, FMA and F16C"
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define WIDE 1
#endif

#ifndef TILE /* set otherwise for timing only (timing.h) */
#ifdef WIDE /* input rows per pass over a unit (q8_units has a case for each count up to it): their scaled sums */
#define TILE 16 /* and the unit's codes fill the 32 vector registers (see tile) */
#else
#define TILE 4 /* the 16 of AVX2 */
#endif
#endif

const char *q8_isa(void) {
#if defined(WIDE) && defined(__AVX512VNNI__)
    return "AVX512-VNNI";
#elif defined(WIDE)
    return "AVX512BW";
#elif defined(__AVXVNNI__)
    return "AVX-VNNI";
#else
    return "AVX2";
#endif
}

void q8_quantize(const float *x, int64_t k, int8_t *q, float *dx, float *sx) {
    for (int64_t b = 0; b < k / GROUP; b++) {
        const float *v = x + b * GROUP;
        float scale;
        int sum = 0;
#ifdef WIDE /* the same values as the loop below: the same maximum, product and round-to-nearest-even */
        const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
        scale = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))) / 127.0f;
        const __m512 inverse = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inverse));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inverse));
        _mm_storeu_si128((__m128i *)(q + b * GROUP), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(q + b * GROUP + 16), _mm512_cvtsepi32_epi8(q1));
        sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
        float amax = 0.0f;
        for (int i = 0; i < GROUP; i++) amax = fmaxf(amax, fabsf(v[i]));
        scale = amax / 127.0f;
        const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        for (int i = 0; i < GROUP; i++) {
            const int c = (int)nearbyintf(v[i] * inverse);
            q[b * GROUP + i] = (int8_t)c;
            sum += c;
        }
#endif
        dx[b] = scale;
        sx[b] = scale * (float)sum;
    }
}

#ifdef WIDE
static inline __m512i dot4(__m512i acc, __m512i w, int32_t x) {
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x));
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, _mm512_set1_epi32(x)), _mm512_set1_epi16(1)));
#endif
}

/* units u0..u1 against input rows r0..r0+T-1 (T a constant after inlining). Up to 8 rows, both sums of
   every row run in registers beside the codes; past 8, the c terms wait for a second sweep over the unit's
   minima, so that the codes and 16 rows' a terms fill the registers and one unpack serves all 16 (at 8 rows
   and fewer the second sweep costs more than it saves). The same operations in the same order either way. */
static inline __attribute__((always_inline)) void tile(const uint8_t *w, int64_t nb, int64_t u0, int64_t u1,
                                                      int64_t n_out, const int8_t *q, const float *dx,
                                                      const float *sx, int64_t k, int64_t r0, const int T,
                                                      float *y, int64_t ldy) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t u = u0; u < u1; u++) {
        const uint8_t *unit = w + u * nb * UNIT;
        const int later = T > 8; /* the c terms in a second sweep */
        __m512 a[TILE], c[TILE];
        for (int j = 0; j < T; j++) a[j] = c[j] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *block = unit + b * UNIT;
            _mm_prefetch((const char *)(block + 8 * UNIT), _MM_HINT_T0);
            _mm_prefetch((const char *)(block + 8 * UNIT + 64), _MM_HINT_T0);
            _mm_prefetch((const char *)(block + 8 * UNIT + 128), _MM_HINT_T0);
            _mm_prefetch((const char *)(block + 8 * UNIT + 192), _MM_HINT_T0);
            _mm_prefetch((const char *)(block + 8 * UNIT + 256), _MM_HINT_T0);
            __m512i codes[8];
            for (int i = 0; i < 4; i++) {
                const __m512i packed = _mm512_loadu_si512(block + 64 * i);
                codes[i] = _mm512_and_si512(packed, low);
                codes[i + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
            }
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 256)));
            const __m512 mw = later ? dw : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 288)));
#pragma GCC unroll 16
            for (int j = 0; j < T; j++) {
                const int64_t r = r0 + j;
                const int32_t *x4 = (const int32_t *)(q + r * k + b * GROUP);
                __m512i sum = _mm512_setzero_si512();
                for (int i = 0; i < 8; i++) sum = dot4(sum, codes[i], x4[i]);
                if (INTEGER_ONLY) { /* the integer sums alone, neither scaled nor with their minimum terms */
                    a[j] = _mm512_castsi512_ps(_mm512_add_epi32(sum, _mm512_castps_si512(a[j])));
                    continue;
                }
                const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(dx[r * nb + b]));
                a[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, a[j]);
                if (!later) c[j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[r * nb + b]), c[j]);
            }
        }
        for (int64_t b = 0; later && !INTEGER_ONLY && b < nb; b++) {
            const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(unit + b * UNIT + 288)));
#pragma GCC unroll 16
            for (int j = 0; j < T; j++) c[j] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[(r0 + j) * nb + b]), c[j]);
        }
        const int64_t n0 = u * ROWS, left = n_out - n0;
        const __mmask16 keep = left >= ROWS ? 0xFFFF : (__mmask16)((1u << left) - 1);
        for (int j = 0; j < T; j++) _mm512_mask_storeu_ps(y + (r0 + j) * ldy + n0, keep, _mm512_add_ps(a[j], c[j]));
    }
}
#else
static inline __m256i dot4(__m256i acc, __m256i w, int32_t x) {
#ifdef __AVXVNNI__
    return _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(x));
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_set1_epi32(x)), _mm256_set1_epi16(1)));
#endif
}

/* the same lane operations as the AVX-512 form, on the unit's two halves of 8 rows */
static inline __attribute__((always_inline)) void tile(const uint8_t *w, int64_t nb, int64_t u0, int64_t u1,
                                                      int64_t n_out, const int8_t *q, const float *dx,
                                                      const float *sx, int64_t k, int64_t r0, const int T,
                                                      float *y, int64_t ldy) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int64_t u = u0; u < u1; u++) {
        const uint8_t *unit = w + u * nb * UNIT;
        for (int half = 0; half < 2; half++) {
            __m256 a[TILE], c[TILE];
            for (int j = 0; j < T; j++) a[j] = c[j] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *block = unit + b * UNIT;
                __m256i codes[8];
                for (int i = 0; i < 4; i++) {
                    const __m256i packed = _mm256_loadu_si256((const __m256i *)(block + 64 * i + 32 * half));
                    codes[i] = _mm256_and_si256(packed, low);
                    codes[i + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                }
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 256 + 16 * half)));
                const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 288 + 16 * half)));
                for (int j = 0; j < T; j++) {
                    const int64_t r = r0 + j;
                    const int32_t *x4 = (const int32_t *)(q + r * k + b * GROUP);
                    __m256i sum = _mm256_setzero_si256();
                    for (int i = 0; i < 8; i++) sum = dot4(sum, codes[i], x4[i]);
                    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(dx[r * nb + b]));
                    a[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, a[j]);
                    c[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx[r * nb + b]), c[j]);
                }
            }
            const int64_t n0 = u * ROWS + 8 * half;
            for (int j = 0; j < T; j++) {
                float out[8];
                _mm256_storeu_ps(out, _mm256_add_ps(a[j], c[j]));
                for (int64_t i = 0; i < 8 && n0 + i < n_out; i++) y[(r0 + j) * ldy + n0 + i] = out[i];
            }
        }
    }
}
#endif

void q8_units(const uint8_t *w, int64_t k, int64_t u0, int64_t u1, int64_t n_out, const int8_t *q,
              const float *dx, const float *sx, int64_t rows, float *y, int64_t ldy) {
    const int64_t nb = k / GROUP;
    for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
        switch (rows - r0 < TILE ? rows - r0 : TILE) { /* T a constant in each case: unrolled, in registers */
#define CASE(T) case T: tile(w, nb, u0, u1, n_out, q, dx, sx, k, r0, T, y, ldy); break;
            CASE(1) CASE(2) CASE(3) CASE(4)
#if TILE > 4
            CASE(5) CASE(6) CASE(7) CASE(8)
#endif
#if TILE > 8
            CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#endif
#undef CASE
            default: break;
        }
    }
}

/* y [rows, n] = x [rows, k] W^T for W [n, k] in the layout above. Returns 0, or -1 on bad sizes or when the
   scratch rows cannot be allocated. */
int q8_matmul(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t rows, float *y) {
    if (k % GROUP || n <= 0 || rows <= 0) return -1;
    const int64_t nb = k / GROUP, units = (n + ROWS - 1) / ROWS;
    int8_t *q = malloc((size_t)(rows * k));
    float *dx = malloc(sizeof(float) * (size_t)(rows * nb)), *sx = malloc(sizeof(float) * (size_t)(rows * nb));
    if (!q || !dx || !sx) {
        free(q), free(dx), free(sx);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++) q8_quantize(x + r * k, k, q + r * k, dx + r * nb, sx + r * nb);
    const int64_t chunk = 4; /* units a thread takes at a time */
#pragma omp parallel for schedule(static) if (units * nb * rows >= 512)
    for (int64_t u = 0; u < units; u += chunk)
        q8_units(w, k, u, u + chunk < units ? u + chunk : units, n, q, dx, sx, rows, y, n);
    free(q), free(dx), free(sx);
    return 0;
}
