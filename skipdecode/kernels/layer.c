/* Decoder layers of the llama family in one call: RMSNorm, the fused query/key/value product, RoPE, the KV
   cache write, attention, the output product and its residual, RMSNorm, the gate/up product, SiLU(gate) * up,
   the down product and its residual; each product's input quantized to int8 once (w4a8.c), its LoRA term (the
   served adapter's, unmerged) added in float32.

   Eager PyTorch spent about 2 ms of a 5.6 ms step around the products (docs/speed.md): some 45 operator
   calls a layer, each with its dispatch, allocation and thread hand-off. Here a call runs a list of layers
   (one, from Decoder.block; or every layer a SkipDecode position runs) inside one OpenMP team: the row-wise
   work between products runs row by row, the products and the attention split across the threads, with a
   barrier between phases.

   Bits: every value of a row is computed from that row alone in a fixed order (the norm's sum in 16 lanes
   then halves, the products as w4a8.c, the LoRA sums in index order, the attention as attention.c, elementwise
   functions the same whether a loop is vectorized or not): a row has the same bits alone, in a batch, in a
   prefill and in a verify pass. Built with -ffp-contract=off. */

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#define PHASES 9 /* the phases of a layer that layers_forward marks, MARK(0..8) (timing.h) */
#include "timing.h"

#define SPAN 64 /* outputs a LoRA span covers: the outputs of 4 units, what product() hands a thread at a time */

/* Product, Layer, Config and Call: kernels.h, the interface native.py calls */

/* The product whose LoRA term input row r takes: p itself, or the same product (qkv, out, up or down) in the
   layers of row r's adapter */
static inline const Product *lora_of(const Product *p, const Layer *l, const Call *call, int64_t layer, int64_t r) {
    if (!call->lora) return p;
    return (const Product *)((const char *)(call->lora[r / call->x.ne[1]] + layer) + ((const char *)p - (const char *)l));
}

/* RMSNorm of one row: its sum of squares in LANES lanes, then halves added pairwise (dot, kernels.h) */
static void rms_norm(const float *x, const float *w, int64_t d, float eps, float *out) {
    const float inverse = 1.0f / sqrtf(dot(x, x, d) / (float)d + eps);
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * inverse * w[i];
}

/* SiLU(gate) * up for one row */
static void swiglu(const float *gate, const float *up, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + exp_any(-gate[i])) * up[i];
}

/* Vectors of VW floats for the LoRA terms: AVX-512 where built for it, else AVX2 (w4a8.c needs AVX2 and FMA). A
   masked lane reads 0 and is never stored; every stored lane runs fmaf's single-rounding steps. */
