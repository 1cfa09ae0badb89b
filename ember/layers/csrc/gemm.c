/* y[m, n] = x[m, k] . w[n, k]^T (+ bias[n]): float32 activations, float32 or bfloat16 weights.

   The weights are packed once at load into panels of NR = 16 output channels, k-major:
   panel[p][j] = w[16 * panel + j][p] (rows past n are zero). The micro-kernel keeps an MR x 16
   block of y in 12 AVX registers, and for each p loads one panel row (16 weights) and
   broadcasts MR inputs: every weight is read from memory once per block of inputs, whatever m
   is, so a prefill chunk is compute bound. A product of a few rows (decode, speculative
   verification: m <= FEW_ROWS) is memory bound instead, and one panel at a time is one stream
   of loads, which on this kind of core reaches about two thirds of the bandwidth several
   concurrent streams reach (measured: m = 5 at 6-7 GB/s on one core, against 11 GB/s for one
   row over six panels). So a work item then takes a group of adjacent panels (6 for one row,
   3 for more) and walks them together, a few rows per pass over the group's k slice (the later
   passes read the slice from L1), with up to 12 sums in registers; each output still adds its
   k terms in the same order, so results are the same bits whatever the group or the rows beside
   it. k is cut in slices so a panel slice stays in L1 while the micro-kernel walks the block's
   rows; the rows of x in a block stay in L2.
   bfloat16 panels hold column j in the low and column j + 8 in the high half of 32-bit lane j,
   so widening to float32 is one shift and one mask, in registers; sums are float32.
   OpenMP (torch's runtime) splits the panels between threads.
   Built with -march=native: AVX2+FMA where the CPU has them, plain C otherwise. */
#include <stddef.h>
#include <omp.h>
#include "vector_math.h"

/* A bfloat16 panel walk asks for its lines this far ahead: its loop spends more instructions per byte than
   float32's (widening), so the out-of-order window reaches fewer loads ahead (measured +2-7% on decode
   GEMVs streamed from memory; farther, or for float32, it measured no better or worse). */
#define BF16_PREFETCH_BYTES 256
#define NR 16                   /* output channels per panel */
#define MR 6                    /* input rows per micro-kernel call */
#define PANEL_SLICE_BYTES 16384 /* one panel slice, kept in L1 */
#define X_BLOCK_BYTES 262144    /* rows of x kept in L2 while the panels pass over them */
#define FEW_ROWS 16             /* up to this many rows (decode, verification) walk panel groups */
#define FEW_SLICE_BYTES 8192    /* one panel's k slice in a group walked in several row passes */

/* Column j of a packed panel row, as float32. */
static inline float panel_f32(const float *row, int j) { return row[j]; }
static inline float panel_bf16(const uint16_t *row, int j) { return bf16_to_f32(row[2 * (j % 8) + j / 8]); }

#ifdef EMBER_AVX2
typedef struct { __m256 lo, hi; } row16;

static inline __attribute__((always_inline)) row16 load_panel_f32(const float *p) {
    row16 r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    return r;
}
static inline __attribute__((always_inline)) row16 load_panel_bf16(const uint16_t *p) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    row16 r = {_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
               _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)))};
    return r;
}
/* 16 outputs of one row of y: from bias (or zero) on the first slice, else what is there. */
static inline __attribute__((always_inline)) row16 start_row(const float *y, int nr, const float *bias, int first) {
    float tmp[NR] = {0};
    const float *from = first ? bias : y;
    if (from == NULL) { row16 zero = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return zero; }
    if (nr < NR) { for (int j = 0; j < nr; j++) tmp[j] = from[j]; from = tmp; }
    return load_panel_f32(from);
}
static inline __attribute__((always_inline)) void store_row(float *y, row16 c, int nr) {
    if (nr == NR) { _mm256_storeu_ps(y, c.lo); _mm256_storeu_ps(y + 8, c.hi); return; }
    float tmp[NR];
    _mm256_storeu_ps(tmp, c.lo); _mm256_storeu_ps(tmp + 8, c.hi);
    for (int j = 0; j < nr; j++) y[j] = tmp[j];
}
#define START(i) row16 c##i = {_mm256_setzero_ps(), _mm256_setzero_ps()}; \
    if (mr > i) c##i = start_row(y + i * ldy, nr, bias, first);
