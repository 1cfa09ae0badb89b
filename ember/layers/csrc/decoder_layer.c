/* One pre-norm decoder layer of the Llama family in one call, over the other CPU kernels.

   out = h + down(silu(gate(n2)) * up(n2)), h = x + o(attention(rope(qkv(n1)))), n1 = norm1(x),
   (Qwen3: every query and key head of qkv(n1) RMS-normed before the rotation),
   n2 = norm2(h): the same kernels the layer's Python code calls one by one (packed GEMM, RMSNorm,
   rotary, K/V write, paged attention, SwiGLU), in the same order, so the result is the same bits;
   what goes away is a dozen interpreter round trips per layer, the cost that dominates a decode
   step of a small model. The kernels come from their own libraries as function pointers
   (`kernels`), so each keeps one definition. Returns 0, -1 for a position outside the rotary
   tables (nothing written), or the attention kernel's nonzero status. `ember_decoder_stack` runs
   consecutive layers in one call (and the model's final norm after them), for the one round trip per
   layer that remains otherwise. */
#include <stdint.h>

typedef void (*gemm_fn)(const float *x, const void *packed, const float *bias, float *y,
                        int64_t m, int64_t n, int64_t k);
typedef void (*rms_norm_fn)(const float *x, const float *delta, float *sum, const void *weight,
                            int weight_bf16, float *out, int64_t rows, int64_t dim, float eps);
typedef int (*rotary_fn)(float *x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                         const int64_t *positions, const float *cos_table, const float *sin_table,
                         int64_t num_positions);
typedef void (*silu_mul_fn)(const float *gate_up, float *out, int64_t rows, int64_t inner);
typedef void (*write_kv_fn)(const float *key, const float *value, int64_t source_stride, void *keys,
                            void *values, int cache_format, const int64_t *slots, int64_t tokens, int64_t width);
typedef int (*attention_fn)(const void *args);

typedef struct {
    gemm_fn gemm;             /* for the weights' dtype */
    rms_norm_fn rms_norm;
    rotary_fn rotary;
    silu_mul_fn silu_mul;
    write_kv_fn write_kv;
    attention_fn attention;
} kernel_table;

/* The attention kernel's argument block (ember/layers/csrc/paged_attention.c, same layout). */
typedef struct {
    const float *query;
    float *out;
    const void *keys, *values;
    int64_t token_stride, head_stride;
    int64_t num_heads, num_kv_heads, dim_k, dim_v, block_size;
    int cache_format;
    const int32_t *block_tables;
    const int32_t *query_starts, *query_counts, *context_lens;
    int64_t num_seqs, max_blocks;
    float scale, softcap;
    int64_t window;
    int64_t query_stride;
    const int64_t *span_masks;
} attention_args;

typedef struct {
    const void *input_norm, *post_norm; /* [hidden] */
    int norms_bf16;
    float eps;
    const void *qkv, *o, *gate_up, *down; /* packed panels */
    const float *qkv_bias, *o_bias, *gate_up_bias, *down_bias; /* NULL or padded float32 */
    int64_t hidden, num_heads, num_kv_heads, head_dim, inner;
    const float *cos_table, *sin_table;
    int64_t num_positions;
    const void *q_norm, *k_norm; /* NULL, or [head_dim] in the norms' dtype: Qwen3's RMSNorm of every q and k head */
} layer_weights;

typedef struct {
    int64_t m;                  /* tokens */
    const float *x;             /* [m, hidden] */
    float *out;                 /* [m, hidden] */
    float *scratch;             /* m * (2 hidden + qkv width + heads * head_dim + 3 inner) floats */
    const int64_t *positions, *slots;
    attention_args attention;   /* everything but query/out/num_heads/... filled by the caller */
} layer_step;

static int64_t qkv_width(const layer_weights *w) { return (w->num_heads + 2 * w->num_kv_heads) * w->head_dim; }

