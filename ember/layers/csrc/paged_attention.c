/* Attention of a flat batch of queries over a paged KV cache, read through the block tables.

   Sequence s owns query rows [query_starts[s], query_starts[s] + query_counts[s]) at positions
   context_lens[s] - query_counts[s] + i; query i sees keys up to its own position (and, with a
   window W > 0, only the last W of them). Key and value rows of token t live in block
   block_tables[s][t / block_size] (ids < 0: blocks given back, behind every window), offset
   t % block_size. A work item walks its keys block by block with an online softmax (running max,
   sum, weighted values), so nothing is gathered or padded; OpenMP splits the items (plan_items).
   A prefill item is (sequence, kv head, chunk of QUERY_CHUNK queries): its grouped query heads
   share each K/V row read. A short run of queries (a decode step, a verification) has little
   compute per byte, so its items are spans of SPAN_TOKENS keys over every kv head: each block's
   rows are read front to back once (a kv head's own part of each row, read alone, came from
   memory several times slower), and a long context spreads over the threads, its spans' states
   merged in a fixed order. Where the CPU has AVX-512, every item is walked by span_attention.h instead, one
   span-sized window of keys at a time (the window's scores first, then its softmax step, then its values;
   against this file's block walk, one process: 9 queries over 450 keys 3.77 -> 2.73 ms for 30 layers, then
   2.27 -> 1.88 ms with vector visibility masks; prefill of 376 keys 9.0 -> 5.9 ms for 6 layers, then 5.4 -> 4.1;
   decode steps 0.95-1.02x, then 1.04-1.08x).
   The same code serves MLA's absorbed decode: one kv head whose key rows are the cached latent
   and rope key (dim_k wide) and whose values are the first dim_v entries of those rows.
   A tree of drafted tokens (Medusa verification) is a span whose queries see the context before
   the span and, within it, only their ancestors: query row i's `span_masks` entry has bit j set
   when it sees the span's token j (a chain, or any query outside a tree, has -1: plain causal).
   float32, bfloat16 or float8 e4m3 cache (`cache_format`; widened per block), float32 queries,
   outputs and sums. ember_write_kv stores a step's new keys and values in their slots first
   (float32 in, the cache's format out, rounded to nearest even as torch rounds: bfloat16, and
   e4m3 saturating at +-448 as torch's float8_e4m3fn cast does). */
#include <stdlib.h>
#include <math.h>
#include "vector_math.h"

#define QUERY_CHUNK 8
#define SPAN_QUERIES 64  /* a run of at most this many queries (a decode step, a verification, a tree) is read in spans */
#define MAX_ROWS 1024  /* query rows (queries x grouped heads) of one work item */
#define SCORE_PADDING 8  /* a row's scores are read 8 at a time: room past the block's last key */
#define SPAN_TOKENS 128  /* a decoding sequence's keys per work item (its spans are merged after) */

enum { CACHE_F32 = 0, CACHE_BF16 = 1, CACHE_E4M3 = 2, CACHE_E5M2 = 3 };  /* cache_format (cpu_attention.CACHE_FORMATS) */

typedef struct {
    const float *query;          /* [T, num_heads, dim_k], tokens query_stride floats apart */
    float *out;                  /* [T, num_heads, dim_v] */
    const void *keys, *values;   /* element (block, offset, kv head, d) at
                                    (block * block_size + offset) * token_stride + kv_head * head_stride + d */
    int64_t token_stride, head_stride;
    int64_t num_heads, num_kv_heads, dim_k, dim_v, block_size;
    int cache_format;            /* CACHE_F32, CACHE_BF16, CACHE_E4M3 or CACHE_E5M2 */
    const int32_t *block_tables; /* [num_seqs, max_blocks] */
    const int32_t *query_starts, *query_counts, *context_lens;
    int64_t num_seqs, max_blocks;
    float scale, softcap;        /* softcap 0: none */
    int64_t window;              /* 0: none */
    int64_t query_stride;
    const int64_t *span_masks;   /* NULL, or per query row of the flat batch: -1 causal, else a tree mask (see attend) */
} attention_args;

