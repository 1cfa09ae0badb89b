/* y[m, n] = x[m, k] . w[n, k]^T (+ bias[n]): float32 activations, float32 or bfloat16 weights.

   The weights are packed once at load into panels of NR = 16 output channels, k-major:
   panel[p][j] = w[16 * panel + j][p] (rows past n are zero). The micro-kernel keeps an MR x 16
   block of y in registers (12 AVX2 or 6 AVX-512 ones), and for each p loads one panel row (16 weights) and
   broadcasts MR inputs: every weight is read from memory once per block of inputs, whatever m
   is, so a prefill chunk is compute bound. A product of a few rows (decode, speculative
   verification: m <= FEW_ROWS) is memory bound instead, and one panel at a time is one stream
   of loads, which on this kind of core reaches about two thirds of the bandwidth several
   concurrent streams reach (measured: m = 5 at 6-7 GB/s on one core, against 11 GB/s for one
   row over six panels). So a work item then takes a group of adjacent panels (6 for one row,
   3 or 4 for more: MAX_GROUP below) and walks them together, a few rows per pass over the group's
   k slice (the later passes read the slice from L1), with up to 12 (AVX2) or 24 (AVX-512) sums in
   registers; each output still adds its k terms in the same order, so results are the same bits
   whatever the group or the rows beside it. k is cut in slices so a panel slice stays in L1 while the micro-kernel walks the block's
   rows; the rows of x in a block stay in L2.
   bfloat16 panels hold column j in the low and column j + 8 in the high half of 32-bit lane j,
   so widening to float32 is one shift and one mask, in registers; sums are float32. That walk
   spends five instructions per 16 weights and is bound by them, not by memory; where the CPU has
   AVX512-BF16 the panels instead pair adjacent k in each lane (lane j of pair row q: w[j][2q],
   w[j][2q + 1]) and one vdpbf16ps multiplies 32 weights by the activations rounded to bfloat16
   (once per call, as transformers and llama.cpp round a bfloat16 model's activations), summing
   each lane's two exact products into float32. The same packed row walk serves both layouts.
   OpenMP (torch's runtime) splits the panels between threads.
   Built with -march=native: AVX-512 where the CPU has it (one 512-bit register per panel row,
   the same per-output sum order as AVX2, so the same bits), AVX2+FMA, or plain C otherwise. */
#include <stddef.h>
#include <stdlib.h>
#include <omp.h>
#include "vector_math.h"

/* A bfloat16 panel walk asks for its lines this far ahead: its loop spends more instructions per byte than
   float32's (widening), so the out-of-order window reaches fewer loads ahead (measured +2-7% on decode
   GEMVs streamed from memory; farther, or for float32, it measured no better or worse). */
#define BF16_PREFETCH_BYTES 256
/* A float32 pass of 4 or more rows spends as many FMAs per weight, which likewise keeps the window from
   reaching far ahead: asking 1 KB ahead measured 1.07-1.13x at 8-16 rows (batched decode, verification), within
   noise at 5; fewer rows (0.96-1.0x at 2-3), or one (no gain), ask for nothing. */
#define F32_MANY_ROWS_PREFETCH_BYTES 1024
#define NR 16                   /* output channels per panel */
#define MR 6                    /* input rows per micro-kernel call */
#define PANEL_SLICE_BYTES 16384 /* one panel slice, kept in L1 */
#define X_BLOCK_BYTES 262144    /* rows of x kept in L2 while the panels pass over them */
#define FEW_ROWS 16             /* up to this many rows (decode, verification) walk panel groups */
#define FEW_SLICE_BYTES 8192    /* one panel's k slice in a group walked in several row passes */

/* Column j of a packed panel row, as float32. */
static inline float panel_f32(const float *row, int j) { return row[j]; }
static inline float panel_bf16(const uint16_t *row, int j) { return bf16_to_f32(row[2 * (j % 8) + j / 8]); }

#ifdef EMBER_AVX512
/* A panel row of 16 sums (or weights) in one 512-bit register. A bfloat16 panel row widens in its
   own lane order (lane 2j: column j, lane 2j + 1: column j + 8) and its sums stay in that order:
   start_row and store_row move y in and out of it (`lane_order`), once per slice. */
