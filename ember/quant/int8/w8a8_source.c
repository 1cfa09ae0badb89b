/* W8A8 products for the CPU: per-token int8 activations x per-channel int8 weights, int32 sums.
 *
 * y[t, r] = ((float)acc[t, r] * sx[t]) * sw[r] (+ bias[r]), acc = sum_c qx[t, c] * qw[r, c] in int32,
 * with qx = round-half-even(x * (1 / sx)), sx = max|x[t, :]| / 127: the operations, in the order,
 * of ember/quant/int8/channel.py (built with -ffp-contract=off, so no product is fused into a sum and
 * both give the same bits). Codes lie in -127..127.
 *
 * AVX2 has no int8 x int8 dot product: |w| (unsigned) . (x with w's sign) through maddubs gives int16
 * pairs (at most 2 * 127 * 127 = 32258: no saturation), madd with ones widens them to int32. One
 * load of a weight row serves every token row (up to MAX_M at a time), so decode streams the int8
 * weight once: a quarter of the float32 bytes. Rows are split over OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define MAX_M 8
#define MAX_CODE 127

typedef struct {
    const int8_t *codes; /* [n, k] */
    const float *scales; /* [n] */
} w8a8_weight;

/* One token row -> codes; returns its scale (0 for an all-zero row, whose codes are then 0). */
static float quantize_row(const float *x, int64_t k, int8_t *q) {
    float amax = 0.0f;
    for (int64_t c = 0; c < k; c++) {
        float a = fabsf(x[c]);
        amax = a > amax ? a : amax;
    }
    float scale = amax / (float)MAX_CODE;
    float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t c = 0; c < k; c++) {
        float v = nearbyintf(x[c] * inverse); /* the default rounding mode: half to even, as torch.round */
        v = v > MAX_CODE ? MAX_CODE : (v < -MAX_CODE ? -MAX_CODE : v);
        q[c] = (int8_t)v;
    }
    return scale;
}

#ifdef __AVX2__
static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
#endif

/* acc[i] = qx[i, :] . w for i < m (m <= MAX_M), one weight row w of k codes. */
static void row_products(const int8_t *w, const int8_t *qx, int64_t m, int64_t k, int32_t *acc) {
    int64_t c = 0;
#ifdef __AVX2__
    __m256i sums[MAX_M];
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < m; i++) sums[i] = _mm256_setzero_si256();
    for (; c + 32 <= k; c += 32) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + c));
        __m256i magnitude = _mm256_sign_epi8(wv, wv);
        for (int64_t i = 0; i < m; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(qx + i * k + c));
            __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, wv));
            sums[i] = _mm256_add_epi32(sums[i], _mm256_madd_epi16(pairs, ones));
        }
    }
    for (int64_t i = 0; i < m; i++) acc[i] = hsum_epi32(sums[i]);
#else
    for (int64_t i = 0; i < m; i++) acc[i] = 0;
#endif
    for (; c < k; c++)
        for (int64_t i = 0; i < m; i++) acc[i] += (int32_t)w[c] * (int32_t)qx[i * k + c];
}

/* acc[m, n] = qx[m, k] . qw[n, k]^T in int32, any m (MAX_M token rows per pass over the weight). */
void ember_w8a8_int_products(const int8_t *qx, const int8_t *qw, int32_t *acc, int64_t m, int64_t n, int64_t k) {
    for (int64_t start = 0; start < m; start += MAX_M) {
        int64_t rows = m - start < MAX_M ? m - start : MAX_M;
        #pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            int32_t out[MAX_M];
            row_products(qw + r * k, qx + start * k, rows, k, out);
            for (int64_t i = 0; i < rows; i++) acc[(start + i) * n + r] = out[i];
        }
    }
}

/* y[m, n] = x[m, k] . W^T (+ bias) with the compiled decoder layer's gemm_fn signature (weight: w8a8_weight).
 * MAX_M token rows at a time: quantized into a stack buffer, then one pass over the weight, each int32
 * sum scaled once. */
void ember_w8a8_linear(const float *x, const void *weight, const float *bias, float *y, int64_t m, int64_t n, int64_t k) {
    const w8a8_weight *w = (const w8a8_weight *)weight;
    int8_t qx[MAX_M * k];
    float sx[MAX_M];
    for (int64_t start = 0; start < m; start += MAX_M) {
        int64_t rows = m - start < MAX_M ? m - start : MAX_M;
        for (int64_t i = 0; i < rows; i++) sx[i] = quantize_row(x + (start + i) * k, k, qx + i * k);
        #pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            int32_t out[MAX_M];
            row_products(w->codes + r * k, qx, rows, k, out);
            for (int64_t i = 0; i < rows; i++) {
                float value = ((float)out[i] * sx[i]) * w->scales[r];
                y[(start + i) * n + r] = bias != NULL ? value + bias[r] : value;
            }
        }
    }
}

/* 1 where the integer sums run on AVX2 (maddubs), 0 for the portable loop. */
int ember_w8a8_has_avx2(void) {
#ifdef __AVX2__
    return 1;
#else
    return 0;
#endif
}