/* float8 e4m3 (OCP, "fn": no infinities, S.1111.111 is NaN) -> float32 in integer steps the compiler
   vectorizes: exponent field e > 0 is a normal float32 (exponent rebiased from 7 to 127, mantissa
   shifted up), e = 0 the subnormals m * 2^-9 (an exact int -> float conversion, no float32
   subnormal arithmetic, so flush-to-zero modes cannot touch it). */
static inline float e4m3_to_f32(uint8_t code) {
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24, magnitude = code & 0x7Fu;
    union { float number; uint32_t bits; } subnormal = {(float)(int32_t)(magnitude & 7u) * 0x1p-9f};
    const uint32_t is_normal = 0u - (uint32_t)(magnitude >= 8u), is_nan = 0u - (uint32_t)(magnitude == 0x7Fu);
    const uint32_t normal = (magnitude << 20) + (120u << 23);
    /* selects as masks, not branches: the widening loop vectorizes */
    union { uint32_t bits; float number; } out = {sign | (((normal & is_normal) | (subnormal.bits & ~is_normal)) & ~is_nan)
                                                  | (0x7FC00000u & is_nan)};
    return out.number;
}

/* float8 e5m2 (IEEE-like: infinities and NaNs, the top byte of a float16) -> float32: exponent field e > 0 is
   a normal number (rebiased from 15 to 127, e = 31 the infinities and NaNs, whose float32 exponent is all ones),
   e = 0 the subnormals m * 2^-16 (an exact int -> float conversion). */
static inline float e5m2_to_f32(uint8_t code) {
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24, magnitude = code & 0x7Fu;
    union { float number; uint32_t bits; } subnormal = {(float)(int32_t)(magnitude & 3u) * 0x1p-16f};
    const uint32_t is_normal = 0u - (uint32_t)(magnitude >= 4u), is_special = 0u - (uint32_t)(magnitude >= 0x7Cu);
    const uint32_t normal = (magnitude << 21) + (112u << 23);
    union { uint32_t bits; float number; } out = {sign | (((normal & is_normal) | (subnormal.bits & ~is_normal)) & ~is_special)
                                                  | (((magnitude << 21) | 0x7F800000u) & is_special)};
    return out.number;
}

/* Rows [first, first + count) of one block for one kv head, as float32 pointers (widened into buf). */
static const float *block_rows(const attention_args *a, const void *base, int64_t block, int64_t first,
                               int64_t count, int64_t kv_head, int64_t dim, float *buf) {
    int64_t start = (block * a->block_size + first) * a->token_stride + kv_head * a->head_stride;
    if (a->cache_format == CACHE_F32) return (const float *)base + start;  /* rows token_stride apart */
    if (a->cache_format == CACHE_E4M3) {
        const uint8_t *src = (const uint8_t *)base + start;
        for (int64_t t = 0; t < count; t++)
            for (int64_t d = 0; d < dim; d++) buf[t * a->token_stride + d] = e4m3_to_f32(src[t * a->token_stride + d]);
        return buf;
    }
    if (a->cache_format == CACHE_E5M2) {
        const uint8_t *src = (const uint8_t *)base + start;
        for (int64_t t = 0; t < count; t++)
            for (int64_t d = 0; d < dim; d++) buf[t * a->token_stride + d] = e5m2_to_f32(src[t * a->token_stride + d]);
        return buf;
    }
    const uint16_t *src = (const uint16_t *)base + start;
    for (int64_t t = 0; t < count; t++)
        for (int64_t d = 0; d < dim; d++) buf[t * a->token_stride + d] = bf16_to_f32(src[t * a->token_stride + d]);
    return buf;
}

#ifndef EMBER_AVX512  /* the block walk's row updates (span_attention.h replaces them) */
/* One query row's online-softmax step over keys [t0, t1) of a block (all visible): scores into s,
   then the running max, sum and weighted values (o, dv wide) move on. Portable: any widths. */