typedef __m512 row16;
static inline __attribute__((always_inline)) row16 zero_row(void) { return _mm512_setzero_ps(); }
static inline __attribute__((always_inline)) row16 load_panel_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __attribute__((always_inline)) row16 load_panel_bf16(const uint16_t *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
static inline __attribute__((always_inline)) row16 fma_row(const float *a, row16 b, row16 c) {
    return _mm512_fmadd_ps(_mm512_set1_ps(*a), b, c);
}
/* 16 outputs of one row of y: from bias (or zero) on the first slice, else what is there. */
static inline __attribute__((always_inline)) row16 start_row(const float *y, int nr, const float *bias, int first,
                                                             int lane_order) {
    const float *from = first ? bias : y;
    if (from == NULL) return zero_row();
    __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << nr) - 1), from);
    if (!lane_order) return v;
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), v);
}
static inline __attribute__((always_inline)) void store_row(float *y, row16 c, int nr, int lane_order) {
    if (lane_order)
        c = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), c);
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), c);
}
#ifdef __AVX512BF16__
#define EMBER_BF16_PAIRS 1
/* A panel row of bfloat16 pairs: lane j holds output j's weights at k = 2q (low half) and 2q + 1. */
static inline __attribute__((always_inline)) row16 load_panel_pairs(const uint32_t *p) {
    return _mm512_castsi512_ps(_mm512_loadu_si512(p));
}
/* c += both halves of the pair of inputs at `a` times each lane's pair of weights (vdpbf16ps). */
static inline __attribute__((always_inline)) row16 dot_pairs(const uint32_t *a, row16 b, row16 c) {
    return _mm512_dpbf16_ps(c, (__m512bh)_mm512_set1_epi32((int)*a), (__m512bh)b);
}
#endif
#elif defined(EMBER_AVX2)
/* A panel row of 16 sums (or weights) in two 256-bit registers, columns in order. */
typedef struct { __m256 lo, hi; } row16;
static inline __attribute__((always_inline)) row16 zero_row(void) {
    row16 r = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    return r;
}
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
static inline __attribute__((always_inline)) row16 fma_row(const float *a, row16 b, row16 c) {
    __m256 broadcast = _mm256_broadcast_ss(a);
    row16 r = {_mm256_fmadd_ps(broadcast, b.lo, c.lo), _mm256_fmadd_ps(broadcast, b.hi, c.hi)};
    return r;
}
/* 16 outputs of one row of y: from bias (or zero) on the first slice, else what is there. */
static inline __attribute__((always_inline)) row16 start_row(const float *y, int nr, const float *bias, int first,
                                                             int lane_order) {
    (void)lane_order;  /* both halves widen to columns in order */
    float tmp[NR] = {0};
    const float *from = first ? bias : y;
    if (from == NULL) return zero_row();
    if (nr < NR) { for (int j = 0; j < nr; j++) tmp[j] = from[j]; from = tmp; }
    return load_panel_f32(from);
}
static inline __attribute__((always_inline)) void store_row(float *y, row16 c, int nr, int lane_order) {
    (void)lane_order;
    if (nr == NR) { _mm256_storeu_ps(y, c.lo); _mm256_storeu_ps(y + 8, c.hi); return; }
    float tmp[NR];
    _mm256_storeu_ps(tmp, c.lo); _mm256_storeu_ps(tmp + 8, c.hi);
    for (int j = 0; j < nr; j++) y[j] = tmp[j];
}
#endif

#ifdef EMBER_AVX2
#define START(i) row16 c##i = zero_row(); if (mr > i) c##i = start_row(y + i * ldy, nr, bias, first, order);
#define FMA_ROW(i, OP) if (mr > i) c##i = OP(x + i * ldx + p, b, c##i);
#define STORE(i) if (mr > i) store_row(y + i * ldy, c##i, nr, order);
/* y[0..mr, 0..nr] (+)= x[0..mr, 0..kc] . panel[0..kc]; mr is a constant after inlining. ORDER: the
   weights widen in the bfloat16 panels' lane order. */