#define FMA_ROW(i) if (mr > i) { __m256 a = _mm256_broadcast_ss(x + i * ldx + p);            \
    c##i.lo = _mm256_fmadd_ps(a, b.lo, c##i.lo); c##i.hi = _mm256_fmadd_ps(a, b.hi, c##i.hi); }
#define STORE(i) if (mr > i) store_row(y + i * ldy, c##i, nr);
/* y[0..mr, 0..nr] (+)= x[0..mr, 0..kc] . panel[0..kc]; mr is a constant after inlining. */
#define DEFINE_KERNEL(NAME, WTYPE, LOAD, SCALAR)                                               \
static inline __attribute__((always_inline)) void NAME(const float *x, int64_t ldx,            \
        const WTYPE *panel, int64_t kc, const int mr, float *y, int64_t ldy, int nr,           \
        const float *bias, int first) {                                                       \
    START(0) START(1) START(2) START(3) START(4) START(5)                                      \
    for (int64_t p = 0; p < kc; p++) {                                                        \
        row16 b = LOAD(panel + p * NR);                                                       \
        FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4) FMA_ROW(5)                     \
    }                                                                                         \
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)                                     \
}
#else
#define DEFINE_KERNEL(NAME, WTYPE, LOAD, SCALAR)                                               \
static inline void NAME(const float *x, int64_t ldx, const WTYPE *panel, int64_t kc,           \
        const int mr, float *y, int64_t ldy, int nr, const float *bias, int first) {           \
    for (int i = 0; i < mr; i++)                                                              \
        for (int j = 0; j < nr; j++) {                                                        \
            float sum = first ? (bias ? bias[j] : 0.0f) : y[i * ldy + j];                     \
            for (int64_t p = 0; p < kc; p++) sum += x[i * ldx + p] * SCALAR(panel + p * NR, j); \
            y[i * ldy + j] = sum;                                                             \
        }                                                                                     \
}
#endif

DEFINE_KERNEL(kernel_f32, float, load_panel_f32, panel_f32)
DEFINE_KERNEL(kernel_bf16, uint16_t, load_panel_bf16, panel_bf16)

#ifdef EMBER_AVX2
/* y[0..rows, 0..16 g] (+)= x[0..rows, 0..kc] . panels g = 0..groups (full panels, panel_stride
   elements apart); rows and groups are constants after inlining, the sums live in registers. */
#define DEFINE_WIDE_KERNEL(NAME, WTYPE, LOAD, PREFETCH)                                        \
static inline __attribute__((always_inline)) void NAME(const float *x, int64_t ldx,            \
        const WTYPE *panel, int64_t panel_stride, int64_t kc, const int rows, const int groups, \
        float *y, int64_t ldy, const float *bias, int first) {                                \
    row16 c[3][6];                                                                            \
    for (int i = 0; i < rows; i++)                                                            \
        for (int g = 0; g < groups; g++)                                                      \
            c[i][g] = start_row(y + i * ldy + g * NR, NR, bias ? bias + g * NR : NULL, first); \
    for (int64_t p = 0; p < kc; p++)                                                          \
        for (int g = 0; g < groups; g++) {                                                    \
            row16 b = LOAD(panel + g * panel_stride + p * NR);                                \
            if (PREFETCH && p * NR * sizeof(WTYPE) % 64 == 0) /* once per cache line */         \
                _mm_prefetch((const char *)(panel + g * panel_stride + p * NR) + PREFETCH, _MM_HINT_T0); \
            for (int i = 0; i < rows; i++) {                                                  \
                __m256 a = _mm256_broadcast_ss(x + i * ldx + p);                              \
                c[i][g].lo = _mm256_fmadd_ps(a, b.lo, c[i][g].lo);                            \
                c[i][g].hi = _mm256_fmadd_ps(a, b.hi, c[i][g].hi);                            \
            }                                                                                 \
        }                                                                                     \
    for (int i = 0; i < rows; i++)                                                            \
        for (int g = 0; g < groups; g++) store_row(y + i * ldy + g * NR, c[i][g], NR);         \
}
DEFINE_WIDE_KERNEL(wide_f32, float, load_panel_f32, 0)
DEFINE_WIDE_KERNEL(wide_bf16, uint16_t, load_panel_bf16, BF16_PREFETCH_BYTES)
/* Panels a work item of an m-row product may walk together: 6 for one row, 3 up to FEW_ROWS. */
#define MAX_GROUP(rows) ((rows) == 1 ? 6 : (rows) <= FEW_ROWS ? 3 : 1)
/* Rows per wide-kernel pass over a group's k slice: at most 12 sums in registers. */
#define CHUNK(group) ((group) >= 4 ? 1 : (group) == 3 ? 2 : 3)
#else
#define MAX_GROUP(rows) 1
#endif