static void update_row_portable(const attention_args *a, const float *qr, const float *keys, const float *values,
                                int64_t t0, int64_t t1, float *s, float *o, float *row_max, float *row_sum) {
    float best = -INFINITY;
    for (int64_t t = t0; t < t1; t++) {
        const float *k = keys + t * a->token_stride;
        float dot = 0.0f;
        #pragma omp simd reduction(+:dot)
        for (int64_t d = 0; d < a->dim_k; d++) dot += qr[d] * k[d];
        dot *= a->scale;
        if (a->softcap > 0.0f) dot = a->softcap * tanhf(dot / a->softcap);
        s[t] = dot;
        if (dot > best) best = dot;
    }
    float new_max = best > *row_max ? best : *row_max;
    float correction = expf(*row_max - new_max);  /* 0 on the first visible key */
    *row_sum *= correction;
    #pragma omp simd
    for (int64_t d = 0; d < a->dim_v; d++) o[d] *= correction;
    for (int64_t t = t0; t < t1; t++) {
        float p = expf(s[t] - new_max);
        const float *v = values + t * a->token_stride;
        *row_sum += p;
        #pragma omp simd
        for (int64_t d = 0; d < a->dim_v; d++) o[d] += p * v[d];
    }
    *row_max = new_max;
}

#ifdef EMBER_AVX2
#define VALUE_CHUNK 32  /* value columns one pass keeps in four registers */

/* The four sums of a, b, c and d's lanes. */
static inline __m128 hsum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* scores[r * stride + t] = scale * q[r] . key t for every row and keys [0, n) of a block (dim_k % 8 == 0):
   four rows share each key row's loads, and their four sums are reduced together. */
static void block_scores_avx2(const attention_args *a, const float *const *q, int64_t rows, const float *keys, int64_t n,
                              float *scores, int64_t stride) {
    const int64_t dk = a->dim_k;
    const __m128 scale4 = _mm_set1_ps(a->scale);
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *q0 = q[r], *q1 = q[r + 1], *q2 = q[r + 2], *q3 = q[r + 3];
        for (int64_t t = 0; t < n; t++) {
            const float *k = keys + t * a->token_stride;
            __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
            for (int64_t d = 0; d < dk; d += 8) {
                const __m256 kv = _mm256_loadu_ps(k + d);
                s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), kv, s0);
                s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), kv, s1);
                s2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), kv, s2);
                s3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), kv, s3);
            }
            float four[4];
            _mm_storeu_ps(four, _mm_mul_ps(hsum4x8(s0, s1, s2, s3), scale4));
            for (int i = 0; i < 4; i++) scores[(r + i) * stride + t] = four[i];
        }
    }
    /* The last rows % 4 rows (a decode step's GQA group of 1-3 heads): four keys at a time per row, so four sums
       are in flight, reduced as above (each lane of hsum4x8 is its own vector's sum: the same bits as four rows). */
    for (; r < rows; r++) {
        const float *qr = q[r];
        int64_t t = 0;
        for (; t + 4 <= n; t += 4) {
            const float *k0 = keys + t * a->token_stride, *k1 = k0 + a->token_stride, *k2 = k1 + a->token_stride, *k3 = k2 + a->token_stride;
            __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
            for (int64_t d = 0; d < dk; d += 8) {
                const __m256 qv = _mm256_loadu_ps(qr + d);
                s0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), s0);
                s1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), s1);
                s2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), s2);
                s3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), s3);
            }
            _mm_storeu_ps(scores + r * stride + t, _mm_mul_ps(hsum4x8(s0, s1, s2, s3), scale4));
        }
        for (; t < n; t++) {
            const float *k = keys + t * a->token_stride;
            __m256 acc = _mm256_setzero_ps();
            for (int64_t d = 0; d < dk; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), _mm256_loadu_ps(k + d), acc);
            scores[r * stride + t] = _mm_cvtss_f32(_mm_mul_ps(hsum4x8(acc, acc, acc, acc), scale4));
        }
    }
}

/* update_row_portable in AVX2, its scores already in s (block_scores_avx2), for dim_v % VALUE_CHUNK == 0
   and no soft-capping: the exponentials 8 at a time, each value chunk accumulated in registers across the keys. */