#define DEFINE_KERNEL(NAME, XTYPE, WTYPE, LOAD, FMA, SCALAR, ORDER)                          \
static inline __attribute__((always_inline)) void NAME(const XTYPE *x, int64_t ldx,            \
        const WTYPE *panel, int64_t kc, const int mr, float *y, int64_t ldy, int nr,           \
        const float *bias, int first) {                                                       \
    const int order = ORDER;                                                                  \
    START(0) START(1) START(2) START(3) START(4) START(5)                                      \
    for (int64_t p = 0; p < kc; p++) {                                                        \
        row16 b = LOAD(panel + p * NR);                                                       \
        FMA_ROW(0, FMA) FMA_ROW(1, FMA) FMA_ROW(2, FMA) FMA_ROW(3, FMA) FMA_ROW(4, FMA) FMA_ROW(5, FMA) \
    }                                                                                         \
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)                                     \
}
#else
#define DEFINE_KERNEL(NAME, XTYPE, WTYPE, LOAD, FMA, SCALAR, ORDER)                          \
static inline void NAME(const XTYPE *x, int64_t ldx, const WTYPE *panel, int64_t kc,           \
        const int mr, float *y, int64_t ldy, int nr, const float *bias, int first) {           \
    for (int i = 0; i < mr; i++)                                                              \
        for (int j = 0; j < nr; j++) {                                                        \
            float sum = first ? (bias ? bias[j] : 0.0f) : y[i * ldy + j];                     \
            for (int64_t p = 0; p < kc; p++) sum += x[i * ldx + p] * SCALAR(panel + p * NR, j); \
            y[i * ldy + j] = sum;                                                             \
        }                                                                                     \
}
#endif

DEFINE_KERNEL(kernel_f32, float, float, load_panel_f32, fma_row, panel_f32, 0)
DEFINE_KERNEL(kernel_bf16, float, uint16_t, load_panel_bf16, fma_row, panel_bf16, 1)
#ifdef EMBER_BF16_PAIRS
DEFINE_KERNEL(kernel_pairs, uint32_t, uint32_t, load_panel_pairs, dot_pairs, panel_f32, 0)
#endif

#ifdef EMBER_AVX2
/* Panels a work item of an m-row product may walk together (MAX_GROUP: 6 for one row, 3 or 4 up to
   FEW_ROWS, `many` beyond: the panel kind's MANY_ROWS_GROUP) and rows per wide-kernel pass over a group's
   k slice (CHUNK, at most MAX_CHUNK). */
#ifdef EMBER_AVX512
/* 32 registers: up to 24 sums (4 panels x 6 rows, 6 x 4) beside the panels' weights, so a verification
   of up to 6 rows takes one pass (measured 1.1-1.3x over AVX2's 3 x 2 for 5-16 rows, same bits). A
   bfloat16-pairs prefill walks 2 panels x 6 rows (12 sums: measured 1.1-1.3x at 32-384 rows); float32
   see MANY_ROWS_GROUP_f32. */
#define MAX_GROUP(rows, many) ((rows) == 1 ? 6 : (rows) <= FEW_ROWS ? 4 : (many))
#define MANY_ROWS_GROUP_pairs 2
#define MAX_CHUNK 6
#define CHUNK(group) ((group) >= 5 ? 4 : 6)
#else
#define MAX_GROUP(rows, many) ((rows) == 1 ? 6 : (rows) <= FEW_ROWS ? 3 : 1)
#define MAX_CHUNK 3
/* 16 registers: at most 12 sums. */
#define CHUNK(group) ((group) >= 4 ? 1 : (group) == 3 ? 2 : 3)
#endif
#else
#define MAX_GROUP(rows, many) 1
#endif
/* float32 prefill panels per work item: on a Xeon with AMX (the CPUs of that family have two 512-bit FMA ports and a
   4-cycle FMA latency: one panel's 6 sums cannot keep them busy) up to 4 panels x 6 rows measured 1.2-1.9x one panel
   at 17-512 rows (SmolLM2 and Qwen2.5-1.5B shapes, the same bits); on an AMD EPYC (Zen 5) 2 panels measured
   0.93-1.07x, so CPUs without AMX keep one. */
#if defined(EMBER_AVX512) && defined(__AMX_TILE__)
#define MANY_ROWS_GROUP_f32 4
#else
#define MANY_ROWS_GROUP_f32 1
#endif
#define MANY_ROWS_GROUP_bf16 1

#ifdef EMBER_AVX2
/* y[0..rows, 0..16 g] (+)= x[0..rows, 0..kc] . panels g = 0..groups (full panels, panel_stride
   elements apart); rows and groups are constants after inlining, the sums live in registers. */
