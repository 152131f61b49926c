/* Q4_1 weights times int8 activations, the way llama.cpp multiplies them (ggml_vec_dot_q4_1_q8_1).

   y[r, n] = sum over blocks b of  d_w d_x sum_i q_w[i] q_x[i]  +  m_w s_x
   with a weight block of 32 as the GGUF file holds it (4-bit codes q_w, float16 scale d_w and minimum m_w:
   w = d_w q_w + m_w) and the activation block quantized here as llama.cpp's Q8_1 (d_x = max |x| / 127,
   q_x = round(x / d_x), s_x = d_x sum q_x; d_x and s_x kept in float32). The integer sums run on
   AVX512-VNNI (vpdpbusd), or AVX512BW / AVX2 (vpmaddubsw + vpmaddwd), which give the same int32 per group
   of four codes.

   Layout (skipdecode/q8.py writes it from the file's blocks, every value exact): per weight row, the
   codes of each PAIR of blocks as 32 bytes, block 2p in the low nibbles and block 2p+1 in the high ones
   (one load and two masks give both blocks in the order of x); then the float16 d's and m's of the row's
   blocks, each contiguous. An odd number of blocks is padded with a zero block.

   A row of y depends on its own row of x only, and its float steps run in one fixed order whatever the
   number of rows, tiles or threads: a row decodes the same bits alone, in a batch of 16, in a prefill or
   in a verify pass. The bits may differ between the AVX512 and AVX2 builds, never between batches.
   Built with -ffp-contract=off: every fused multiply-add is written out. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "this kernel needs AVX2, FMA and F16C"
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define WIDE 1
#endif

#define GROUP 32
#define TILE 8 /* rows of x per pass over a weight row (rows() has a case for each count up to it) */
#define CHUNK 16 /* weight rows a thread takes at a time */
#define AHEAD 16 /* rows ahead whose weights are prefetched: a step streams 66 MB, most of it from DRAM */

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

typedef struct {
    int8_t *q;  /* [rows, pairs * 64] codes, zero-padded */
    float *dx;  /* [rows, pairs, 16]: each pair's two scales, each repeated 8 times (one per int32 lane) */
    float *sx;  /* [rows, pairs * 2] */
} Acts;

/* One row of x [k] into Q8_1 blocks (pairs * 2 of them; the padding block is zero). */
static void quantize_row(const float *x, int64_t nb, int64_t pairs, int8_t *q, float *dx, float *sx) {
    for (int64_t b = 0; b < pairs * 2; b++) {
        float scale = 0.0f;
        int sum = 0;
        if (b < nb) {
            const float *v = x + b * GROUP;
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
        } else {
            memset(q + b * GROUP, 0, GROUP);
        }
        for (int i = 0; i < 8; i++) dx[(b / 2) * 16 + (b % 2) * 8 + i] = scale;
        sx[b] = scale * (float)sum;
    }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#ifdef WIDE
static inline __m512i dot4(__m512i w, __m512i x) {
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1));
#endif
}