static void update_row_avx2(const attention_args *a, const float *values, int64_t t0, int64_t t1, float *s, float *o,
                            float *row_max, float *row_sum) {
    float best = -INFINITY;
    for (int64_t t = t0; t < t1; t++) best = s[t] > best ? s[t] : best;
    const float new_max = best > *row_max ? best : *row_max;
    const float correction = expf(*row_max - new_max);  /* 0 on the first visible key */
    const int64_t n = t1 - t0;
    float *p = s + t0;  /* probabilities overwrite their scores (the block buffer has room for the padding read) */
    __m256 sum = _mm256_setzero_ps(), vmax = _mm256_set1_ps(new_max);
    for (int64_t t = 0; t < n; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), vmax));
        if (t + 8 > n) {  /* the last keys: scores past t1 (a tree's next visible run) stay as they are */
            const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - t)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            e = _mm256_and_ps(e, _mm256_castsi256_ps(keep));
            _mm256_maskstore_ps(p + t, keep, e);
        } else {
            _mm256_storeu_ps(p + t, e);
        }
        sum = _mm256_add_ps(sum, e);
    }
    *row_sum = *row_sum * correction + hsum8(sum);
    const __m256 vc = _mm256_set1_ps(correction);
    int64_t c = 0;
    for (; c + 2 * VALUE_CHUNK <= a->dim_v; c += 2 * VALUE_CHUNK) { /* eight sums in flight where the width allows */
        __m256 sums[8];
        for (int i = 0; i < 8; i++) sums[i] = _mm256_mul_ps(_mm256_loadu_ps(o + c + 8 * i), vc);
        for (int64_t t = 0; t < n; t++) {
            const float *v = values + (t0 + t) * a->token_stride + c;
            const __m256 w = _mm256_broadcast_ss(p + t);
            for (int i = 0; i < 8; i++) sums[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * i), sums[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + c + 8 * i, sums[i]);
    }
    for (; c < a->dim_v; c += VALUE_CHUNK) {
        __m256 o0 = _mm256_mul_ps(_mm256_loadu_ps(o + c), vc), o1 = _mm256_mul_ps(_mm256_loadu_ps(o + c + 8), vc);
        __m256 o2 = _mm256_mul_ps(_mm256_loadu_ps(o + c + 16), vc), o3 = _mm256_mul_ps(_mm256_loadu_ps(o + c + 24), vc);
        for (int64_t t = 0; t < n; t++) {
            const float *v = values + (t0 + t) * a->token_stride + c;
            const __m256 w = _mm256_broadcast_ss(p + t);
            o0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v), o0);
            o1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8), o1);
            o2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 16), o2);
            o3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 24), o3);
        }
        _mm256_storeu_ps(o + c, o0); _mm256_storeu_ps(o + c + 8, o1);
        _mm256_storeu_ps(o + c + 16, o2); _mm256_storeu_ps(o + c + 24, o3);
    }
    *row_max = new_max;
}
#endif
#endif

/* A work item: queries [q0, q0 + nq) of sequence seq (a spanned run's all, at most SPAN_QUERIES; a prefill
   chunk's at most QUERY_CHUNK), kv heads [h0, h1), key blocks [b0, b1) of its table. */
typedef struct {
    int64_t seq, q0, nq, h0, h1, b0, b1;
    float *partial;  /* NULL: the item sees every key and writes the output; else (max, sum, acc) per row */
} work_item;

/* An item's rows are its kv heads' rows, head-major; each kv head's are its queries x its grouped
   heads. Row r's output row (token * num_heads + head) in `out`. */
static int64_t output_row(const attention_args *a, const work_item *item, int64_t r) {
    const int64_t group = a->num_heads / a->num_kv_heads, per_head = item->nq * group, i = r % per_head;
    const int64_t token = a->query_starts[item->seq] + item->q0 + i / group;
    return token * a->num_heads + (item->h0 + r / per_head) * group + i % group;
}

#ifndef EMBER_AVX512  /* the block walk, for CPUs without AVX-512 (span_attention.h replaces it) */
/* One query row's online-softmax steps over the keys k_lo + [t0, t1) of a block it may see: all of them,
   or with a tree mask (not -1) those before the span (key position < span_start) and the span's keys
   whose bit is set, as runs of consecutive visible keys. */
