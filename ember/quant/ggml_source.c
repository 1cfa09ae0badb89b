/* ember's kernels for GGML block formats: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K.
 *
 * Two entry points, both parallel over weight rows on the OpenMP runtime:
 *   ember_ggml_dequantize: rows of blocks -> float32, bit-exact with the `gguf` package (the
 *     file is built with -ffp-contract=off so `d * q - m` is never fused into one rounding);
 *   ember_ggml_gemv: y[i, n] = sum_j x[i, j] * w[n, j] for a few float32 rows x, the weights
 *     dequantized in registers. Per block (or 32-value sub-block) the kernel sums q * x in
 *     float32 and scales once: sum((d*q + m) * x) = d * sum(q * x) + m * sum(x), with the
 *     sums of x per 32 values computed once per call. Activations stay float32.
 * With AVX2 + FMA the inner loops are intrinsics; elsewhere a portable loop dequantizes one
 * block at a time. */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
#define MAX_M 8

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else { /* subnormal half: normalise */
            exponent = 113;
            while (!(mantissa & 0x400u)) { mantissa <<= 1; exponent--; }
            bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    }
    float value;
    memcpy(&value, &bits, 4);
    return value;
#endif
}

static int64_t block_values(int type) { return (type == Q4_K || type == Q5_K || type == Q6_K) ? 256 : 32; }

static int64_t block_bytes(int type) {
    switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (12 packed bytes). */
static inline void scale_min_k4(int j, const uint8_t *q, int *scale, int *min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One block -> float32, operation for operation as gguf.quants computes it. */
static void dequantize_block(int type, const uint8_t *b, float *out) {
    switch (type) {
    case Q4_0: {
        float d = half_to_float(b);
        for (int l = 0; l < 16; l++) {
            out[l] = d * (float)((int)(b[2 + l] & 15) - 8);
            out[l + 16] = d * (float)((int)(b[2 + l] >> 4) - 8);
        }
        break;
    }
    case Q4_1: {
        float d = half_to_float(b), m = half_to_float(b + 2);
        for (int l = 0; l < 16; l++) {
            out[l] = d * (float)(b[4 + l] & 15) + m;
            out[l + 16] = d * (float)(b[4 + l] >> 4) + m;
        }
        break;
    }
    case Q8_0: {
        float d = half_to_float(b);
        for (int l = 0; l < 32; l++) out[l] = (float)(int8_t)b[2 + l] * d;
        break;
    }
    case Q4_K:
    case Q5_K: {
        float d = half_to_float(b), dmin = half_to_float(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = type == Q4_K ? b + 16 : b + 48;
        for (int s = 0; s < 8; s++) {
            int scale, min;
            scale_min_k4(s, scales, &scale, &min);
            float ds = d * (float)scale, dm = dmin * (float)min;
            for (int l = 0; l < 32; l++) {
                int q = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
                if (type == Q5_K) q |= ((qh[l] >> s) & 1) << 4;
                out[32 * s + l] = ds * (float)q - dm;
            }
        }
        break;
    }
    case Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        float d = half_to_float(b + 208);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    int index = 128 * h + 32 * k + l;
                    int low = ql[64 * h + 32 * (k & 1) + l];
                    low = k < 2 ? low & 15 : low >> 4;
                    int q = (low | (((qh[32 * h + l] >> (2 * k)) & 3) << 4)) - 32;
                    out[index] = (d * (float)scales[index / 16]) * (float)q;
                }
        break;
    }
    }
}

/* rows x cols weights (rows of blocks, row_bytes apart) -> float32 [rows, cols]. */
void ember_ggml_dequantize(int type, const uint8_t *w, float *out, int64_t rows, int64_t cols) {
    int64_t per_block = block_values(type), size = block_bytes(type), blocks = cols / per_block;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n++)
        for (int64_t k = 0; k < blocks; k++)
            dequantize_block(type, w + (size_t)(n * blocks + k) * (size_t)size, out + (size_t)n * (size_t)cols + (size_t)(k * per_block));
}

#ifdef __AVX2__
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 signed bytes -> two vectors of 8 floats. */
static inline void widen16(__m128i v, __m256 *w) {
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
}

/* 32 signed bytes -> four vectors of 8 floats. */
static inline void widen32(__m256i v, __m256 *w) {
    widen16(_mm256_castsi256_si128(v), w);
    widen16(_mm256_extracti128_si256(v, 1), w + 2);
}