/* weight rows n0..n1 against x rows r0..r0+T-1 (T a constant after inlining) */
static inline __attribute__((always_inline)) void tile(const uint8_t *codes, const uint16_t *d, const uint16_t *m,
                                                      int64_t pairs, int64_t n0, int64_t n1, const Acts *a,
                                                      int64_t r0, const int T, float *y, int64_t n_out) {
    const __m512i lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i low = _mm256_set1_epi8(0x0F);
    const int64_t nbp = pairs * 2;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = codes + n * pairs * 32;
        const uint16_t *dn = d + n * nbp, *mn = m + n * nbp;
        for (int64_t i = 0; i < pairs * 32; i += 64) _mm_prefetch((const char *)(row + AHEAD * pairs * 32 + i), _MM_HINT_T0);
        _mm_prefetch((const char *)(dn + AHEAD * nbp), _MM_HINT_T0);
        _mm_prefetch((const char *)(mn + AHEAD * nbp), _MM_HINT_T0);
        __m512 acc[TILE];
        for (int j = 0; j < T; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t p = 0; p < pairs; p++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(row + p * 32));
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(packed, low)),
                                                 _mm256_and_si256(_mm256_srli_epi16(packed, 4), low), 1);
            const __m128 two = _mm_cvtph_ps(_mm_cvtsi32_si128(*(const int32_t *)(dn + 2 * p)));
            const __m512 dw = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(two));
            for (int j = 0; j < T; j++) {
                const int64_t r = r0 + j;
                const __m512i xq = _mm512_loadu_si512(a->q + r * pairs * 64 + p * 64);
                const __m512 sums = _mm512_cvtepi32_ps(dot4(w, xq));
                const __m512 scaled = _mm512_mul_ps(sums, _mm512_loadu_ps(a->dx + (r * pairs + p) * 16));
                acc[j] = _mm512_fmadd_ps(scaled, dw, acc[j]);
            }
        }
        for (int j = 0; j < T; j++) {
            const int64_t r = r0 + j;
            /* plus the blocks' m_w s_x, 16 blocks a lane-wise product */
            __m512 sum = acc[j];
            for (int64_t b = 0; b < nbp; b += 16) {
                const __mmask16 tail = nbp - b >= 16 ? 0xFFFF : (__mmask16)((1u << (nbp - b)) - 1);
                const __m512 mw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, mn + b));
                sum = _mm512_fmadd_ps(mw, _mm512_maskz_loadu_ps(tail, a->sx + r * nbp + b), sum);
            }
            y[r * n_out + n] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1)));
        }
    }
}
#else
static inline __m256i dot4(__m256i w, __m256i x) {
#ifdef __AVXVNNI__
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

static inline __attribute__((always_inline)) void tile(const uint8_t *codes, const uint16_t *d, const uint16_t *m,
                                                      int64_t pairs, int64_t n0, int64_t n1, const Acts *a,
                                                      int64_t r0, const int T, float *y, int64_t n_out) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const int64_t nbp = pairs * 2;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = codes + n * pairs * 32;
        const uint16_t *dn = d + n * nbp, *mn = m + n * nbp;
        __m256 even[TILE], odd[TILE];
        for (int j = 0; j < T; j++) even[j] = odd[j] = _mm256_setzero_ps();
        for (int64_t p = 0; p < pairs; p++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(row + p * 32));
            const __m256i w0 = _mm256_and_si256(packed, low), w1 = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
            const __m256 d0 = _mm256_set1_ps(_cvtsh_ss(dn[2 * p])), d1 = _mm256_set1_ps(_cvtsh_ss(dn[2 * p + 1]));
            for (int j = 0; j < T; j++) {
                const int64_t r = r0 + j;
                const int8_t *xq = a->q + r * pairs * 64 + p * 64;
                const float *dx = a->dx + (r * pairs + p) * 16;
                const __m256 s0 = _mm256_cvtepi32_ps(dot4(w0, _mm256_loadu_si256((const __m256i *)xq)));
                const __m256 s1 = _mm256_cvtepi32_ps(dot4(w1, _mm256_loadu_si256((const __m256i *)(xq + 32))));
                even[j] = _mm256_fmadd_ps(_mm256_mul_ps(s0, _mm256_loadu_ps(dx)), d0, even[j]);
                odd[j] = _mm256_fmadd_ps(_mm256_mul_ps(s1, _mm256_loadu_ps(dx + 8)), d1, odd[j]);
            }
        }
        for (int j = 0; j < T; j++) {
            const int64_t r = r0 + j;
            /* plus the blocks' m_w s_x, 8 blocks a lane-wise product */
            __m256 sum = _mm256_add_ps(even[j], odd[j]);
            for (int64_t b = 0; b < nbp; b += 8) {
                uint16_t mt[8] = {0};
                float st[8] = {0};
                memcpy(mt, mn + b, sizeof(uint16_t) * (size_t)(nbp - b < 8 ? nbp - b : 8));
                memcpy(st, a->sx + r * nbp + b, sizeof(float) * (size_t)(nbp - b < 8 ? nbp - b : 8));
                sum = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mt)), _mm256_loadu_ps(st), sum);
            }
            y[r * n_out + n] = hsum8(sum);
        }
    }
}
#endif

static void rows(const uint8_t *codes, const uint16_t *d, const uint16_t *m, int64_t pairs, int64_t n0,
                 int64_t n1, const Acts *a, int64_t rows_x, float *y, int64_t n_out) {
    for (int64_t r0 = 0; r0 < rows_x; r0 += TILE) {
        switch (rows_x - r0 < TILE ? rows_x - r0 : TILE) { /* T a constant in each case: unrolled, in registers */
#define CASE(T) case T: tile(codes, d, m, pairs, n0, n1, a, r0, T, y, n_out); break;
            CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
            default: break;
        }
    }
}

/* y [rows_x, n] = x [rows_x, k] W^T for W [n, k] in the layout above. Returns 0, or -1 on bad sizes or
   when the scratch rows cannot be allocated. */
int q8_matmul(const uint8_t *codes, const uint16_t *d, const uint16_t *m, int64_t n, int64_t k,
              const float *x, int64_t rows_x, float *y) {
    if (k % GROUP || n <= 0 || rows_x <= 0) return -1;
    const int64_t nb = k / GROUP, pairs = (nb + 1) / 2;
    Acts a = {malloc((size_t)(rows_x * pairs * 64)), malloc(sizeof(float) * (size_t)(rows_x * pairs * 16)),
              malloc(sizeof(float) * (size_t)(rows_x * pairs * 2))};
    if (!a.q || !a.dx || !a.sx) {
        free(a.q), free(a.dx), free(a.sx);
        return -1;
    }
    for (int64_t r = 0; r < rows_x; r++)
        quantize_row(x + r * k, nb, pairs, a.q + r * pairs * 64, a.dx + r * pairs * 16, a.sx + r * pairs * 2);
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (n * pairs * rows_x >= 2048)
    for (int64_t c = 0; c < chunks; c++)
        rows(codes, d, m, pairs, c * CHUNK, c * CHUNK + CHUNK < n ? c * CHUNK + CHUNK : n, &a, rows_x, y, n);
    free(a.q), free(a.dx), free(a.sx);
    return 0;
}
