/* The AVX-512 walk of a work item (a decode step's or a verification's queries over one span of keys, or a
   prefill chunk's over its whole context): included by paged_attention.c, which defines attention_args,
   work_item, span_blocks, block_rows and output_row before it.

   The keys go by windows on the span grid (one window for a span item). Within a window the softmax needs
   no running rescale: the walk scores every (row, key) pair first (16 keys at a time per row: sixteen dot
   products summed across their lanes into one vector of 16 scores, so no sum is reduced one key at a time),
   masks what a row may not see (later positions, keys behind a window, a tree's non-ancestors, the block's
   missing keys) to minus infinity, takes each row's maximum, sum and exponentials in 16-wide vectors
   (rescaling what earlier windows added once, where the maximum grew), then adds the weighted value rows
   with up to four rows sharing each value load. Each row's arithmetic depends only on its own query, its
   visible keys and the span grid, never on the other rows of the item: a verification's rows get the bits
   the same rows get as decode steps. The state it leaves (maximum, sum, weighted values per row) is what the
   portable walk leaves, so split sequences merge as before. */

#define SPAN_ROW_GROUP 4  /* rows whose weighted sums share each value row's loads */
#define VALUE_PIECE 64    /* value columns per pass: four registers per row */

/* Lanes [0, min(n, 16)) of a 16-key vector. */
static inline __mmask16 keys_left(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* Scores per row of a span of num_keys keys: 16-key vectors, and room for the last one's lanes past the span
   (a block's chunk is written 16 wide wherever it starts). */
static inline int64_t span_score_stride(int64_t num_keys) { return (num_keys + 15) / 16 * 16 + 16; }

/* Lane j of the result: the sum of v[j]'s 16 lanes (a fixed tree of lane shuffles and adds). */
static inline __m512 lane_sums16(const __m512 v[16]) {
    __m512 pairs[8], quads[4];
    for (int i = 0; i < 8; i++)  /* per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3) */
        pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {  /* per 128-bit lane: the lane's sums of four vectors, in order */
        __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
        quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    /* across the four 128-bit lanes: [A0 A1 A2 A3], [B0 ..] -> [A0+A1, A2+A3, B0+B1, B2+B3] -> totals */
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88), _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88), _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}

/* scores[0..16) = scale * q . key j for the n <= 16 keys rows `stride` floats apart (lanes past n: key n - 1's);
   CHUNKS: dk / 16 where that is a small constant (the query then stays in registers), else 0 (any dk). */
static inline __attribute__((always_inline)) __m512 scores16(const float *q, const float *keys, int64_t stride, int64_t n,
                                                             int64_t dk, float scale, const int CHUNKS) {
    __m512 sums[16], query[CHUNKS > 0 ? CHUNKS : 1];
    for (int c = 0; c < CHUNKS; c++) query[c] = _mm512_loadu_ps(q + 16 * c);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        const float *k = keys + (j < n ? j : n - 1) * stride;
        sums[j] = _mm512_setzero_ps();
        if (CHUNKS > 0) {
            for (int c = 0; c < CHUNKS; c++) sums[j] = _mm512_fmadd_ps(query[c], _mm512_loadu_ps(k + 16 * c), sums[j]);
            continue;
        }
        for (int64_t d = 0; d < dk; d += 16) {
            const __mmask16 valid = keys_left(dk - d);
            sums[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(valid, q + d), _mm512_maskz_loadu_ps(valid, k + d), sums[j]);
        }
    }
    return _mm512_mul_ps(lane_sums16(sums), _mm512_set1_ps(scale));
}

/* scores16 for this dk: the query in registers where dk is 64 or 128. */
static inline __m512 scores16_any(const float *q, const float *keys, int64_t stride, int64_t n, int64_t dk, float scale) {
    if (dk == 64) return scores16(q, keys, stride, n, dk, scale, 4);
    if (dk == 128) return scores16(q, keys, stride, n, dk, scale, 8);
    return scores16(q, keys, stride, n, dk, scale, 0);
}

/* Lanes j >= first, and lanes j <= last, of a 16-key vector. */
static inline __mmask16 lanes_from(int64_t first) { return first <= 0 ? 0xFFFF : first >= 16 ? 0 : (__mmask16)(0xFFFFu << first); }
static inline __mmask16 lanes_to(int64_t last) { return last >= 15 ? 0xFFFF : last < 0 ? 0 : (__mmask16)((1u << (last + 1)) - 1); }

/* Which of keys key0 + [0, 16) (n of them exist) a query at `pos` sees: none past it, none before its window,
   and, with a tree mask (not -1), of the span's keys (positions >= span_start) only those whose bit is set. */