static inline __m256 dot16(const __m256 *w, const float *x) {
    return _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), _mm256_mul_ps(w[0], _mm256_loadu_ps(x)));
}

static inline __m256 dot32(const __m256 *w, const float *x) {
    __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), s);
    return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), s);
}

/* acc[i] += scale * (32 quants . x_i); offset[i] += min * sum(x_i over these 32 values). */
static inline __attribute__((always_inline)) void accumulate32(const __m256 *w, float scale, float min, const float *x, const float *xsum,
                                int64_t m, int64_t cols, int64_t group, int64_t groups, int64_t at, __m256 *acc, float *offset) {
    __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t i = 0; i < m; i++) {
        acc[i] = _mm256_fmadd_ps(vscale, dot32(w, x + i * cols + at), acc[i]);
        if (min != 0.0f) offset[i] += min * xsum[i * groups + group];
    }
}

/* Inlined into one copy per (type, m) below: with both constant, the accumulators live in registers. */
static inline __attribute__((always_inline)) void row_dot_avx2(const int type, const uint8_t *row, const float *x, const float *xsum,
                                                              const int64_t m, int64_t cols, float *out) {
    __m256 acc[MAX_M];
    float offset[MAX_M];
    __m256 w[4];
    const __m128i low4 = _mm_set1_epi8(15);
    const __m256i low4x2 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1), three = _mm256_set1_epi8(3);
    int64_t groups = cols / 32, blocks = cols / block_values(type), size = block_bytes(type);
    for (int64_t i = 0; i < m; i++) { acc[i] = _mm256_setzero_ps(); offset[i] = 0.0f; }
    for (int64_t k = 0; k < blocks; k++) {
        const uint8_t *b = row + (size_t)(k * size);
        if (type == Q4_0 || type == Q4_1) {
            const uint8_t *qs = b + (type == Q4_0 ? 2 : 4);
            __m128i v = _mm_loadu_si128((const __m128i *)qs);
            __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
            if (type == Q4_0) { lo = _mm_sub_epi8(lo, _mm_set1_epi8(8)); hi = _mm_sub_epi8(hi, _mm_set1_epi8(8)); }
            widen16(lo, w);
            widen16(hi, w + 2);
            accumulate32(w, half_to_float(b), type == Q4_1 ? half_to_float(b + 2) : 0.0f, x, xsum, m, cols, k, groups, 32 * k, acc, offset);
        } else if (type == Q8_0) {
            widen32(_mm256_loadu_si256((const __m256i *)(b + 2)), w);
            accumulate32(w, half_to_float(b), 0.0f, x, xsum, m, cols, k, groups, 32 * k, acc, offset);
        } else if (type == Q4_K || type == Q5_K) {
            float d = half_to_float(b), dmin = half_to_float(b + 2);
            const uint8_t *qs = type == Q4_K ? b + 16 : b + 48;
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
            for (int s = 0; s < 8; s++) {
                int scale, min;
                scale_min_k4(s, b + 4, &scale, &min);
                __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (s / 2)));
                __m256i q = _mm256_and_si256((s & 1) ? _mm256_srli_epi16(v, 4) : v, low4x2);
                if (type == Q5_K) q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), one), 4));
                widen32(q, w);
                accumulate32(w, d * (float)scale, -dmin * (float)min, x, xsum, m, cols, 8 * k + s, groups, 256 * k + 32 * s, acc, offset);
            }
        } else { /* Q6_K */
            const int8_t *scales = (const int8_t *)(b + 192);
            float d = half_to_float(b + 208);
            for (int h = 0; h < 2; h++) {
                __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
                __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
                for (int part = 0; part < 4; part++) {
                    __m256i low = (part & 1) ? ql1 : ql0;
                    low = _mm256_and_si256(part < 2 ? low : _mm256_srli_epi16(low, 4), low4x2);
                    __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * part), three), 4);
                    widen32(_mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32)), w);
                    int index = 8 * h + 2 * part;
                    __m256 scale_a = _mm256_set1_ps(d * (float)scales[index]), scale_b = _mm256_set1_ps(d * (float)scales[index + 1]);
                    int64_t at = 256 * k + 128 * h + 32 * part;
                    for (int64_t i = 0; i < m; i++) {
                        const float *xi = x + i * cols + at;
                        acc[i] = _mm256_fmadd_ps(scale_a, dot16(w, xi), acc[i]);
                        acc[i] = _mm256_fmadd_ps(scale_b, dot16(w + 2, xi + 16), acc[i]);
                    }
                }
            }
        }
    }
    for (int64_t i = 0; i < m; i++) out[i] = hsum(acc[i]) + offset[i];
}