#ifdef __AVX512F__
typedef __m512 vf;
typedef __mmask16 vmask;
#define VW 16
static inline vmask vmask_of(int64_t n) { return n >= 16 ? (vmask)0xFFFF : n <= 0 ? (vmask)0 : (vmask)((1u << n) - 1); }
static inline vf vload(const float *p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void vstore(float *p, vf v, vmask m) { _mm512_mask_storeu_ps(p, m, v); }
#define vzero _mm512_setzero_ps
#define vset1 _mm512_set1_ps
#define vfma _mm512_fmadd_ps
#define vadd _mm512_add_ps
#else
typedef __m256 vf;
typedef __m256i vmask;
#define VW 8
static inline vmask vmask_of(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? (n < 0 ? 0 : n) : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vload(const float *p, vmask m) { return _mm256_maskload_ps(p, m); }
static inline void vstore(float *p, vf v, vmask m) { _mm256_maskstore_ps(p, m, v); }
#define vzero _mm256_setzero_ps
#define vset1 _mm256_set1_ps
#define vfma _mm256_fmadd_ps
#define vadd _mm256_add_ps
#endif

/* xa [rank] of T rows at once (T a constant after inlining), columns j..j+2VW: their sums over k in index
   order, in registers (a running sum kept in memory waited on its own store every step) */
static inline __attribute__((always_inline)) void lora_in_tile(const Product *p, const float *x, int64_t ldx,
                                                               float *xa, int64_t ldxa, int64_t j, const int T) {
    const vmask m0 = vmask_of(p->rank - j), m1 = vmask_of(p->rank - j - VW);
    vf acc[4][2];
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = vzero();
    for (int64_t i = 0; i < p->k; i++) {
        const float *ai = p->a + i * p->rank + j;
        const vf a0 = vload(ai, m0), a1 = vload(ai + VW, m1);
        for (int t = 0; t < T; t++) {
            const vf xi = vset1(x[t * ldx + i]);
            acc[t][0] = vfma(xi, a0, acc[t][0]);
            acc[t][1] = vfma(xi, a1, acc[t][1]);
        }
    }
    for (int t = 0; t < T; t++) {
        vstore(xa + t * ldxa + j, acc[t][0], m0);
        vstore(xa + t * ldxa + j + VW, acc[t][1], m1);
    }
}

/* xa [rows, rank] = x [rows, k] a [k, rank]: each value fmaf's running sum over k in index order */
static void lora_in(const Product *p, const float *x, int64_t ldx, int64_t rows, float *xa, int64_t ldxa) {
    for (int64_t j = 0; j < p->rank; j += 2 * VW)
        for (int64_t r = 0; r < rows; r += 4) {
            switch (rows - r < 4 ? rows - r : 4) {
#define CASE(T) case T: lora_in_tile(p, x + r * ldx, ldx, xa + r * ldxa, ldxa, j, T); break;
                CASE(1) CASE(2) CASE(3) CASE(4)
#undef CASE
                default: break;
            }
        }
}

/* t [n0, n1) += (xa b) [n0, n1) for one row (n0 a multiple of SPAN): each value's sum over the rank in index
   order from 0, then added. The rank rows outside a span's [j0, j1) add exact zeros (the sum starts at +0 and
   x * 0 added to it leaves it as it is), so they are skipped: the same bits for a third of the reads. */
static void lora_out(const Product *p, const float *xa, int64_t n0, int64_t n1, float *t) {
    for (int64_t n = n0; n < n1; n += 4 * VW) {
        vmask m[4];
        vf acc[4];
        for (int v = 0; v < 4; v++) m[v] = vmask_of(n1 - n - v * VW), acc[v] = vzero();
        const int64_t j0 = p->spans[2 * (n / SPAN)], j1 = p->spans[2 * (n / SPAN) + 1];
        for (int64_t j = j0; j < j1; j++) {
            const float *bj = p->b + j * p->n + n;
            const vf x = vset1(xa[j]);
            for (int v = 0; v < 4; v++) acc[v] = vfma(x, vload(bj + v * VW, m[v]), acc[v]);
        }
        for (int v = 0; v < 4; v++) {
            float *out = t + n + v * VW;
            vstore(out, vadd(vload(out, m[v]), acc[v]), m[v]);
        }
    }
}

/* A product's input rows quantized (w4a8.c), and their LoRA xa; `x` holds the float rows they came from */
typedef struct {
    float *x, *xa;
    int8_t *q;
    float *dx, *sx;
} Acts;

/* The buffers of a call: the products' outputs, shared by the team */
typedef struct {
    float *qkv, *att, *up, *sum;
    int64_t rank_max;
} Work;

/* The product's outputs in units u0..u1 for every row: y = W x (+ (x a) b), or with `residual`
   residual += that. The order of a value's float steps is the same whatever u0, u1 or the thread. */
static void product_units(const Product *p, const Layer *l, const Call *call, int64_t layer, const Acts *in,
                          const Work *wk, int64_t rows, int64_t u0, int64_t u1, float *y, int64_t ldy, float *residual,
                          int64_t ldr) {
    float *tmp = residual ? wk->sum : y; /* with a residual the product lands in sum first */
    const int64_t ldt = residual ? p->n : ldy;
    q8_units(p->w, p->k, u0, u1, p->n, in->q, in->dx, in->sx, rows, tmp, ldt);
    const int64_t n0 = u0 * ROWS, n1 = u1 * ROWS < p->n ? u1 * ROWS : p->n;
    for (int64_t r = 0; r < rows; r++) {
        float *t = tmp + r * ldt;
        const Product *lp = lora_of(p, l, call, layer, r);
        if (lp->a) lora_out(lp, in->xa + r * wk->rank_max, n0, n1, t);
        if (residual)
            for (int64_t n = n0; n < n1; n++) residual[r * ldr + n] = residual[r * ldr + n] + t[n];
    }
}

/* Rows r0..r1 of a product's input: quantized, and their LoRA xa (row by row where rows take different adapters:
   a row's sums are the same in a tile of one as of four) */
static void prepare(const Product *p, const Layer *l, const Call *call, int64_t layer, const Acts *a, int64_t rank_max,
                    int64_t r0, int64_t r1) {
    const int64_t nb = p->k / GROUP;
    for (int64_t r = r0; r < r1; r++) q8_quantize(a->x + r * p->k, p->k, a->q + r * p->k, a->dx + r * nb, a->sx + r * nb);
    if (!call->lora) {
        if (p->a) lora_in(p, a->x + r0 * p->k, p->k, r1 - r0, a->xa + r0 * rank_max, rank_max);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const Product *lp = lora_of(p, l, call, layer, r);
        if (lp->a) lora_in(lp, a->x + r * p->k, p->k, 1, a->xa + r * rank_max, rank_max);
    }
}

/* every unit of a product, shared among the team's threads (chunks of 4 units: one head of 64 rows) */
static void product(const Product *p, const Layer *l, const Call *call, int64_t layer, const Acts *in, const Work *wk,
                    int64_t rows, float *y, int64_t ldy, float *residual, int64_t ldr) {
    const int64_t units = (p->n + ROWS - 1) / ROWS;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; u += 4)
        product_units(p, l, call, layer, in, wk, rows, u, u + 4 < units ? u + 4 : units, y, ldy, residual, ldr);
}

static void rope(float *t, const float *cos, const float *sin, int64_t hd, float *tmp) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) tmp[i] = t[i] * cos[i] + t[i + half] * sin[i];
    for (int64_t i = half; i < hd; i++) tmp[i] = t[i] * cos[i] + t[i - half] * sin[i];
    memcpy(t, tmp, sizeof(float) * (size_t)hd);
}

