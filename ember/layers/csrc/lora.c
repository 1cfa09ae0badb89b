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

/* Sixteen lanes in GCC / Clang vector extensions: AVX-512 registers where the CPU has them, pairs of AVX2 or quads of
   NEON ones elsewhere (-march=native picks). */
typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

/* Element i of a matrix of float32 or bfloat16 (float32's upper half, widened as it is read). */
static inline float load(const void *matrix, int64_t i, int is_bf16) {
    if (!is_bf16) return ((const float *)matrix)[i];
    uint32_t bits = (uint32_t)((const uint16_t *)matrix)[i] << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Elements i .. i+15 of such a matrix, widened to float32. */
static inline v16f load16(const void *matrix, int64_t i, int is_bf16) {
    v16f value;
    if (!is_bf16) {
        memcpy(&value, (const float *)matrix + i, sizeof value);
        return value;
    }
    v16h half;
    memcpy(&half, (const uint16_t *)matrix + i, sizeof half);
    v16u bits = __builtin_convertvector(half, v16u) << 16;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline v16f load_floats(const float *x) {
    v16f value;
    memcpy(&value, x, sizeof value);
    return value;
}

static inline float lane_sum(v16f v) {
    float sum = 0.0f;
    for (int l = 0; l < LANES; l++) sum += v[l];
    return sum;
}

/* shrunk[r] = A[r] . x for r < rank, four rows of A per pass over x (x read once per four). */
static inline __attribute__((always_inline)) void shrink(const char *a, const float *x, int64_t rank, int64_t k,
                                                          int is_bf16, float *shrunk) {
    const int64_t stride = k * (is_bf16 ? 2 : 4);
    int64_t r = 0;
    for (; r + 4 <= rank; r += 4) {
        const char *a0 = a + r * stride, *a1 = a0 + stride, *a2 = a1 + stride, *a3 = a2 + stride;
        v16f acc0 = {0}, acc1 = {0}, acc2 = {0}, acc3 = {0};
        int64_t i = 0;
        for (; i + LANES <= k; i += LANES) {
            v16f xv = load_floats(x + i);
            acc0 += load16(a0, i, is_bf16) * xv;
            acc1 += load16(a1, i, is_bf16) * xv;
            acc2 += load16(a2, i, is_bf16) * xv;
            acc3 += load16(a3, i, is_bf16) * xv;
        }
        float s0 = lane_sum(acc0), s1 = lane_sum(acc1), s2 = lane_sum(acc2), s3 = lane_sum(acc3);
        for (; i < k; i++) {
            s0 += load(a0, i, is_bf16) * x[i];
            s1 += load(a1, i, is_bf16) * x[i];
            s2 += load(a2, i, is_bf16) * x[i];
            s3 += load(a3, i, is_bf16) * x[i];
        }
        shrunk[r] = s0, shrunk[r + 1] = s1, shrunk[r + 2] = s2, shrunk[r + 3] = s3;
    }
    for (; r < rank; r++) {
        const char *ar = a + r * stride;
        v16f acc = {0};
        int64_t i = 0;
        for (; i + LANES <= k; i += LANES) acc += load16(ar, i, is_bf16) * load_floats(x + i);
        float sum = lane_sum(acc);
        for (; i < k; i++) sum += load(ar, i, is_bf16) * x[i];
        shrunk[r] = sum;
    }
}

/* out[j] += sum_r shrunk[r] * B^T[r][j] for j < rows: 32 outputs held in registers across the ranks, so each output
   is read and written once and each element of B^T read once. */
static inline __attribute__((always_inline)) void expand(const char *b_t, const float *shrunk, int64_t part_rank,
                                                          int64_t rows, int is_bf16, float *out) {
    const int64_t stride = rows * (is_bf16 ? 2 : 4);
    int64_t j = 0;
    for (; j + 2 * LANES <= rows; j += 2 * LANES) {
        v16f acc0 = load_floats(out + j), acc1 = load_floats(out + j + LANES);
        for (int64_t r = 0; r < part_rank; r++) {
            const char *br = b_t + r * stride;
            acc0 += shrunk[r] * load16(br, j, is_bf16);
            acc1 += shrunk[r] * load16(br, j + LANES, is_bf16);
        }
        memcpy(out + j, &acc0, sizeof acc0);
        memcpy(out + j + LANES, &acc1, sizeof acc1);
    }
    for (; j < rows; j++) {
        float acc = out[j];
        for (int64_t r = 0; r < part_rank; r++) acc += shrunk[r] * load(b_t + r * stride, j, is_bf16);
        out[j] = acc;
    }
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
        const char *b = w->b[slot];
        const int64_t element = is_bf16 ? 2 : 4;
        int64_t rank = w->ranks[slot];
        float shrunk[rank];
        shrink(w->a[slot], x + row * k, rank, k, is_bf16, shrunk);
        float *yr = y + row * n;
        int64_t part_rank = w->part_ranks[slot];
        const int64_t *segment = w->segments[slot];
        for (int64_t s = 0; s < w->num_segments[slot]; s++, segment += 3) {
            int64_t rows = segment[1] - segment[0];
            expand(b, shrunk + segment[2], part_rank, rows, is_bf16, yr + segment[0]);
            b += part_rank * rows * element;
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