#define DEFINE_WIDE_KERNEL(NAME, XTYPE, WTYPE, LOAD, FMA, PREFETCH, ORDER)                   \
static inline __attribute__((always_inline)) void NAME(const XTYPE *x, int64_t ldx,            \
        const WTYPE *panel, int64_t panel_stride, int64_t kc, const int rows, const int groups, \
        float *y, int64_t ldy, const float *bias, int first) {                                \
    row16 c[MAX_CHUNK][6];                                                                    \
    for (int i = 0; i < rows; i++)                                                            \
        for (int g = 0; g < groups; g++)                                                      \
            c[i][g] = start_row(y + i * ldy + g * NR, NR, bias ? bias + g * NR : NULL, first, ORDER); \
    for (int64_t p = 0; p < kc; p++)                                                          \
        for (int g = 0; g < groups; g++) {                                                    \
            row16 b = LOAD(panel + g * panel_stride + p * NR);                                \
            if ((PREFETCH) > 0 && p * NR * sizeof(WTYPE) % 64 == 0) /* once per cache line */   \
                _mm_prefetch((const char *)(panel + g * panel_stride + p * NR) + (PREFETCH), _MM_HINT_T0); \
            for (int i = 0; i < rows; i++) c[i][g] = FMA(x + i * ldx + p, b, c[i][g]);        \
        }                                                                                     \
    for (int i = 0; i < rows; i++)                                                            \
        for (int g = 0; g < groups; g++) store_row(y + i * ldy + g * NR, c[i][g], NR, ORDER);  \
}
DEFINE_WIDE_KERNEL(wide_f32, float, float, load_panel_f32, fma_row, (rows >= 4 ? F32_MANY_ROWS_PREFETCH_BYTES : 0), 0)
DEFINE_WIDE_KERNEL(wide_bf16, float, uint16_t, load_panel_bf16, fma_row, BF16_PREFETCH_BYTES, 1)
#ifdef EMBER_BF16_PAIRS
DEFINE_WIDE_KERNEL(wide_pairs, uint32_t, uint32_t, load_panel_pairs, dot_pairs, 0, 0)
#endif
#endif

/* Panels per work item for an m-row product over num_panels panels and `threads` threads: the
   largest group (up to MAX_GROUP) whose busiest thread walks no more panels than with any other. */
static int64_t panel_group(int64_t m, int64_t num_panels, int64_t threads, int64_t many_rows_group) {
    (void)m, (void)many_rows_group;  /* unused where MAX_GROUP is 1 */
    int64_t best = 1, best_load = num_panels;
    for (int64_t g = 1; g <= MAX_GROUP(m, many_rows_group); g++) {
        int64_t items = (num_panels + g - 1) / g, load = (items + threads - 1) / threads * g;
        if (load <= best_load) { best = g; best_load = load; }
    }
    return best;
}

/* Panel t, k slice [p0, p0 + kc), rows [m0, m1) of y: the MR-row micro-kernel over the rows. k counts
   panel rows; x's rows are ldx elements apart. */
#define DEFINE_PANEL_SLICE(NAME, XTYPE, WTYPE, KERNEL)                                          \
static inline void NAME(const XTYPE *x, int64_t ldx, const WTYPE *packed, const float *bias,   \
        float *y, int64_t n, int64_t k, int64_t t, int64_t p0, int64_t kc, int64_t m0, int64_t m1) { \
    int nr = n - t * NR < NR ? (int)(n - t * NR) : NR;                                        \
    const float *b = bias ? bias + t * NR : NULL;                                             \
    const WTYPE *panel = packed + (t * k + p0) * NR;                                          \
    for (int64_t i0 = m0; i0 < m1; i0 += MR) {                                                \
        const XTYPE *xi = x + i0 * ldx + p0;                                                  \
        float *yi = y + i0 * n + t * NR;                                                      \
        switch (m1 - i0 < MR ? (int)(m1 - i0) : MR) {                                         \
        case 6: KERNEL(xi, ldx, panel, kc, 6, yi, n, nr, b, p0 == 0); break;                  \
        case 5: KERNEL(xi, ldx, panel, kc, 5, yi, n, nr, b, p0 == 0); break;                  \
        case 4: KERNEL(xi, ldx, panel, kc, 4, yi, n, nr, b, p0 == 0); break;                  \
        case 3: KERNEL(xi, ldx, panel, kc, 3, yi, n, nr, b, p0 == 0); break;                  \
        case 2: KERNEL(xi, ldx, panel, kc, 2, yi, n, nr, b, p0 == 0); break;                  \
        default: KERNEL(xi, ldx, panel, kc, 1, yi, n, nr, b, p0 == 0); break;                 \
        }                                                                                     \
    }                                                                                         \
}