/* Panels per work item for an m-row product over num_panels panels and `threads` threads: the
   largest group (up to MAX_GROUP) whose busiest thread walks no more panels than with any other. */
static int64_t panel_group(int64_t m, int64_t num_panels, int64_t threads) {
    int64_t best = 1, best_load = num_panels;
    for (int64_t g = 1; g <= MAX_GROUP(m); g++) {
        int64_t items = (num_panels + g - 1) / g, load = (items + threads - 1) / threads * g;
        if (load <= best_load) { best = g; best_load = load; }
    }
    return best;
}

/* Panel t, k slice [p0, p0 + kc), rows [m0, m1) of y: the MR-row micro-kernel over the rows. */
#define DEFINE_PANEL_SLICE(NAME, WTYPE, KERNEL)                                                 \
static inline void NAME(const float *x, const WTYPE *packed, const float *bias, float *y,      \
        int64_t n, int64_t k, int64_t t, int64_t p0, int64_t kc, int64_t m0, int64_t m1) {      \
    int nr = n - t * NR < NR ? (int)(n - t * NR) : NR;                                        \
    const float *b = bias ? bias + t * NR : NULL;                                             \
    const WTYPE *panel = packed + (t * k + p0) * NR;                                          \
    for (int64_t i0 = m0; i0 < m1; i0 += MR) {                                                \
        const float *xi = x + i0 * k + p0;                                                    \
        float *yi = y + i0 * n + t * NR;                                                      \
        switch (m1 - i0 < MR ? (int)(m1 - i0) : MR) {                                         \
        case 6: KERNEL(xi, k, panel, kc, 6, yi, n, nr, b, p0 == 0); break;                    \
        case 5: KERNEL(xi, k, panel, kc, 5, yi, n, nr, b, p0 == 0); break;                    \
        case 4: KERNEL(xi, k, panel, kc, 4, yi, n, nr, b, p0 == 0); break;                    \
        case 3: KERNEL(xi, k, panel, kc, 3, yi, n, nr, b, p0 == 0); break;                    \
        case 2: KERNEL(xi, k, panel, kc, 2, yi, n, nr, b, p0 == 0); break;                    \
        default: KERNEL(xi, k, panel, kc, 1, yi, n, nr, b, p0 == 0); break;                   \
        }                                                                                     \
    }                                                                                         \
}

#ifdef EMBER_AVX2
/* Panels [t, t + group) (all full) over k slice [p0, p0 + kc) for rows [m0, m1) of y, CHUNK(group)
   rows per wide-kernel call; 0 (nothing done) for a shape without a wide kernel. */