static void update_visible(const attention_args *a, const float *qr, const float *keys, const float *values, int64_t k_lo,
                           int64_t t0, int64_t t1, int64_t span_start, int64_t mask, int fast, float *s, float *o,
                           float *row_max, float *row_sum) {
    int64_t t = t0;
    while (t < t1) {
        int64_t end = t1;
        if (mask != -1 && k_lo + t >= span_start) {
            end = t;
            while (end < t1 && end - (span_start - k_lo) < 64 && ((uint64_t)mask >> (k_lo + end - span_start) & 1u)) end++;
            if (end == t) { t++; continue; }  /* an invisible key of the span */
        } else if (mask != -1 && span_start - k_lo < t1) {
            end = span_start - k_lo;  /* the context before the span first, then the span's visible runs */
        }
#ifdef EMBER_AVX2
        if (fast) { update_row_avx2(a, values, t, end, s, o, row_max, row_sum); t = end; continue; }
#else
        (void)fast;
#endif
        update_row_portable(a, qr, keys, values, t, end, s, o, row_max, row_sum);
        t = end;
    }
}
#endif

static int64_t sequence_spans(const attention_args *a, int64_t s);
static int64_t span_blocks(const attention_args *a);

#ifdef EMBER_AVX512
#include "span_attention.h"
#endif

/* Score floats a work item's buffer holds per query row: a whole window's (AVX-512 walk), or one block's. */
static int64_t score_floats_per_row(const attention_args *a) {
#ifdef EMBER_AVX512
    return span_score_stride(span_blocks(a) * a->block_size + 15);
#else
    return a->block_size + SCORE_PADDING;
#endif
}

static void attend(const attention_args *a, const work_item *item, float *work) {
    const int64_t group = a->num_heads / a->num_kv_heads, dk = a->dim_k, dv = a->dim_v, bs = a->block_size;
    const int64_t count = a->query_counts[item->seq], nq = item->nq;
    const int64_t per_head = nq * group, heads = item->h1 - item->h0, rows = per_head * heads;
    const int64_t first_pos = a->context_lens[item->seq] - count + item->q0, last_pos = first_pos + nq - 1;
    float *acc = work, *row_max = acc + rows * dv, *row_sum = row_max + rows, *scores = row_sum + rows;
    float *kbuf = scores + rows * score_floats_per_row(a), *vbuf = kbuf + bs * a->token_stride;
    const float *q[MAX_ROWS];
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = output_row(a, item, r);
        q[r] = a->query + row / a->num_heads * a->query_stride + row % a->num_heads * dk;
        row_max[r] = -INFINITY; row_sum[r] = 0.0f;
        for (int64_t d = 0; d < dv; d++) acc[r * dv + d] = 0.0f;
    }
    int64_t lo = a->window > 0 ? first_pos - a->window + 1 : 0;
    if (lo < 0) lo = 0;
    const int64_t b_first = lo / bs > item->b0 ? lo / bs : item->b0, b_last = last_pos / bs < item->b1 - 1 ? last_pos / bs : item->b1 - 1;
#ifdef EMBER_AVX512
    const int64_t last_key = last_pos < (b_last + 1) * bs - 1 ? last_pos : (b_last + 1) * bs - 1;
    attend_keys(a, item, q, b_first, b_last, last_key, acc, row_max, row_sum, scores, kbuf, vbuf);
#else
    /* block by block, each row's online softmax moving on per block */
    const int64_t score_stride = bs + SCORE_PADDING, span_start = a->context_lens[item->seq] - count;
    const int64_t *masks = a->span_masks ? a->span_masks + a->query_starts[item->seq] + item->q0 : NULL;
    /* the converted span of a row: from kv head h0's first element to the last head's last */
    const int64_t span = (heads - 1) * a->head_stride + (dk > dv ? dk : dv);
    const int32_t *table = a->block_tables + item->seq * a->max_blocks;
#ifdef EMBER_AVX2
    const int fast = dk % 8 == 0 && dv % VALUE_CHUNK == 0 && a->softcap <= 0.0f;
#else
    const int fast = 0;