/* A call's scratch, cut from one buffer: `take` hands out n bytes on a 64-byte boundary; with no buffer (base
   NULL) it only counts them, so one walk sizes the buffer and the next cuts it the same way */
typedef struct {
    char *base;
    size_t used;
} Carve;

static void *take(Carve *c, size_t n) {
    void *p = c->base ? c->base + c->used : NULL;
    c->used += (n + 63) & ~(size_t)63;
    return p;
}

static Acts acts(Carve *c, int64_t rows, int64_t k_max, int64_t rank_max) {
    Acts a = {take(c, sizeof(float) * (size_t)(rows * k_max)), take(c, sizeof(float) * (size_t)(rows * rank_max + 1)),
              take(c, (size_t)(rows * k_max)), take(c, sizeof(float) * (size_t)(rows * k_max / GROUP)),
              take(c, sizeof(float) * (size_t)(rows * k_max / GROUP))};
    return a;
}

/* The team's scratch: the products' outputs (wk), and past OWN_ROWS rows the inputs the threads share */
static void team_scratch(Carve *c, Work *wk, Acts *shared, int own, int64_t R, int64_t width, const Config *cf,
                         int64_t k_max) {
    const int64_t d = cf->d, ffn = cf->ffn;
    wk->qkv = take(c, sizeof(float) * (size_t)(R * width));
    wk->att = take(c, sizeof(float) * (size_t)(R * cf->heads * cf->head_dim));
    wk->up = take(c, sizeof(float) * (size_t)(R * 2 * ffn));
    wk->sum = take(c, sizeof(float) * (size_t)(R * (d > 2 * ffn ? d : 2 * ffn)));
    if (!own) *shared = acts(c, R, k_max, wk->rank_max);
}

/* A thread's own scratch: the attention's scores (then RoPE's row) and columns, and with few rows its inputs */
typedef struct {
    float *scores;
    int64_t *seen;
    Acts mine;
} Own;

static Own own_scratch(Carve *c, int64_t T, int64_t hd, int own, int64_t rows, int64_t k_max, int64_t rank_max) {
    Own o = {take(c, sizeof(float) * (size_t)(T + hd)), take(c, sizeof(int64_t) * (size_t)T), {0}};
    if (own) o.mine = acts(c, rows, k_max, rank_max);
    return o;
}