#define DEFINE_GROUP_SLICE(NAME, WTYPE, WIDE)                                                   \
static inline int NAME(const float *x, const WTYPE *packed, const float *bias, float *y,       \
        int64_t m0, int64_t m1, int64_t n, int64_t k, int64_t t, int64_t group, int64_t p0, int64_t kc) { \
    const WTYPE *panel = packed + (t * k + p0) * NR;                                          \
    const float *b = bias ? bias + t * NR : NULL;                                             \
    int first = p0 == 0, chunk = CHUNK(group);                                                \
    if (group < 2 || group > 6) return 0;                                                     \
    for (int64_t i0 = m0; i0 < m1; i0 += chunk) {                                             \
        const float *xi = x + i0 * k + p0;                                                    \
        float *yi = y + i0 * n + t * NR;                                                      \
        int rows = m1 - i0 < chunk ? (int)(m1 - i0) : chunk;                                  \
        switch (rows * 8 + group) {                                                           \
        case 8 + 6: WIDE(xi, k, panel, k * NR, kc, 1, 6, yi, n, b, first); break;             \
        case 8 + 5: WIDE(xi, k, panel, k * NR, kc, 1, 5, yi, n, b, first); break;             \
        case 8 + 4: WIDE(xi, k, panel, k * NR, kc, 1, 4, yi, n, b, first); break;             \
        case 8 + 3: WIDE(xi, k, panel, k * NR, kc, 1, 3, yi, n, b, first); break;             \
        case 8 + 2: WIDE(xi, k, panel, k * NR, kc, 1, 2, yi, n, b, first); break;             \
        case 16 + 3: WIDE(xi, k, panel, k * NR, kc, 2, 3, yi, n, b, first); break;            \
        case 16 + 2: WIDE(xi, k, panel, k * NR, kc, 2, 2, yi, n, b, first); break;            \
        default: WIDE(xi, k, panel, k * NR, kc, 3, 2, yi, n, b, first); break; /* 3 rows, 2 panels */ \
        }                                                                                     \
    }                                                                                         \
    return 1;                                                                                 \
}
DEFINE_GROUP_SLICE(group_slice_f32, float, wide_f32)
DEFINE_GROUP_SLICE(group_slice_bf16, uint16_t, wide_bf16)
#define GROUP_SLICE(SUFFIX, ...) group_slice_##SUFFIX(__VA_ARGS__)
#else
#define GROUP_SLICE(SUFFIX, ...) 0
#endif

#define DEFINE_GEMM(NAME, WTYPE, SUFFIX)                                                        \
DEFINE_PANEL_SLICE(panel_slice_##SUFFIX, WTYPE, kernel_##SUFFIX)                               \
void NAME(const float *x, const WTYPE *packed, const float *bias, float *y,                   \
          int64_t m, int64_t n, int64_t k) {                                                  \
    int64_t num_panels = (n + NR - 1) / NR;                                                   \
    int64_t slice_bytes = m > 2 && m <= FEW_ROWS ? FEW_SLICE_BYTES : PANEL_SLICE_BYTES;       \
    int64_t slice = slice_bytes / (NR * (int64_t)sizeof(WTYPE));                              \
    int64_t block_rows = X_BLOCK_BYTES / (k * (int64_t)sizeof(float));                         \
    block_rows = block_rows < MR ? MR : block_rows - block_rows % MR;                         \
    int64_t group = panel_group(m, num_panels, omp_get_max_threads());                       \
    int64_t num_items = (num_panels + group - 1) / group;                                     \
    _Pragma("omp parallel")                                                                   \
    for (int64_t m0 = 0; m0 < m; m0 += block_rows) {                                          \
        int64_t m1 = m0 + block_rows < m ? m0 + block_rows : m;                               \
        _Pragma("omp for schedule(static) nowait")                                            \
        for (int64_t item = 0; item < num_items; item++) {                                    \
            int64_t t0 = item * group, t1 = t0 + group < num_panels ? t0 + group : num_panels; \
            int whole = t1 - t0 == group && t1 * NR <= n;  /* a group of full panels */        \
            for (int64_t p0 = 0; p0 < k; p0 += slice) {                                       \
                int64_t kc = k - p0 < slice ? k - p0 : slice;                                 \
                if (whole && GROUP_SLICE(SUFFIX, x, packed, bias, y, m0, m1, n, k, t0, group, p0, kc)) \
                    continue;                                                                 \
                for (int64_t t = t0; t < t1; t++)                                             \
                    panel_slice_##SUFFIX(x, packed, bias, y, n, k, t, p0, kc, m0, m1);        \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_GEMM(ember_gemm_f32, float, f32)
DEFINE_GEMM(ember_gemm_bf16, uint16_t, bf16)
