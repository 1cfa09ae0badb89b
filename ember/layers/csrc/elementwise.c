/* The small per-token ops of a decoder layer, one call each instead of a chain of torch ops.

   At decode a layer's products stream the weights at memory speed; what is left is a dozen
   elementwise ops per layer whose cost is the dispatch, not the arithmetic. These run in
   float32 (weights of the norm float32 or bfloat16) over contiguous rows:
   - ember_rms_norm: out = x / rms(x) * weight, optionally over x + delta (the residual add fused,
     the sum written too, as the residual stream goes on from it);
   - ember_rotary: rotary positions in place, half-split layout, tables [positions, head_dim];
   - ember_silu_mul: out = silu(gate) * up over [gate | up] rows (SwiGLU).
   Built with -march=native: AVX2+FMA where the CPU has them (a vector exp for SiLU), plain C
   otherwise. */
#include <math.h>
#include "vector_math.h"

#define PARALLEL_FLOATS 262144 /* below this many floats one thread does the op */

static inline float weight_at(const void *weight, int weight_bf16, int64_t i) {
    return weight_bf16 ? bf16_to_f32(((const uint16_t *)weight)[i]) : ((const float *)weight)[i];
}

/* Row r: s = x[r] (+ delta[r], stored in sum[r]); out[r] = s * rsqrt(mean(s^2) + eps) * weight. */
void ember_rms_norm(const float *x, const float *delta, float *sum, const void *weight, int weight_bf16,
                    float *out, int64_t rows, int64_t dim, float eps) {
    #pragma omp parallel for if (rows * dim >= PARALLEL_FLOATS)
    for (int64_t r = 0; r < rows; r++) {
        const float *s = x + r * dim;
        if (delta) {
            float *to = sum + r * dim;
            const float *d = delta + r * dim;
            #pragma omp simd
            for (int64_t i = 0; i < dim; i++) to[i] = s[i] + d[i];
            s = to;
        }
        float squares = 0.0f;
        #pragma omp simd reduction(+:squares)
        for (int64_t i = 0; i < dim; i++) squares += s[i] * s[i];
        const float scale = 1.0f / sqrtf(squares / (float)dim + eps);
        float *o = out + r * dim;
        if (weight_bf16) {
            for (int64_t i = 0; i < dim; i++) o[i] = s[i] * scale * weight_at(weight, 1, i);
        } else {
            const float *w = (const float *)weight;
            #pragma omp simd
            for (int64_t i = 0; i < dim; i++) o[i] = s[i] * scale * w[i];
        }
    }
}

/* Heads [0, heads) of token t start at x + t * token_stride, head_dim apart; each is rotated by
   positions[t]: (a, b) -> (a cos - b sin, b cos + a sin) over its two halves.
   Returns 0; -1 (nothing rotated) when a position is outside the tables' num_positions rows. */
int ember_rotary(float *x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                 const int64_t *positions, const float *cos_table, const float *sin_table, int64_t num_positions) {
    const int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= num_positions) return -1;
    #pragma omp parallel for if (tokens * heads * head_dim >= PARALLEL_FLOATS)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_table + positions[t] * head_dim, *s = sin_table + positions[t] * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + t * token_stride + h * head_dim;
            #pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
    return 0;
}

/* Row r of gate_up is [gate (inner) | up (inner)]; out[r] = gate / (1 + e^-gate) * up. */
void ember_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t inner) {
    #pragma omp parallel for if (rows * inner >= PARALLEL_FLOATS)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * inner, *u = g + inner;
        float *o = out + r * inner;
        int64_t i = 0;
#ifdef EMBER_AVX2
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        for (; i + 8 <= inner; i += 8) {
            __m256 gate = _mm256_loadu_ps(g + i);
            __m256 denominator = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gate)));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gate, denominator), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < inner; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