#define ROW_DOT_FOR_TYPE(TYPE) \
    static void row_dot_##TYPE(const uint8_t *row, const float *x, const float *xsum, int64_t m, int64_t cols, float *out) { \
        switch (m) { \
        case 1: row_dot_avx2(TYPE, row, x, xsum, 1, cols, out); break; \
        case 2: row_dot_avx2(TYPE, row, x, xsum, 2, cols, out); break; \
        case 3: row_dot_avx2(TYPE, row, x, xsum, 3, cols, out); break; \
        case 4: row_dot_avx2(TYPE, row, x, xsum, 4, cols, out); break; \
        default: row_dot_avx2(TYPE, row, x, xsum, m, cols, out); break; \
        } \
    }
ROW_DOT_FOR_TYPE(Q4_0)
ROW_DOT_FOR_TYPE(Q4_1)
ROW_DOT_FOR_TYPE(Q8_0)
ROW_DOT_FOR_TYPE(Q4_K)
ROW_DOT_FOR_TYPE(Q5_K)
ROW_DOT_FOR_TYPE(Q6_K)

static void row_dot_fast(int type, const uint8_t *row, const float *x, const float *xsum, int64_t m, int64_t cols, float *out) {
    switch (type) {
    case Q4_0: row_dot_Q4_0(row, x, xsum, m, cols, out); break;
    case Q4_1: row_dot_Q4_1(row, x, xsum, m, cols, out); break;
    case Q8_0: row_dot_Q8_0(row, x, xsum, m, cols, out); break;
    case Q4_K: row_dot_Q4_K(row, x, xsum, m, cols, out); break;
    case Q5_K: row_dot_Q5_K(row, x, xsum, m, cols, out); break;
    default: row_dot_Q6_K(row, x, xsum, m, cols, out); break;
    }
}
#endif

/* Portable path: one block dequantized to the stack, then dotted with each row of x. */
static void row_dot_portable(int type, const uint8_t *row, const float *x, int64_t m, int64_t cols, float *out) {
    float values[256];
    int64_t per_block = block_values(type), size = block_bytes(type), blocks = cols / per_block;
    for (int64_t i = 0; i < m; i++) out[i] = 0.0f;
    for (int64_t k = 0; k < blocks; k++) {
        dequantize_block(type, row + (size_t)(k * size), values);
        for (int64_t i = 0; i < m; i++) {
            const float *xi = x + i * cols + k * per_block;
            float sum = 0.0f;
            for (int64_t l = 0; l < per_block; l++) sum += values[l] * xi[l];
            out[i] += sum;
        }
    }
}

/* y[m, rows] = x[m, cols] . w[rows, cols]^T (+ bias); m <= MAX_M; returns 0, or -1 if m is out of range.
 * `portable` forces the portable loop (tests hold both paths to the same reference). */
int ember_ggml_gemv(int type, const float *x, const uint8_t *w, const float *bias, float *y, int64_t m, int64_t rows,
                    int64_t cols, int portable) {
    if (m > MAX_M || m < 1) return -1;
    int64_t groups = cols / 32, row_bytes = cols / block_values(type) * block_bytes(type);
    float *xsum = (float *)malloc(sizeof(float) * (size_t)(m * groups));
    if (xsum == NULL) return -2;
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < groups; g++) {
            float sum = 0.0f;
            for (int l = 0; l < 32; l++) sum += x[i * cols + 32 * g + l];
            xsum[i * groups + g] = sum;
        }
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n++) {
        float out[MAX_M];
        const uint8_t *row = w + (size_t)n * (size_t)row_bytes;
#ifdef __AVX2__
        if (!portable) row_dot_fast(type, row, x, xsum, m, cols, out);
        else
#endif
        row_dot_portable(type, row, x, m, cols, out);
        for (int64_t i = 0; i < m; i++) y[i * rows + n] = out[i] + (bias ? bias[n] : 0.0f);
    }
    free(xsum);
    return 0;
}

/* Which path ember_ggml_gemv takes on this build: 1 for AVX2 intrinsics, 0 for portable C. */
int ember_ggml_has_avx2(void) {
#ifdef __AVX2__
    return 1;
#else
    return 0;
#endif
}