#endif
    for (int64_t b = b_first; b <= b_last; b++) {
        int32_t block = table[b];
        if (block < 0) continue;
        int64_t k_lo = b * bs > lo ? b * bs : lo, k_hi = b * bs + bs - 1 < last_pos ? b * bs + bs - 1 : last_pos;
        int64_t n = k_hi - k_lo + 1;
        /* every head's part of each row widened at once: the rows are read front to back */
        const float *keys = block_rows(a, a->keys, block, k_lo - b * bs, n, item->h0, span, kbuf);
        const float *values = a->values == a->keys && a->cache_format != CACHE_F32
            ? keys : block_rows(a, a->values, block, k_lo - b * bs, n, item->h0, span, vbuf);
        for (int64_t h = 0; h < heads; h++) {
            const float *head_keys = keys + h * a->head_stride, *head_values = values + h * a->head_stride;
            const float *const *head_q = q + h * per_head;
            float *head_acc = acc + h * per_head * dv, *head_max = row_max + h * per_head, *head_sum = row_sum + h * per_head;
#ifdef EMBER_AVX2
            if (fast) block_scores_avx2(a, head_q, per_head, head_keys, n, scores, score_stride);
#endif
            for (int64_t r = 0; r < per_head; r++) {
                /* Row r sees keys k_lo + [t0, t1): none past its position, none before its window. */
                const int64_t pos = first_pos + r / group;
                int64_t t0 = a->window > 0 ? pos - a->window + 1 - k_lo : 0, t1 = pos - k_lo + 1;
                if (t0 < 0) t0 = 0;
                if (t1 > n) t1 = n;
                if (t0 >= t1) continue;
                update_visible(a, head_q[r], head_keys, head_values, k_lo, t0, t1, span_start, masks ? masks[r / group] : -1,
                               fast, scores + r * score_stride, head_acc + r * dv, head_max + r, head_sum + r);
            }
        }
    }
#endif
    for (int64_t r = 0; r < rows; r++) {
        if (item->partial != NULL) {  /* a span of a split sequence: its state, merged later */
            float *state = item->partial + r * (dv + 2);
            state[0] = row_max[r]; state[1] = row_sum[r];
            for (int64_t d = 0; d < dv; d++) state[2 + d] = acc[r * dv + d];
            continue;
        }
        float *o = a->out + output_row(a, item, r) * dv;
        float inverse = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
        for (int64_t d = 0; d < dv; d++) o[d] = acc[r * dv + d] * inverse;
    }
}

/* A spanned sequence's outputs from its spans' states (max, sum, acc per row; `first` is its first
   span, the others follow in `partial`), combined in span order. */
static void merge_spans(const attention_args *a, const work_item *first, int64_t spans) {
    const int64_t dv = a->dim_v, rows = first->nq * a->num_heads, span_floats = rows * (dv + 2);
    for (int64_t r = 0; r < rows; r++) {
        float best = -INFINITY, sum = 0.0f;
        for (int64_t s = 0; s < spans; s++) {
            float m = first->partial[s * span_floats + r * (dv + 2)];
            best = m > best ? m : best;
        }
        float *o = a->out + output_row(a, first, r) * dv;
        for (int64_t d = 0; d < dv; d++) o[d] = 0.0f;
        if (best == -INFINITY) continue;  /* no visible key */
        for (int64_t s = 0; s < spans; s++) {
            const float *state = first->partial + s * span_floats + r * (dv + 2);
            if (state[0] == -INFINITY) continue;
            float weight = expf(state[0] - best);
            sum += state[1] * weight;
            for (int64_t d = 0; d < dv; d++) o[d] += state[2 + d] * weight;
        }
        float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t d = 0; d < dv; d++) o[d] *= inverse;
    }
}