#ifdef EMBER_AVX2
#define WIDE_CASE(WIDE, R, G) case (R) * 8 + (G): WIDE(xi, ldx, panel, k * NR, kc, R, G, yi, n, b, first); break;
/* R rows over groups of 2 to 6 panels, for R up to MAX_CHUNK (CHUNK and MAX_GROUP pick the cases reached). */
#define WIDE_CASES(WIDE, R) WIDE_CASE(WIDE, R, 2) WIDE_CASE(WIDE, R, 3) WIDE_CASE(WIDE, R, 4) \
    WIDE_CASE(WIDE, R, 5) WIDE_CASE(WIDE, R, 6)
#if MAX_CHUNK == 6
#define WIDE_CASES_UP_TO_MAX_CHUNK(WIDE) WIDE_CASES(WIDE, 1) WIDE_CASES(WIDE, 2) WIDE_CASES(WIDE, 3) \
    WIDE_CASES(WIDE, 4) WIDE_CASES(WIDE, 5) WIDE_CASES(WIDE, 6)
#else
#define WIDE_CASES_UP_TO_MAX_CHUNK(WIDE) WIDE_CASES(WIDE, 1) WIDE_CASES(WIDE, 2) WIDE_CASES(WIDE, 3)
#endif
/* Panels [t, t + group) (all full) over k slice [p0, p0 + kc) for rows [m0, m1) of y, CHUNK(group)
   rows per wide-kernel call; 0 (nothing done) for a shape without a wide kernel. */
#define DEFINE_GROUP_SLICE(NAME, XTYPE, WTYPE, WIDE)                                            \
static inline int NAME(const XTYPE *x, int64_t ldx, const WTYPE *packed, const float *bias, float *y, \
        int64_t m0, int64_t m1, int64_t n, int64_t k, int64_t t, int64_t group, int64_t p0, int64_t kc) { \
    const WTYPE *panel = packed + (t * k + p0) * NR;                                          \
    const float *b = bias ? bias + t * NR : NULL;                                             \
    int first = p0 == 0, chunk = CHUNK(group);                                                \
    if (group < 2 || group > 6) return 0;                                                     \
    for (int64_t i0 = m0; i0 < m1; i0 += chunk) {                                             \
        const XTYPE *xi = x + i0 * ldx + p0;                                                  \
        float *yi = y + i0 * n + t * NR;                                                      \
        int rows = m1 - i0 < chunk ? (int)(m1 - i0) : chunk;                                  \
        switch (rows * 8 + group) {                                                           \
        WIDE_CASES_UP_TO_MAX_CHUNK(WIDE)                                                      \
        }                                                                                     \
    }                                                                                         \
    return 1;                                                                                 \
}
DEFINE_GROUP_SLICE(group_slice_f32, float, float, wide_f32)
DEFINE_GROUP_SLICE(group_slice_bf16, float, uint16_t, wide_bf16)
#ifdef EMBER_BF16_PAIRS
DEFINE_GROUP_SLICE(group_slice_pairs, uint32_t, uint32_t, wide_pairs)
#endif
#define GROUP_SLICE(SUFFIX, ...) group_slice_##SUFFIX(__VA_ARGS__)
#else
#define GROUP_SLICE(SUFFIX, ...) 0
#endif

