/* Small helpers the layer kernels share (included by elementwise.c, gemm.c, paged_attention.c;
   native_build.load_cpu_kernels splices local includes into the source it compiles, so the
   build cache key covers this file too). EMBER_AVX2 is set where the CPU has AVX2 and FMA,
   EMBER_AVX512 where it also has AVX-512 (foundation: 512-bit FMA, masked loads, lane permutes). */
#include <stdint.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EMBER_AVX2 1
#if defined(__AVX512F__)
#define EMBER_AVX512 1
#endif
#endif

static inline float bf16_to_f32(uint16_t value) {
    union { uint32_t bits; float number; } converted;
    converted.bits = (uint32_t)value << 16;
    return converted.number;
}

#ifdef EMBER_AVX2
/* The sum of v's 8 lanes. */
static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

/* e^x: x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-6 polynomial (Cephes' expf coefficients), 2^n through
   the exponent bits. Within 2 ulp over the clamped range [-87.3, 88.3] (below it: ~1e-38, not 0). EXP_STEPS is
   the body for any width: V the intrinsics' prefix, T the float vector type, ROUND a round-to-nearest. */
#define EXP_STEPS(V, T, ROUND, x)                                                                     \
    x = V##_min_ps(V##_max_ps(x, V##_set1_ps(-87.3f)), V##_set1_ps(88.3f));                           \
    T n = ROUND(V##_mul_ps(x, V##_set1_ps(1.44269504088896341f)));                                    \
    T r = V##_fnmadd_ps(n, V##_set1_ps(0.693359375f), x);                                             \
    r = V##_fnmadd_ps(n, V##_set1_ps(-2.12194440e-4f), r);                                            \
    T p = V##_set1_ps(1.9875691500e-4f);                                                              \
    p = V##_fmadd_ps(p, r, V##_set1_ps(1.3981999507e-3f));                                            \
    p = V##_fmadd_ps(p, r, V##_set1_ps(8.3334519073e-3f));                                            \
    p = V##_fmadd_ps(p, r, V##_set1_ps(4.1665795894e-2f));                                            \
    p = V##_fmadd_ps(p, r, V##_set1_ps(1.6666665459e-1f));                                            \
    p = V##_fmadd_ps(p, r, V##_set1_ps(5.0000001201e-1f));                                            \
    p = V##_fmadd_ps(p, V##_mul_ps(r, r), V##_add_ps(r, V##_set1_ps(1.0f)));

#define ROUND_NEAREST_256(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* e^x for 8 floats. */
static inline __m256 exp8(__m256 x) {
    EXP_STEPS(_mm256, __m256, ROUND_NEAREST_256, x)
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

#ifdef EMBER_AVX512
#define ROUND_NEAREST_512(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* e^x for 16 floats (exp8's steps, the same values lane for lane). */
static inline __m512 exp16(__m512 x) {
    EXP_STEPS(_mm512, __m512, ROUND_NEAREST_512, x)
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}
#endif
#endif