static inline __mmask16 visible16(const attention_args *a, int64_t key0, int64_t n, int64_t pos, int64_t span_start, int64_t mask) {
    __mmask16 seen = keys_left(n) & lanes_to(pos - key0);
    if (a->window > 0) seen &= lanes_from(pos - a->window + 1 - key0);
    const int64_t first = span_start - key0;  /* the lane of the span's first key */
    if (mask != -1 && first < 16) {
        /* lane j >= first sees key j when bit j - first of the mask is set (none past bit 63) */
        const uint64_t bits = first >= 0 ? (uint64_t)mask << first : -first < 64 ? (uint64_t)mask >> -first : 0;
        seen &= (__mmask16)((bits & lanes_from(first)) | (uint16_t)~lanes_from(first));
    }
    return seen;
}

/* The weighted value rows of rows [r0, r0 + R) (probabilities at p + r * p_stride, keys [0, n) of one block at
   `values`) added to their sums (acc + r * dv), one VALUE_PIECE of columns at a time. */
static inline __attribute__((always_inline)) void add_values(const float *values, int64_t stride, int64_t n, int64_t dv,
                                                             const float *p, int64_t p_stride, float *acc, const int R) {
    for (int64_t c = 0; c < dv; c += VALUE_PIECE) {
        __mmask16 valid[4];
        for (int i = 0; i < 4; i++) {
            const int64_t left = dv - c - 16 * i;
            valid[i] = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        }
        __m512 sums[SPAN_ROW_GROUP][4];
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 4; i++) sums[r][i] = _mm512_maskz_loadu_ps(valid[i], acc + r * dv + c + 16 * i);
        for (int64_t t = 0; t < n; t++) {
            const float *v = values + t * stride + c;
            __m512 row[4];
            for (int i = 0; i < 4; i++) row[i] = _mm512_maskz_loadu_ps(valid[i], v + 16 * i);
            for (int r = 0; r < R; r++) {
                const __m512 w = _mm512_set1_ps(p[r * p_stride + t]);
                for (int i = 0; i < 4; i++) sums[r][i] = _mm512_fmadd_ps(w, row[i], sums[r][i]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 4; i++) _mm512_mask_storeu_ps(acc + r * dv + c + 16 * i, valid[i], sums[r][i]);
    }
}

/* One window of an item's keys (blocks b_first..b_last of its table, up to key k_hi, at most one span's worth):
   its scores, then each row's running maximum, sum and weighted values (row_max / row_sum / acc, rows x dv) move on
   past it, the earlier windows' share rescaled once. Scores sit at columns key - base, base a multiple of 16: a
   key's lane never depends on where the item starts, so neither do the bits. */
static void attend_window(const attention_args *a, const work_item *item, const float *const *q, int64_t b_first,
                          int64_t b_last, int64_t k_hi, float *acc, float *row_max, float *row_sum,
                          float *scores, float *kbuf, float *vbuf) {
    const int64_t group = a->num_heads / a->num_kv_heads, dk = a->dim_k, dv = a->dim_v, bs = a->block_size;
    const int64_t heads = item->h1 - item->h0, per_head = item->nq * group, rows = per_head * heads;
    const int64_t count = a->query_counts[item->seq], first_pos = a->context_lens[item->seq] - count + item->q0;
    const int64_t span_start = a->context_lens[item->seq] - count, base = b_first * bs / 16 * 16;
    const int64_t num_keys = k_hi - base + 1, stride = span_score_stride(num_keys);
    const int64_t *masks = a->span_masks ? a->span_masks + a->query_starts[item->seq] + item->q0 : NULL;
    const int64_t span = (heads - 1) * a->head_stride + (dk > dv ? dk : dv);
    const int32_t *table = a->block_tables + item->seq * a->max_blocks;
    for (int64_t r = 0; r < rows; r++)  /* the columns before the first block */
        for (int64_t t = 0; t < b_first * bs - base; t++) scores[r * stride + t] = -INFINITY;
    /* scores of every row, block by block (each block's rows read front to back, all heads at once) */
    for (int64_t b = b_first; b <= b_last; b++) {
        const int64_t lo = b * bs, hi = lo + bs - 1 < k_hi ? lo + bs - 1 : k_hi;
        const int32_t block = table[b];
        const float *keys = block >= 0 ? block_rows(a, a->keys, block, 0, hi - lo + 1, item->h0, span, kbuf) : NULL;
        for (int64_t key0 = lo; key0 <= hi; key0 += 16) {
            const int64_t n = hi - key0 + 1 < 16 ? hi - key0 + 1 : 16, column = key0 - base;
            for (int64_t r = 0; r < rows; r++) {
                const int64_t h = r / per_head, i = r % per_head;
                const __mmask16 seen = keys ? visible16(a, key0, n, first_pos + i / group, span_start, masks ? masks[i / group] : -1) : 0;
                __m512 s = _mm512_set1_ps(-INFINITY);
                if (seen) {
                    s = scores16_any(q[r], keys + (key0 - lo) * a->token_stride + h * a->head_stride, a->token_stride, n, dk, a->scale);
                    if (a->softcap > 0.0f) {
                        float lanes[16];
                        _mm512_storeu_ps(lanes, s);
                        for (int j = 0; j < 16; j++) lanes[j] = a->softcap * tanhf(lanes[j] / a->softcap);
                        s = _mm512_loadu_ps(lanes);
                    }
                }
                _mm512_storeu_ps(scores + r * stride + column, _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), s));
            }
        }
    }
    /* each row's new maximum, then its probabilities (masked keys exactly 0) and their sum; what the earlier
       windows added is rescaled to the new maximum (the first visible window finds nothing to rescale) */
    const __m512 minus_infinity = _mm512_set1_ps(-INFINITY);
    for (int64_t r = 0; r < rows; r++) {
        float *s = scores + r * stride;
        __m512 best = minus_infinity;
        for (int64_t t = 0; t < num_keys; t += 16)
            best = _mm512_max_ps(best, _mm512_mask_loadu_ps(minus_infinity, keys_left(num_keys - t), s + t));
        const float window_best = _mm512_reduce_max_ps(best), old_max = row_max[r];
        const float new_max = window_best > old_max ? window_best : old_max;
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < num_keys; t += 16) {
            const __mmask16 valid = keys_left(num_keys - t);
            const __m512 x = _mm512_mask_loadu_ps(minus_infinity, valid, s + t);
            /* nothing visible yet (new_max -inf): x - new_max is NaN, and every lane is masked to 0 */
            const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, minus_infinity, _CMP_NEQ_OQ),
                                                 exp16(_mm512_sub_ps(x, _mm512_set1_ps(new_max))));
            _mm512_mask_storeu_ps(s + t, valid, e);
            sum = _mm512_add_ps(sum, e);
        }
        if (old_max != -INFINITY && old_max != new_max) {
            const float correction = expf(old_max - new_max);
            row_sum[r] *= correction;
            for (int64_t d = 0; d < dv; d++) acc[r * dv + d] *= correction;
        }
        row_max[r] = new_max;
        row_sum[r] += _mm512_reduce_add_ps(sum);
    }
    /* the weighted value rows, block by block, SPAN_ROW_GROUP rows of a head at a time */
    for (int64_t b = b_first; b <= b_last; b++) {
        const int64_t lo = b * bs, hi = lo + bs - 1 < k_hi ? lo + bs - 1 : k_hi;
        const int32_t block = table[b];
        if (block < 0) continue;
        const float *values = block_rows(a, a->values, block, 0, hi - lo + 1, item->h0, span, vbuf);
        for (int64_t r0 = 0; r0 < rows;) {
            const int64_t h = r0 / per_head, end = (h + 1) * per_head;  /* a group stays within one head */
            const int R = (int)(end - r0 < SPAN_ROW_GROUP ? end - r0 : SPAN_ROW_GROUP);
            const float *v = values + h * a->head_stride, *p = scores + r0 * stride + (lo - base);
            float *out = acc + r0 * dv;
            switch (R) {
            case 4: add_values(v, a->token_stride, hi - lo + 1, dv, p, stride, out, 4); break;
            case 3: add_values(v, a->token_stride, hi - lo + 1, dv, p, stride, out, 3); break;
            case 2: add_values(v, a->token_stride, hi - lo + 1, dv, p, stride, out, 2); break;
            default: add_values(v, a->token_stride, hi - lo + 1, dv, p, stride, out, 1); break;
            }
            r0 += R;
        }
    }
}

/* Every key an item may see (blocks b_first..b_last of its table, up to key k_hi), every kv head of the item:
   maximum, sum and weighted values of each row move on from their start (-inf, 0, zeros) in row_max / row_sum /
   acc. Windows follow the span grid (span_blocks), so a span item is one window and its bits never depend on the
   walk's other items. */
static void attend_keys(const attention_args *a, const work_item *item, const float *const *q, int64_t b_first,
                        int64_t b_last, int64_t k_hi, float *acc, float *row_max, float *row_sum,
                        float *scores, float *kbuf, float *vbuf) {
    const int64_t width = span_blocks(a);
    for (int64_t first = b_first; first <= b_last; first = (first / width + 1) * width) {
        const int64_t last = (first / width + 1) * width - 1 < b_last ? (first / width + 1) * width - 1 : b_last;
        const int64_t last_key = (last + 1) * a->block_size - 1 < k_hi ? (last + 1) * a->block_size - 1 : k_hi;
        attend_window(a, item, q, first, last, last_key, acc, row_max, row_sum, scores, kbuf, vbuf);
    }
}