/* y = x . w^T (+ bias) over packed panels of k rows each; x's rows are ldx elements apart. */
#define DEFINE_GEMM(NAME, XTYPE, WTYPE, SUFFIX)                                                 \
DEFINE_PANEL_SLICE(panel_slice_##SUFFIX, XTYPE, WTYPE, kernel_##SUFFIX)                        \
static void NAME(const XTYPE *x, int64_t ldx, const WTYPE *packed, const float *bias, float *y, \
                 int64_t m, int64_t n, int64_t k) {                                           \
    int64_t num_panels = (n + NR - 1) / NR;                                                   \
    int64_t slice_bytes = m > 2 && m <= FEW_ROWS ? FEW_SLICE_BYTES : PANEL_SLICE_BYTES;       \
    int64_t slice = slice_bytes / (NR * (int64_t)sizeof(WTYPE));                              \
    int64_t block_rows = X_BLOCK_BYTES / (ldx * (int64_t)sizeof(XTYPE));                      \
    block_rows = block_rows < MR ? MR : block_rows - block_rows % MR;                         \
    int64_t group = panel_group(m, num_panels, omp_get_max_threads(), MANY_ROWS_GROUP_##SUFFIX); \
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
                if (whole && GROUP_SLICE(SUFFIX, x, ldx, packed, bias, y, m0, m1, n, k, t0, group, p0, kc)) \
                    continue;                                                                 \
                for (int64_t t = t0; t < t1; t++)                                             \
                    panel_slice_##SUFFIX(x, ldx, packed, bias, y, n, k, t, p0, kc, m0, m1);   \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
}

DEFINE_GEMM(gemm_f32, float, float, f32)

void ember_gemm_f32(const float *x, const float *packed, const float *bias, float *y,
                    int64_t m, int64_t n, int64_t k) {
    gemm_f32(x, k, packed, bias, y, m, n, k);
}

#ifndef EMBER_BF16_PAIRS
DEFINE_GEMM(gemm_bf16, float, uint16_t, bf16)
#else
DEFINE_GEMM(gemm_pairs, uint32_t, uint32_t, pairs)

/* x [m, k] rounded to bfloat16 (nearest even), two columns per 32-bit word, rows `ldx` words apart
   (k padded with zeros to a multiple of 32 columns). */
static void round_to_pairs(const float *x, uint32_t *pairs, int64_t m, int64_t k, int64_t ldx) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < 2 * ldx; p += 16) {
            __mmask16 valid = p + 16 <= k ? 0xFFFF : p < k ? (__mmask16)((1u << (k - p)) - 1) : 0;
            __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(valid, x + i * k + p));
            _mm256_storeu_si256((__m256i *)(pairs + i * ldx + p / 2), (__m256i)rounded);
        }
}
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define EMBER_AMX 1
#include "amx_gemm.h"
#endif
#endif

#ifdef EMBER_AMX
/* The AMX tile product of many rows: x rounded to pairs as above, in whole blocks of 32 rows (zero past m). */
static int amx_gemm_bf16(const float *x, const uint16_t *packed, const float *bias, float *y, int64_t m, int64_t n, int64_t k) {
    int64_t ldx = (k + 31) / 32 * 16, k_pairs = (k + 1) / 2, padded_rows = (m + 31) / 32 * 32;
    uint32_t *pairs = malloc((size_t)(padded_rows * ldx) * sizeof(uint32_t));
    if (pairs == NULL)
        return 0;
    round_to_pairs(x, pairs, m, k, ldx);
    memset(pairs + m * ldx, 0, (size_t)((padded_rows - m) * ldx) * sizeof(uint32_t));
    amx_gemm_pairs(pairs, ldx, (const uint32_t *)packed, bias, y, m, n, k_pairs);
    free(pairs);
    return 1;
}
#endif

/* The row count from which bfloat16 products run on AMX tiles here; 0 where they never do (not built for them,
   or Linux refused the tile state). */
int ember_gemm_bf16_tile_rows(void) {
#ifdef EMBER_AMX
    return amx_ready() ? AMX_MIN_ROWS : 0;
#else
    return 0;
#endif
}

/* Where the CPU has AVX512-BF16, bfloat16 panels pair adjacent k (see the header) and the
   activations are rounded to bfloat16 for vdpbf16ps; else the panels pair columns j and j + 8. */
int ember_gemm_bf16_pairs(void) {
#ifdef EMBER_BF16_PAIRS
    return 1;
#else
    return 0;
#endif
}

void ember_gemm_bf16(const float *x, const uint16_t *packed, const float *bias, float *y,
                     int64_t m, int64_t n, int64_t k) {
#ifdef EMBER_AMX
    if (m >= AMX_MIN_ROWS && amx_ready() && amx_gemm_bf16(x, packed, bias, y, m, n, k))
        return;
#endif
#ifdef EMBER_BF16_PAIRS
    int64_t ldx = (k + 31) / 32 * 16, k_pairs = (k + 1) / 2;
    uint32_t *pairs = malloc((size_t)(m * ldx) * sizeof(uint32_t));
    if (pairs == NULL) {  /* no room for every row's pairs: one row at a time (the same bits) */
        for (int64_t i = 0; i < m; i++) {
            uint32_t row[ldx];
            round_to_pairs(x + i * k, row, 1, k, ldx);
            gemm_pairs(row, ldx, (const uint32_t *)packed, bias, y + i * n, 1, n, k_pairs);
        }
        return;
    }
    round_to_pairs(x, pairs, m, k, ldx);
    gemm_pairs(pairs, ldx, (const uint32_t *)packed, bias, y, m, n, k_pairs);
    free(pairs);
#else
    gemm_bf16(x, k, packed, bias, y, m, n, k);
#endif
}