static inline uint16_t f32_to_bf16(float number) {
    union { float number; uint32_t bits; } converted = {number};
    if ((converted.bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  /* NaN stays a (quiet) NaN */
    return (uint16_t)((converted.bits + 0x7FFFu + ((converted.bits >> 16) & 1u)) >> 16);
}

/* float32 -> float8 e4m3, rounded to nearest even; +-448 (the largest finite value) for anything
   beyond, infinities included; NaN stays NaN. */
static inline uint8_t f32_to_e4m3(float number) {
    union { float number; uint32_t bits; } converted = {number};
    const uint8_t sign = (uint8_t)((converted.bits >> 24) & 0x80u);
    const uint32_t magnitude = converted.bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return sign | 0x7F;
    if (magnitude >= 0x43E00000u) return sign | 0x7E;  /* >= 448: every such value rounds to 448 or past it */
    if (magnitude < 0x3C800000u) {
        /* below 2^-6, steps of 2^-9: adding 2^14 (whose ulp is 2^-9) rounds the steps to even in hardware,
           and the sum's low mantissa bits are the subnormal code (8: the smallest normal, 2^-6) */
        union { float number; uint32_t bits; } step = {fabsf(number) + 16384.0f};
        return sign | (uint8_t)(step.bits - 0x46800000u);
    }
    /* normal: drop 20 of the 23 mantissa bits rounding to even, rebias the exponent from 127 to 7 */
    const uint32_t rounded = magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u);
    return sign | (uint8_t)((rounded >> 20) - (120u << 3));
}

/* float32 -> float8 e5m2, rounded to nearest even as torch's float8_e5m2 cast does: 65536 and beyond (where
   rounding would leave the largest finite value, 57344) become infinity, NaN stays NaN; below 2^-14 the
   subnormal steps of 2^-16 round in hardware (adding 2^7, whose ulp is 2^-16, leaves the code in the low bits). */
static inline uint8_t f32_to_e5m2(float number) {
    union { float number; uint32_t bits; } converted = {number};
    const uint8_t sign = (uint8_t)((converted.bits >> 24) & 0x80u);
    const uint32_t magnitude = converted.bits & 0x7FFFFFFFu;
    if (magnitude >= (143u << 23)) return sign | (magnitude > 0x7F800000u ? 0x7F : 0x7C);
    if (magnitude < (113u << 23)) {
        union { float number; uint32_t bits; } step = {fabsf(number) + 128.0f};
        return sign | (uint8_t)(step.bits - 0x43000000u);
    }
    /* normal: drop 21 of the 23 mantissa bits rounding to even, rebias the exponent from 127 to 15 */
    const uint32_t rounded = magnitude + 0xFFFFFu + ((magnitude >> 21) & 1u);
    return sign | (uint8_t)((rounded >> 21) - (112u << 2));
}

/* Token t's key and value rows (width floats, at key / value + t * source_stride) go to cache
   rows slots[t] of keys / values (rows width elements apart, in `cache_format`). */
void ember_write_kv(const float *key, const float *value, int64_t source_stride, void *keys, void *values,
                    int cache_format, const int64_t *slots, int64_t tokens, int64_t width) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *k = key + t * source_stride, *v = value + t * source_stride;
        if (cache_format == CACHE_E4M3) {
            uint8_t *kd = (uint8_t *)keys + slots[t] * width, *vd = (uint8_t *)values + slots[t] * width;
            for (int64_t d = 0; d < width; d++) { kd[d] = f32_to_e4m3(k[d]); vd[d] = f32_to_e4m3(v[d]); }
        } else if (cache_format == CACHE_E5M2) {
            uint8_t *kd = (uint8_t *)keys + slots[t] * width, *vd = (uint8_t *)values + slots[t] * width;
            for (int64_t d = 0; d < width; d++) { kd[d] = f32_to_e5m2(k[d]); vd[d] = f32_to_e5m2(v[d]); }
        } else if (cache_format == CACHE_BF16) {
            uint16_t *kd = (uint16_t *)keys + slots[t] * width, *vd = (uint16_t *)values + slots[t] * width;
            for (int64_t d = 0; d < width; d++) { kd[d] = f32_to_bf16(k[d]); vd[d] = f32_to_bf16(v[d]); }
        } else {
            float *kd = (float *)keys + slots[t] * width, *vd = (float *)values + slots[t] * width;
            for (int64_t d = 0; d < width; d++) { kd[d] = k[d]; vd[d] = v[d]; }
        }
    }
}

static int64_t span_blocks(const attention_args *a) { return SPAN_TOKENS / a->block_size > 0 ? SPAN_TOKENS / a->block_size : 1; }