/* Up to this many rows, every thread prepares a product's whole input for itself (the same bits in each):
   a decode step's few rows cost less than a barrier; more rows are split among the threads. */
#define OWN_ROWS 8

/* The layers of a call (kernels.h).

   Barriers a layer: after the query/key/value product, after the attention, after each of the other three
   products (their inputs need every output of the step before); with more than OWN_ROWS rows, also after
   each preparation of a product's input. RoPE, the cache write and the attention of a kv head's group
   run in one task per batch row, with no barrier between them. */
int layers_forward(const Layer *layers, const Config *c, const int64_t *which, int64_t count, Call *call) {
    const int64_t B = call->x.ne[0], S = call->x.ne[1], R = B * S, d = c->d, hd = c->head_dim, H = c->heads;
    const int64_t Hkv = c->kv_heads, width = (H + 2 * Hkv) * hd, group = H / Hkv;
    float *const x = call->x.data;
    const float *const mask = call->mask.data;
    const int64_t rb = call->cos.nb[0], rs = call->cos.nb[1], mb = call->mask.nb[0], ms = call->mask.nb[2];
    const int64_t cb = call->keys.nb[0], ch = call->keys.nb[1], ct = call->keys.nb[2];
    if (d % GROUP || (H * hd) % GROUP || c->ffn % GROUP || hd % 2) return -2;
    if (call->x.ne[2] != d || call->x.nb[2] != 1 || call->x.nb[1] != d || call->x.nb[0] != S * d) return -2;
    if (call->cos.data && (call->cos.ne[3] != hd || call->cos.nb[3] != 1 || call->sin.nb[0] != rb || call->sin.nb[1] != rs ||
                           call->sin.nb[3] != 1))
        return -2;
    if (mask && call->mask.nb[3] != 1) return -2;
    for (int j = 0; j < DIMS; j++)
        if (call->values.nb[j] != call->keys.nb[j]) return -2;
    if (call->keys.ne[3] != hd || call->keys.nb[3] != 1) return -2;
    Work wk = {0};
    int64_t k_max = d > c->ffn ? d : c->ffn;
    k_max = k_max > H * hd ? k_max : H * hd;
    for (int64_t b = -1; b < (call->lora ? B : 0); b++) /* the call's layers, then each row's adapter's */
        for (int64_t i = 0; i < count; i++) {
            const Layer *l = (b < 0 ? layers : call->lora[b]) + which[i];
            const Product *ps[4] = {&l->qkv, &l->out, &l->up, &l->down};
            for (int j = 0; j < 4; j++)
                if (ps[j]->a && ps[j]->rank > wk.rank_max) wk.rank_max = ps[j]->rank;
        }
    const int own = R <= OWN_ROWS;
    /* the scratch: the team's (wk, and the shared inputs past OWN_ROWS rows), then each thread's (Own), in
       call->work where it holds them (the buffer native.Layers keeps), else allocated for this call */
    Carve size = {NULL, 0};
    Acts shared = {0};
    team_scratch(&size, &wk, &shared, own, R, width, c, k_max);
    const size_t team = size.used, threads = (size_t)omp_get_max_threads(); /* a team has at most this many */
    own_scratch(&size, call->T, hd, own, R, k_max, wk.rank_max);
    const size_t each = size.used - team, need = team + threads * each + 64; /* + 64: the base aligned */
    call->work_need = (int64_t)need;
    char *buffer = call->work && (size_t)call->work_size >= need ? (char *)call->work : NULL, *allocated = NULL;
    if (!buffer) buffer = allocated = malloc(need);
    if (!buffer) return -1;
    Carve cut = {buffer + (64 - (uintptr_t)buffer % 64) % 64, 0};
    team_scratch(&cut, &wk, &shared, own, R, width, c, k_max);
    MARK_START; /* timing only (timing.h): nothing unless built with -DLAYER_TIMES */
#pragma omp parallel
    {
        Carve mine_cut = {cut.base + team + (size_t)omp_get_thread_num() * each, 0};
        Own scratch = own_scratch(&mine_cut, call->T, hd, own, R, k_max, wk.rank_max);
        float *scores = scratch.scores;
        int64_t *seen = scratch.seen;
        Acts mine = own ? scratch.mine : shared;
        Acts *in = &mine;
/* a product's input rows, each row r made by `make` into in->x and prepared: by every thread for itself, or
   split among the threads and then shared */
#define INPUT(p, make)                                                    \
    do {                                                                  \
        if (own) {                                                        \
            for (int64_t r = 0; r < R; r++) make;                         \
            prepare(p, l, call, which[i], in, wk.rank_max, 0, R);         \
        } else {                                                          \
            _Pragma("omp for schedule(static)")                           \
            for (int64_t r4 = 0; r4 < R; r4 += 4) {                       \
                const int64_t r1 = r4 + 4 < R ? r4 + 4 : R;               \
                for (int64_t r = r4; r < r1; r++) make;                   \
                prepare(p, l, call, which[i], in, wk.rank_max, r4, r1);   \
            }                                                             \
        }                                                                 \
    } while (0)
        for (int64_t i = 0; i < count; i++) {
            const Layer *l = layers + which[i];
            float *keys = call->keys.data + which[i] * call->layer_stride;
            float *values = call->values.data + which[i] * call->layer_stride;
            INPUT(&l->qkv, rms_norm(x + r * d, l->norm1, d, c->eps, in->x + r * d));
            MARK(0);
            product(&l->qkv, l, call, which[i], in, &wk, R, wk.qkv, width, NULL, 0);
            MARK(1);
            /* per batch row and kv head: RoPE on its keys and its group's queries, its keys and values
               into the cache, then its group's attention */
#pragma omp for schedule(static)
            for (int64_t task = 0; task < B * Hkv; task++) {
                const int64_t b = task / Hkv, g = task % Hkv;
                const int64_t slot = call->rows ? call->rows[b] : b;
                const int64_t start = call->starts ? call->starts[b] : call->start, T = start + S;
                for (int64_t s = 0; s < S; s++) {
                    const int64_t t = start + s;
                    float *row = wk.qkv + (b * S + s) * width;
                    if (call->cos.data) {
                        const float *cos = call->cos.data + b * rb + s * rs;
                        const float *sin = call->sin.data + b * rb + s * rs;
                        for (int64_t h = g * group; h < (g + 1) * group; h++) rope(row + h * hd, cos, sin, hd, scores + call->T);
                        rope(row + (H + g) * hd, cos, sin, hd, scores + call->T);
                    }
                    memcpy(keys + slot * cb + g * ch + t * ct, row + (H + g) * hd, sizeof(float) * (size_t)hd);
                    memcpy(values + slot * cb + g * ch + t * ct, row + (H + Hkv + g) * hd,
                           sizeof(float) * (size_t)hd);
                }
                const float *kr = keys + slot * cb + g * ch, *vr = values + slot * cb + g * ch;
                for (int64_t s = 0; s < S; s++)
                    for (int64_t h = g * group; h < (g + 1) * group; h++)
                        attention_row(wk.qkv + (b * S + s) * width + h * hd, kr, vr, ct, mask ? mask + b * mb + s * ms : NULL,
                                      T, hd,
                                      wk.att + (b * S + s) * H * hd + h * hd, scores, seen);
            }
            MARK(2);
            INPUT(&l->out, memcpy(in->x + r * H * hd, wk.att + r * H * hd, sizeof(float) * (size_t)(H * hd)));
            MARK(3);
            product(&l->out, l, call, which[i], in, &wk, R, NULL, 0, x, d);
            MARK(4);
            INPUT(&l->up, rms_norm(x + r * d, l->norm2, d, c->eps, in->x + r * d));
            MARK(5);
            product(&l->up, l, call, which[i], in, &wk, R, wk.up, 2 * c->ffn, NULL, 0);
            MARK(6);
            INPUT(&l->down, swiglu(wk.up + r * 2 * c->ffn, wk.up + r * 2 * c->ffn + c->ffn, c->ffn, in->x + r * c->ffn));
            MARK(7);
            product(&l->down, l, call, which[i], in, &wk, R, NULL, 0, x, d);
            MARK(8);
        }
#undef INPUT
    }
    free(allocated);
    return 0;
}
