/* The sizes and field offsets of the structs in kernels.h, as this compiler lays them out: native.py mirrors
   each struct with a ctypes class, and tests/test_native.py checks the two agree field by field, so that a
   field added, moved or resized on one side only fails a test rather than a call. */

#include <stddef.h>
#include <string.h>

#include "kernels.h"

#define SIZE(S) {#S, "", sizeof(S)}
#define FIELD(S, f) {#S, #f, offsetof(S, f)}

static const struct {
    const char *type, *field;
    size_t at;
} LAYOUT[] = {
    SIZE(Tensor),        FIELD(Tensor, data),     FIELD(Tensor, ne),      FIELD(Tensor, nb),
    SIZE(Product),       FIELD(Product, w),       FIELD(Product, n),      FIELD(Product, k),
    FIELD(Product, a),   FIELD(Product, b),       FIELD(Product, rank),   FIELD(Product, spans),
    SIZE(Layer),         FIELD(Layer, norm1),     FIELD(Layer, norm2),    FIELD(Layer, qkv),
    FIELD(Layer, out),   FIELD(Layer, up),        FIELD(Layer, down),
    SIZE(Config),        FIELD(Config, d),        FIELD(Config, heads),   FIELD(Config, kv_heads),
    FIELD(Config, head_dim), FIELD(Config, ffn),  FIELD(Config, eps),
    SIZE(Call),          FIELD(Call, x),          FIELD(Call, cos),       FIELD(Call, sin),
    FIELD(Call, mask),   FIELD(Call, keys),       FIELD(Call, values),    FIELD(Call, layer_stride),
    FIELD(Call, start),  FIELD(Call, T),          FIELD(Call, rows),      FIELD(Call, starts),
    FIELD(Call, lora),   FIELD(Call, work),       FIELD(Call, work_size), FIELD(Call, work_need),
};

/* sizeof(type) where field is "", else offsetof(type, field); -1 where kernels.h has no such struct or field */
int64_t layout(const char *type, const char *field) {
    for (size_t i = 0; i < sizeof LAYOUT / sizeof LAYOUT[0]; i++)
        if (!strcmp(LAYOUT[i].type, type) && !strcmp(LAYOUT[i].field, field)) return (int64_t)LAYOUT[i].at;
    return -1;
}

/* how many fields of `type` the table lists (the test checks the mirror has as many) */
int64_t layout_fields(const char *type) {
    int64_t n = 0;
    for (size_t i = 0; i < sizeof LAYOUT / sizeof LAYOUT[0]; i++) n += !strcmp(LAYOUT[i].type, type) && *LAYOUT[i].field;
    return n;
}