/* Sequence s's spans when its queries are read in spans (0 otherwise): a short run (a decode step,
   a verification) whose rows over every kv head fit one item. A verification of up to SPAN_QUERIES
   tokens is read as a decode step is, so each of its rows gets the decode step's bits (a greedy
   output with speculation stays the one without, even where int8-rounded activations would
   magnify a last-bit difference). */
static int64_t sequence_spans(const attention_args *a, int64_t s) {
    const int64_t count = a->query_counts[s];
    if (count > SPAN_QUERIES || count * a->num_heads > MAX_ROWS) return 0;
    const int64_t blocks = (a->context_lens[s] + a->block_size - 1) / a->block_size;
    return (blocks + span_blocks(a) - 1) / span_blocks(a);
}

/* The step's work items into `items` (NULL: only counted); returns how many. A short run of
   queries (a decode step, a verification) is one item per SPAN_TOKENS of keys over all its kv
   heads: each K/V row is read front to back once, and a long context spreads over the threads,
   its spans' states in `partials` (merged after). Longer runs (prefill) go QUERY_CHUNK queries at
   a time per kv head, whose grouped heads share the rows' reads. Spans depend on the context
   only, never on the thread count, so the bits do not either. `rows` gets the largest item's
   query rows, `partial_floats` the states' size. */
static int64_t plan_items(const attention_args *a, work_item *items, float *partials, int64_t *rows, int64_t *partial_floats) {
    const int64_t group = a->num_heads / a->num_kv_heads;
    int64_t n = 0;
    *rows = *partial_floats = 0;
    for (int64_t s = 0; s < a->num_seqs; s++) {
        const int64_t count = a->query_counts[s], spans = sequence_spans(a, s), span_rows = count * a->num_heads;
        for (int64_t i = 0; i < spans; i++, n++)
            if (items) items[n] = (work_item){s, 0, count, 0, a->num_kv_heads, i * span_blocks(a), (i + 1) * span_blocks(a),
                                             spans > 1 ? partials + *partial_floats + i * span_rows * (a->dim_v + 2) : NULL};
        if (spans > 1) *partial_floats += spans * span_rows * (a->dim_v + 2);
        if (spans > 0) { *rows = span_rows > *rows ? span_rows : *rows; continue; }
        for (int64_t q0 = 0; q0 < count; q0 += QUERY_CHUNK)
            for (int64_t h = 0; h < a->num_kv_heads; h++, n++)
                if (items) items[n] = (work_item){s, q0, count - q0 < QUERY_CHUNK ? count - q0 : QUERY_CHUNK, h, h + 1,
                                                 0, a->max_blocks, NULL};
        const int64_t chunk_rows = (count < QUERY_CHUNK ? count : QUERY_CHUNK) * group;
        *rows = chunk_rows > *rows ? chunk_rows : *rows;
    }
    return n;
}

/* Returns 0; -1 when one work item would hold more than MAX_ROWS query rows; -2 out of memory. */
int ember_paged_attention(const attention_args *a) {
    int64_t rows, partial_floats;
    const int64_t num_items = plan_items(a, NULL, NULL, &rows, &partial_floats);
    if (rows > MAX_ROWS) return -1;
    work_item *items = malloc(sizeof(work_item) * (num_items + 1));
    float *partials = malloc(sizeof(float) * (partial_floats + 1));
    if (!items || !partials) { free(items); free(partials); return -2; }
    plan_items(a, items, partials, &rows, &partial_floats);
    const int64_t dmax = a->dim_k > a->dim_v ? a->dim_k : a->dim_v;
    const int64_t work_floats = rows * (a->dim_v + 2 + score_floats_per_row(a)) + 2 * a->block_size * (a->token_stride + dmax);
    int failed = 0;
    #pragma omp parallel
    {
        float *work = malloc(sizeof(float) * work_floats);
        if (!work) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic)
        for (int64_t i = 0; i < num_items; i++)
            if (work) attend(a, &items[i], work);
        free(work);
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < num_items; i++)  /* a split sequence's first span merges them all */
            if (items[i].partial != NULL && items[i].b0 == 0) merge_spans(a, &items[i], sequence_spans(a, items[i].seq));
    }
    free(items); free(partials);
    return failed ? -2 : 0;
}
