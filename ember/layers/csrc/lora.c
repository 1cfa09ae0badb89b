/* LoRA beside a compiled product, for C callers (the compiled decoder layer): the base product, then for each row
   whose request holds an adapter slot, y[row] += B_s (A_s x[row]) (B by output segment: a fused layer's parts)
   (punica's BGMV: one gather-free pass over the rows, each row reading its own slot's two small matrices). It has
   the decoder layer's gemm_fn signature; `weight` is a lora_weight naming the base product and the slots
   (ember/layers/lora.py fills it); ember_lora_add adds the adapters' part alone to a base output the Python forward
   computed (a prefill past the compiled layer's rows). The adapters' matrices are float32 (ember_lora_gemm) or bfloat16
   (ember_lora_gemm_bf16: half the bytes a decode step reads, widened to float32 as they are read); activations and
   sums stay float32 either way. */
#include <stdint.h>
#include <string.h>

#define LANES 16

typedef void (*gemm_fn)(const float *x, const void *packed, const float *bias, float *y,
                        int64_t m, int64_t n, int64_t k);

typedef struct {
    gemm_fn base;
    const void *base_weight;
    const float *base_bias;
    const int32_t *const *row_slots; /* the step's slot per row (-1: none), through the rows holder's pointer */
    const int64_t *num_rows;         /* how many rows *row_slots covers this step */
    const void *const *a;            /* per slot: A [rank, k], or NULL where the slot's adapter skips this layer */
    const void *const *b;            /* per slot: each segment's B transposed [part_rank, rows], one after another */
    const int64_t *ranks;            /* per slot: A's rows (parts x part_rank) */
    const int64_t *part_ranks;       /* per slot: the columns one segment reads */
    const int64_t *const *segments;  /* per slot: [num_segments][3] = first output row, end output row, first column */
    const int64_t *num_segments;     /* per slot */
    int64_t num_slots;
} lora_weight;

/* Element i of a matrix of float32 or bfloat16 (float32's upper half, widened as it is read). */
static inline float load(const void *matrix, int64_t i, int is_bf16) {
    if (!is_bf16) return ((const float *)matrix)[i];
    uint32_t bits = (uint32_t)((const uint16_t *)matrix)[i] << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* y[row] += B_s (A_s x[row]) for each row whose slot holds an adapter (the adapter part alone). Inlined into each entry
   point with is_bf16 a constant, so each gets its own vectorised loops. */
static inline __attribute__((always_inline)) void add_adapters(const float *x, const lora_weight *w, float *y, int64_t m,
                                                                int64_t n, int64_t k, int is_bf16) {
    const int32_t *slots = *w->row_slots;
    if (slots == 0 || *w->num_rows != m) return; /* no adapter in this step (or rows the holder does not describe) */
#pragma omp parallel for schedule(static) if (m > 4)
    for (int64_t row = 0; row < m; row++) {
        int32_t slot = slots[row];
        if (slot < 0 || slot >= w->num_slots || w->a[slot] == 0) continue;
        const char *a = w->a[slot], *b = w->b[slot];
        const int64_t element = is_bf16 ? 2 : 4;
        const float *xr = x + row * k;
        int64_t rank = w->ranks[slot];
        float shrunk[rank];
        for (int64_t r = 0; r < rank; r++) {
            /* LANES partial sums: the compiler vectorises the inner loop without reassociating one sum */
            const void *ar = a + r * k * element;
            float partial[LANES] = {0};
            int64_t i = 0;
            for (; i + LANES <= k; i += LANES)
                for (int l = 0; l < LANES; l++) partial[l] += load(ar, i + l, is_bf16) * xr[i + l];
            float sum = 0.0f;
            for (int l = 0; l < LANES; l++) sum += partial[l];
            for (; i < k; i++) sum += load(ar, i, is_bf16) * xr[i];
            shrunk[r] = sum;
        }
        float *yr = y + row * n;
        int64_t part_rank = w->part_ranks[slot];
        const int64_t *segment = w->segments[slot];
        for (int64_t s = 0; s < w->num_segments[slot]; s++, segment += 3) {
            int64_t rows = segment[1] - segment[0];
            float *out = yr + segment[0];
            for (int64_t r = 0; r < part_rank; r++, b += rows * element) { /* out += shrunk[column + r] * B^T[r] */
                float scale = shrunk[segment[2] + r];
                for (int64_t j = 0; j < rows; j++) out[j] += scale * load(b, j, is_bf16);
            }
        }
    }
}

/* The compiled decoder layer's product: the base's, then the adapters'. */
void ember_lora_gemm(const float *x, const void *weight, const float *bias, float *y, int64_t m, int64_t n, int64_t k) {
    const lora_weight *w = (const lora_weight *)weight;
    (void)bias; /* the base product takes the base bias */
    w->base(x, w->base_weight, w->base_bias, y, m, n, k);
    add_adapters(x, w, y, m, n, k, 0);
}

void ember_lora_gemm_bf16(const float *x, const void *weight, const float *bias, float *y, int64_t m, int64_t n,
                          int64_t k) {
    const lora_weight *w = (const lora_weight *)weight;
    (void)bias;
    w->base(x, w->base_weight, w->base_bias, y, m, n, k);
    add_adapters(x, w, y, m, n, k, 1);
}

/* The adapters' part alone, onto a base output y the caller computed (the Python forward: a prefill's many rows). */
void ember_lora_add(const float *x, const void *weight, float *y, int64_t m, int64_t n, int64_t k) {
    add_adapters(x, (const lora_weight *)weight, y, m, n, k, 0);
}

void ember_lora_add_bf16(const float *x, const void *weight, float *y, int64_t m, int64_t n, int64_t k) {
    add_adapters(x, (const lora_weight *)weight, y, m, n, k, 1);
}
