/* What the C kernels share (w4a8.c: the 4-bit products; attention.c; layer.c: a decoder layer in one call), and
   the interface native.py calls: its structs, each mirrored there by one ctypes class of the same name and
   fields (layout.c reports their sizes and offsets, which tests/test_native.py checks against the mirror). */
#ifndef SKIPDECODE_KERNELS_H
#define SKIPDECODE_KERNELS_H

#include <math.h>
#include <stdint.h>

#define GROUP 32 /* weights per Q4_1 block, along the input */
#define ROWS 16  /* weight rows interleaved in one unit of the layout (one AVX-512 lane each) */
#define UNIT (ROWS * GROUP / 2 + 2 * ROWS * 2) /* bytes of one block of ROWS rows: codes, then d and m */
#define LANES 16 /* the partial sums of a row's reductions (dot) */
#define DIMS 4   /* dimensions of a Tensor */

/* ---- The interface (native.py) ------------------------------------------------------------------------ */

/* A tensor argument, as ggml's ne and nb: float32 data and, per dimension, outermost first as PyTorch lists
   them, its size and its stride in elements (not bytes); the dimensions past the tensor's have size 1. Each
   kernel says which dimensions must be contiguous. data NULL: the argument is absent. */
typedef struct {
    float *data;
    int64_t ne[DIMS], nb[DIMS];
} Tensor;

typedef struct {
    const uint8_t *w; /* the Q4_1 blocks in w4a8.c's layout */
    int64_t n, k;     /* outputs, inputs */
    const float *a;   /* LoRA: a [k, rank], b [rank, n] (the scale folded into b); a NULL: none */
    const float *b;
    int64_t rank;
    const int32_t *spans; /* per SPAN outputs, the rank rows [j0, j1) of b that hold a nonzero there: a fused
                             matrix's b is block-diagonal (query/key/value, gate/up), two thirds or half zero */
} Product;

typedef struct {
    const float *norm1, *norm2; /* RMSNorm weights [d] */
    Product qkv, out, up, down; /* up: gate then up, [2 ffn] outputs */
} Layer;

typedef struct {
    int64_t d, heads, kv_heads, head_dim, ffn;
    float eps;
} Config;

/* What one layers_forward call runs on (the layers and their sizes aside) */
typedef struct {
    Tensor x;            /* hidden states [B, S, d], contiguous, updated in place */
    Tensor cos, sin;     /* RoPE: cos and signed sin (transformer.Decoder.rope) [B, S, 1, hd], one set of
                            strides, hd contiguous; data NULL: no RoPE */
    Tensor mask;         /* additive mask [B, 1, S, >= T], columns contiguous; data NULL: every column */
    Tensor keys, values; /* layer 0's cache [cache rows, kv heads, columns, hd], one set of strides (keys'), hd
                            contiguous; layer l's layer_stride elements on */
    int64_t layer_stride;
    int64_t start, T; /* the S new columns go at start..; attention over columns 0..T-1 */
    /* Rows at different positions (skipdecode/slots.py: a continuous batch): row b's columns live in cache row
       rows[b] and its S new ones go at starts[b]..; it attends over columns 0..starts[b] + S - 1 (T: at least
       the largest). NULL: cache row b, and `start` for every row. */
    const int64_t *rows, *starts;
    /* Rows of several adapters over one base (a continuous batch's rows of different models): row b takes the
       LoRA terms of lora[b]'s layers (the same base matrices, its own factors). NULL: `layers`' for every row. */
    const Layer *const *lora;
    /* Scratch (as ggml_cplan's work buffer): work_size bytes at work, kept by the caller between calls; the call
       sets work_need to the bytes it takes, and allocates them itself for this call where work_size is short
       (work NULL: always). */
    uint8_t *work;
    int64_t work_size, work_need;
} Call;

/* out [B, H, S, hd] = softmax(q k^T / sqrt(hd) + mask) v for q [B, H, S, hd], keys and values [B, Hkv, T, hd]
   (one set of strides), mask [B, 1, S, T] (data NULL: every column); hd contiguous, the mask's columns too
   (attention.c). Returns 0, -1 when scratch memory is short, -2 when the shapes do not fit. */
int attention(const Tensor *q, const Tensor *k, const Tensor *v, const Tensor *mask, const Tensor *out);

/* layers[which[0]], ..., layers[which[count - 1]] on call->x (layer.c). Returns 0, -1 when scratch memory is
   short, -2 when the sizes do not fit the kernels; sets call->work_need. */
int layers_forward(const Layer *layers, const Config *c, const int64_t *which, int64_t count, Call *call);

/* ---- Between the kernels -------------------------------------------------------------------------------- */

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

/* a . b in LANES lanes along the vector, then halves added pairwise: the same order for every call (attention's
   scores; RMSNorm's sum of squares as dot(x, x)) */
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