int ember_decoder_layer(const layer_weights *w, layer_step *s, const kernel_table *k) {
    const int64_t m = s->m, hidden = w->hidden, q_width = w->num_heads * w->head_dim, width = qkv_width(w);
    const int64_t kv_width = w->num_kv_heads * w->head_dim;
    float *normed = s->scratch, *qkv = normed + m * hidden, *attended = qkv + m * width;
    float *gate_up = attended + m * q_width, *activated = gate_up + 2 * m * w->inner, *delta = activated + m * w->inner;

    k->rms_norm(s->x, 0, 0, w->input_norm, w->norms_bf16, normed, m, hidden, w->eps);
    k->gemm(normed, w->qkv, w->qkv_bias, qkv, m, width, hidden);
    if (w->q_norm != 0)  /* in place, each head a row of head_dim (the Python path's call, row by row the same bits) */
        for (int64_t t = 0; t < m; t++) {
            float *heads = qkv + t * width;
            k->rms_norm(heads, 0, 0, w->q_norm, w->norms_bf16, heads, w->num_heads, w->head_dim, w->eps);
            k->rms_norm(heads + q_width, 0, 0, w->k_norm, w->norms_bf16, heads + q_width, w->num_kv_heads, w->head_dim, w->eps);
        }
    /* queries and keys are adjacent heads of each token's row: one rotation covers both */
    if (k->rotary(qkv, m, w->num_heads + w->num_kv_heads, w->head_dim, width, s->positions,
                  w->cos_table, w->sin_table, w->num_positions) != 0)
        return -1;
    attention_args *a = &s->attention;
    k->write_kv(qkv + q_width, qkv + q_width + kv_width, width, (void *)a->keys, (void *)a->values,
                a->cache_format, s->slots, m, kv_width);
    a->query = qkv;
    a->query_stride = width;
    a->out = attended;
    a->num_heads = w->num_heads;
    a->num_kv_heads = w->num_kv_heads;
    a->dim_k = a->dim_v = w->head_dim;
    a->token_stride = kv_width;
    a->head_stride = w->head_dim;
    int status = k->attention(a);
    if (status != 0) return status;
    k->gemm(attended, w->o, w->o_bias, delta, m, hidden, q_width);
    k->rms_norm(s->x, delta, s->out, w->post_norm, w->norms_bf16, normed, m, hidden, w->eps);
    k->gemm(normed, w->gate_up, w->gate_up_bias, gate_up, m, 2 * w->inner, hidden);
    k->silu_mul(gate_up, activated, m, w->inner);
    k->gemm(activated, w->down, w->down_bias, delta, m, hidden, w->inner);
    for (int64_t i = 0; i < m * hidden; i++) s->out[i] += delta[i];
    return 0;
}

/* Layers 0..n-1 in order over s->x, then (final_norm not NULL) the model's final RMSNorm, the last of these
   writing s->out: each one's output is the next one's input, alternating between s->out and `spare`
   ([m, hidden]) so the last lands in s->out. keys[i] / values[i] are layer i's cache; every other step
   argument is shared. Returns the first nonzero status (-1 comes from layer 0, before anything is written:
   the positions are shared). */
int ember_decoder_stack(const layer_weights *const *w, const kernel_table *const *k, const void *const *keys,
                        const void *const *values, int64_t n, layer_step *s, float *spare,
                        const void *final_norm, int final_norm_bf16, float final_eps) {
    const float *x = s->x;
    float *final_out = s->out;
    const int64_t passes = n + (final_norm != 0);
    for (int64_t i = 0; i < n; i++) {
        float *out = (passes - 1 - i) % 2 == 0 ? final_out : spare;
        s->x = x;
        s->out = out;
        s->attention.keys = keys[i];
        s->attention.values = values[i];
        int status = ember_decoder_layer(w[i], s, k[i]);
        if (status != 0) return status;
        x = out;
    }
    if (final_norm != 0)
        k[n - 1]->rms_norm(x, 0, 0, final_norm, final_norm_bf16, final_out, s->m, w[n - 1]->hidden, final_eps);
    return 0;
}
