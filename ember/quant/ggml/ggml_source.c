/* ember's kernels for GGML block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and ember's own
 * NF4 (64 values: fp16 absmax scale, 4-bit codes into the NormalFloat table) and FP8 (32 values:
 * an E8M0 power-of-two scale, e4m3 codes: OCP MXFP8's block). The last two have no int8 path.
 *
 * Two entry points, both parallel over weight rows on the OpenMP runtime:
 *   ember_ggml_dequantize: rows of blocks -> float32, bit-exact with the `gguf` package (the
 *     file is built with -ffp-contract=off so `d * q - m` is never fused into one rounding);
 *   ember_ggml_gemv: y[i, n] = sum_j x[i, j] * w[n, j] for float32 rows x (MAX_M per pass over the weights), the weights
 *     decoded in registers, on one of three paths:
 *     PATH_INT8 (the default where AVX2 exists): x is first quantized to int8 per 32 values
 *       (d = max|x| / 127, q = round-half-even(x / d), as llama.cpp's Q8 activation blocks), then
 *       each 32-value block is one integer dot product (maddubs + madd on AVX2, dpbusd where the
 *       compiler targets AVX-VNNI or AVX512-VNNI) scaled once in float32:
 *       sum((dw*q + m) * dx*qx) = dw*dx * sum(q*qx) + m * dx*sum(qx). The result is the float
 *       product of the weights with the int8-rounded x (error per block <= sum|w| * dx / 2).
 *     PATH_FLOAT: the weights are widened to float32 and dotted with x in FMA: exact up to
 *       float32 summation order, and compute-bound (the reason PATH_INT8 exists).
 *     PATH_PORTABLE: plain C, one block dequantized at a time; the fallback without AVX2.
 *     Where the CPU has AMX, PATH_INT8 products of many rows (prefill) run on tiles instead: each 32 weight rows are
 *     dequantized (exactly, then rounded to bfloat16) once per call and multiplied with x rounded to bfloat16 by
 *     tdpbf16ps, 8,192 multiply-adds an instruction (amx_linear; its error is below the int8 path's: x keeps 8
 *     significant bits per value instead of 8 per 32-value block).
 * -march=native picks the instruction set at build time (#ifdef __AVX2__ / VNNI / AMX below).
 *
 * Q4_0_X8 / Q4_1_X8 / Q5_0_X8 / Q5_1_X8 / Q8_0_X8 / Q4_K_X8 / Q5_K_X8 are ember's own layouts of those GGML formats for these products
 * (the same bytes, moved): rows 8g..8g+7 are stored as one group, block k of all eight together, the codes four
 * bytes per row at a time (see x8_part). One 32-byte load then holds four codes of every row, one row per 32-bit
 * lane, and a dpbusd against one broadcast activation word leaves each row's partial sum in its own lane: a block of
 * eight rows costs eight dot-product instructions per activation row and no reduction across lanes (row by row, each
 * row's block needed its own dot products and a horizontal sum, which made Q4 decode compute-bound). */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q4_0_X8 = 102, Q4_1_X8 = 103, Q5_0_X8 = 106, Q5_1_X8 = 107, Q8_0_X8 = 108, Q4_K_X8 = 112, Q5_K_X8 = 113, Q6_K_X8 = 114, Q2_K_X8 = 110, Q3_K_X8 = 111, NF4 = 200, FP8 = 201 };

/* QLoRA's NormalFloat-4 levels (the bitsandbytes constants). */
static const float NF4_LEVELS[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f, -0.18477343022823334f,
    -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
#define MAX_M 8
enum { PATH_INT8 = 0, PATH_FLOAT = 1, PATH_PORTABLE = 2 };

/* 32 activations as int8: x ~= d * q; qsum = d * sum(q), the block's sum as the kernel sees it; sum = sum(q). */
typedef struct {
    float d, qsum;
    int32_t sum, half_sum[2]; /* half_sum: sum(q) over values 0-15 and 16-31 (Q6_K_X8's 16-value scale groups) */
    int8_t q[32];
} act_block;

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

static int64_t block_values(int type) {
    if (type == Q2_K || type == Q3_K || type == Q4_K || type == Q5_K || type == Q6_K || type == Q2_K_X8 || type == Q3_K_X8 ||
        type == Q4_K_X8 || type == Q5_K_X8 || type == Q6_K_X8)
        return 256;
    return type == NF4 ? 64 : 32;
}

/* 2^(e - 127) for an E8M0 scale byte; the quantizer writes e in 1..254, where this is a normal float. */
static inline float e8m0_to_float(uint8_t e) {
    uint32_t bits = (uint32_t)e << 23;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

/* An e4m3 byte (sign, 4 exponent bits biased by 7, 3 mantissa bits) as float: its bits placed in a
 * half (bias 15) and scaled by 2^8, exact for normals and subnormals (0x7F, e4m3's NaN, is never written). */
static inline float e4m3_to_float(uint8_t b) {
    uint16_t h = (uint16_t)(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7));
    uint8_t bytes[2];
    memcpy(bytes, &h, 2);
    return half_to_float(bytes) * 256.0f;
}

static int64_t block_bytes(int type) {
    switch (type) {
    case Q4_0: case Q4_0_X8: return 18;
    case Q4_1: case Q4_1_X8: return 20;
    case Q5_0: case Q5_0_X8: return 22;
    case Q5_1: case Q5_1_X8: return 24;
    case Q8_0: case Q8_0_X8: return 34;
    case Q2_K: case Q2_K_X8: return 84;
    case Q3_K: case Q3_K_X8: return 110;
    case Q4_K: case Q4_K_X8: return 144;
    case Q5_K: case Q5_K_X8: return 176;
    case Q6_K: case Q6_K_X8: return 210;
    case NF4: return 34;
    case FP8: return 33;
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

/* Q2_K / Q3_K: value v of a super-block takes its 2 low bits from byte 32 * (v / 128) + v % 32 of the codes, shifted
 * by 2 * (v / 32 % 4) (four values per byte, a 32-byte run per 128 values), and its scale from group v / 16. */
static inline int k_low2(const uint8_t *qs, int v) { return (qs[32 * (v / 128) + v % 32] >> (2 * (v / 32 % 4))) & 3; }

/* Q3_K's scale of 16-value group i (0..15): 4 low bits from byte i % 8 (high nibble for i >= 8), 2 high bits from
 * byte 8 + i % 4 at bit 2 * (i / 4), minus 32. */
static inline int q3_k_scale(const uint8_t *scales, int i) {
    int low = i < 8 ? scales[i] & 15 : scales[i - 8] >> 4;
    return (low | (((scales[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
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
    case Q5_0:
    case Q5_1: { /* fp16 d (and m), 32 high bits, 16 bytes of low nibbles: value l = low nibble | bit l of the high bits << 4 */
        float d = half_to_float(b), m = type == Q5_1 ? half_to_float(b + 2) : 0.0f;
        const uint8_t *high = b + (type == Q5_1 ? 4 : 2), *qs = high + 4;
        uint32_t bits;
        memcpy(&bits, high, 4);
        for (int l = 0; l < 16; l++) {
            int low = (qs[l] & 15) | (int)(((bits >> l) & 1u) << 4), up = (qs[l] >> 4) | (int)(((bits >> (l + 16)) & 1u) << 4);
            if (type == Q5_0) {
                out[l] = d * (float)(low - 16);
                out[l + 16] = d * (float)(up - 16);
            } else {
                out[l] = d * (float)low + m;
                out[l + 16] = d * (float)up + m;
            }
        }
        break;
    }
    case Q8_0: {
        float d = half_to_float(b);
        for (int l = 0; l < 32; l++) out[l] = (float)(int8_t)b[2 + l] * d;
        break;
    }
    case Q4_K:
    case Q5_K: { /* the two formats' inner loops kept apart: each then vectorizes */
        float d = half_to_float(b), dmin = half_to_float(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = type == Q4_K ? b + 16 : b + 48;
        for (int s = 0; s < 8; s++) {
            int scale, min, shift = 4 * (s & 1);
            scale_min_k4(s, scales, &scale, &min);
            float ds = d * (float)scale, dm = dmin * (float)min;
            const uint8_t *codes = qs + 32 * (s / 2);
            if (type == Q4_K)
                for (int l = 0; l < 32; l++) out[32 * s + l] = ds * (float)((codes[l] >> shift) & 15) - dm;
            else
                for (int l = 0; l < 32; l++) out[32 * s + l] = ds * (float)(((codes[l] >> shift) & 15) | (((qh[l] >> s) & 1) << 4)) - dm;
        }
        break;
    }
    case NF4: {
        float d = half_to_float(b);
        for (int l = 0; l < 32; l++) {
            out[l] = d * NF4_LEVELS[b[2 + l] & 15];
            out[l + 32] = d * NF4_LEVELS[b[2 + l] >> 4];
        }
        break;
    }
    case FP8: {
        float scale = e8m0_to_float(b[0]);
        for (int l = 0; l < 32; l++) out[l] = e4m3_to_float(b[1 + l]) * scale;
        break;
    }
    case Q2_K: { /* scales[16] (low nibble scale, high nibble min), 64 code bytes, fp16 d, fp16 dmin: dl * q - ml */
        float d = half_to_float(b + 80), dmin = half_to_float(b + 82);
        for (int v = 0; v < 256; v++) {
            float dl = d * (float)(b[v / 16] & 15), ml = dmin * (float)(b[v / 16] >> 4);
            out[v] = dl * (float)k_low2(b + 16, v) - ml;
        }
        break;
    }
    case Q3_K: { /* 32 bytes of high bits (bit v / 32 of byte v % 32; clear means minus 4), 64 code bytes, 12 scale bytes, fp16 d */
        float d = half_to_float(b + 108);
        for (int v = 0; v < 256; v++) {
            int q = k_low2(b + 32, v) - (((b[v % 32] >> (v / 32)) & 1) ? 0 : 4);
            out[v] = (d * (float)q3_k_scale(b + 96, v / 16)) * (float)q;
        }
        break;
    }
    case Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        float d = half_to_float(b + 208);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) { /* 32 values: low nibbles (or high, k >= 2) of ql, 2 bits of qh, one scale per 16 */
                const uint8_t *low = ql + 64 * h + 32 * (k & 1), *high = qh + 32 * h;
                const int low_shift = k < 2 ? 0 : 4, high_shift = 2 * k;
                for (int half = 0; half < 2; half++) {
                    const int first = 16 * half, index = 128 * h + 32 * k + first;
                    const float scale = d * (float)scales[index / 16];
                    for (int l = first; l < first + 16; l++)
                        out[index - first + l] = scale * (float)((((low[l] >> low_shift) & 15) | (((high[l] >> high_shift) & 3) << 4)) - 32);
                }
            }
        break;
    }
    }
}

static int is_x8(int type) {
    return type == Q4_0_X8 || type == Q4_1_X8 || type == Q5_0_X8 || type == Q5_1_X8 || type == Q8_0_X8 || type == Q4_K_X8 ||
           type == Q5_K_X8 || type == Q6_K_X8 || type == Q2_K_X8 || type == Q3_K_X8;
}

/* The plain format an x8 layout moves (Q4_0_X8 -> Q4_0); other types are their own. */
static int plain_type(int type) {
    switch (type) {
    case Q4_0_X8: return Q4_0;
    case Q4_1_X8: return Q4_1;
    case Q5_0_X8: return Q5_0;
    case Q5_1_X8: return Q5_1;
    case Q8_0_X8: return Q8_0;
    case Q4_K_X8: return Q4_K;
    case Q5_K_X8: return Q5_K;
    case Q6_K_X8: return Q6_K;
    case Q2_K_X8: return Q2_K;
    case Q3_K_X8: return Q3_K;
    default: return type;
    }
}

/* An x8 layout's fp16 fields per row (d, or d and m) and bytes of high bits per row (Q5: 4). */
static int x8_halves(int type) { return type == Q4_1_X8 || type == Q5_1_X8 ? 2 : 1; }
static int x8_high_bytes(int type) { return type == Q5_0_X8 || type == Q5_1_X8 ? 4 : 0; }

/* Bytes [start, stop) of a plain block, stored for the eight rows of a group side by side, in row order. A group's
 * block k is its layout's parts one after the other (ember/quant/ggml/interleave.py describes the same tables). */
typedef struct { int start, stop; } x8_part;
/* Q4 / Q5: the fields, then the 16 code bytes in four 4-byte parts, so a 32-byte load holds four code bytes of each of
 * the eight rows, one row per 32-bit lane (x8_group_q4_q5_body); Q5's 32 fifth bits are one 4-byte part. */
static const x8_part X8_Q4_0[] = {{0, 2}, {2, 6}, {6, 10}, {10, 14}, {14, 18}};
static const x8_part X8_Q4_1[] = {{0, 2}, {2, 4}, {4, 8}, {8, 12}, {12, 16}, {16, 20}};
static const x8_part X8_Q5_0[] = {{0, 2}, {2, 6}, {6, 10}, {10, 14}, {14, 18}, {18, 22}};
static const x8_part X8_Q5_1[] = {{0, 2}, {2, 4}, {4, 8}, {8, 12}, {12, 16}, {16, 20}, {20, 24}};
static const x8_part X8_Q8_0[] = {{0, 2}, {2, 6}, {6, 10}, {10, 14}, {14, 18}, {18, 22}, {22, 26}, {26, 30}, {30, 34}};
/* Eight 4-byte parts from byte a: 32 bytes. */
#define X8_WORDS_32(a) {a, a + 4}, {a + 4, a + 8}, {a + 8, a + 12}, {a + 12, a + 16}, {a + 16, a + 20}, {a + 20, a + 24}, \
    {a + 24, a + 28}, {a + 28, a + 32}
/* Q4_K: d, dmin, the 12 scale bytes as three 32-bit words, the 128 code bytes in 4-byte parts; Q5_K: the same with
 * its 32 bytes of fifth bits in eight 4-byte parts before the codes. */
#define X8_K_FIELDS {0, 2}, {2, 4}, {4, 8}, {8, 12}, {12, 16}
static const x8_part X8_Q4_K[] = {X8_K_FIELDS, X8_WORDS_32(16), X8_WORDS_32(48), X8_WORDS_32(80), X8_WORDS_32(112)};
static const x8_part X8_Q5_K[] = {X8_K_FIELDS, X8_WORDS_32(16), X8_WORDS_32(48), X8_WORDS_32(80), X8_WORDS_32(112),
                                  X8_WORDS_32(144)};
/* Q6_K: its 128 bytes of low nibbles, 64 bytes of high bit pairs and 16 int8 scales in 4-byte parts, then d. */
static const x8_part X8_Q6_K[] = {X8_WORDS_32(0), X8_WORDS_32(32), X8_WORDS_32(64), X8_WORDS_32(96), X8_WORDS_32(128),
                                  X8_WORDS_32(160), {192, 196}, {196, 200}, {200, 204}, {204, 208}, {208, 210}};
/* Q2_K: its 16 scale/min bytes and 64 code bytes in 4-byte parts, then d and dmin. Q3_K: its 32 bytes of high bits, 64
 * code bytes and 12 scale bytes in 4-byte parts, then d. */
static const x8_part X8_Q2_K[] = {{0, 4}, {4, 8}, {8, 12}, {12, 16}, X8_WORDS_32(16), X8_WORDS_32(48), {80, 82}, {82, 84}};
static const x8_part X8_Q3_K[] = {X8_WORDS_32(0), X8_WORDS_32(32), X8_WORDS_32(64), {96, 100}, {100, 104}, {104, 108}, {108, 110}};

static int x8_layout(int type, const x8_part **parts) {
    switch (type) {
    case Q4_0_X8: *parts = X8_Q4_0; return 5;
    case Q4_1_X8: *parts = X8_Q4_1; return 6;
    case Q5_0_X8: *parts = X8_Q5_0; return 6;
    case Q5_1_X8: *parts = X8_Q5_1; return 7;
    case Q8_0_X8: *parts = X8_Q8_0; return 9;
    case Q4_K_X8: *parts = X8_Q4_K; return 5 + 32;
    case Q6_K_X8: *parts = X8_Q6_K; return 48 + 4 + 1;
    case Q2_K_X8: *parts = X8_Q2_K; return 4 + 16 + 2;
    case Q3_K_X8: *parts = X8_Q3_K; return 8 + 16 + 3 + 1;
    default: *parts = X8_Q5_K; return 5 + 8 + 32;
    }
}

/* One x8 group (8 rows x `blocks` blocks) -> the eight plain rows, `blocks` blocks each, row after row. */
static void x8_to_plain_group(int type, const uint8_t *group, int64_t blocks, uint8_t *rows) {
    const x8_part *parts;
    const int count = x8_layout(type, &parts);
    const int64_t size = block_bytes(type);
    for (int64_t k = 0; k < blocks; k++) {
        const uint8_t *b = group + (size_t)(k * 8 * size);
        for (int p = 0; p < count; p++) {
            const int width = parts[p].stop - parts[p].start;
            for (int slot = 0; slot < 8; slot++) {
                uint8_t *to = rows + (size_t)((slot * blocks + k) * size + parts[p].start);
                if (width == 4) /* most parts: a constant-size copy the compiler inlines (a call per word cost more than the copy) */
                    memcpy(to, b + 4 * slot, 4);
                else
                    memcpy(to, b + width * slot, (size_t)width);
            }
            b += 8 * width;
        }
    }
}

/* An x8 weight -> float32 [rows, cols] (rows a multiple of 8): each group through its plain rows. */
static void dequantize_x8(int type, const uint8_t *w, float *out, int64_t rows, int64_t cols) {
    int64_t size = block_bytes(type), blocks = cols / block_values(type), group_bytes = 8 * blocks * size;
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < rows / 8; g++) {
        uint8_t *plain = (uint8_t *)malloc((size_t)group_bytes);
        if (plain == NULL) {
            for (int64_t i = 0; i < 8 * cols; i++) out[(size_t)(8 * g * cols + i)] = NAN;
            continue;
        }
        x8_to_plain_group(type, w + (size_t)(g * group_bytes), blocks, plain);
        for (int64_t r = 0; r < 8; r++)
            for (int64_t k = 0; k < blocks; k++)
                dequantize_block(plain_type(type), plain + (size_t)((r * blocks + k) * size),
                                 out + (size_t)((8 * g + r) * cols + block_values(type) * k));
        free(plain);
    }
}

/* rows x cols weights (rows of blocks, row_bytes apart; for x8 layouts groups of eight rows) -> float32 [rows, cols]. */
void ember_ggml_dequantize(int type, const uint8_t *w, float *out, int64_t rows, int64_t cols) {
    if (is_x8(type)) {
        dequantize_x8(type, w, out, rows, cols);
        return;
    }
    int64_t per_block = block_values(type), size = block_bytes(type), blocks = cols / per_block;
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n++)
        for (int64_t k = 0; k < blocks; k++)
            dequantize_block(type, w + (size_t)(n * blocks + k) * (size_t)size, out + (size_t)n * (size_t)cols + (size_t)(k * per_block));
}

#ifdef __AVX2__
/* The 32 codes of run (h, part) of a Q6_K super-block (values 128h + 32part + l), minus 32: -32..31. */
static inline __attribute__((always_inline)) __m256i q6_k_codes32(const uint8_t *b, int h, int part) {
    __m256i low = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (part & 1)));
    low = _mm256_and_si256(part < 2 ? low : _mm256_srli_epi16(low, 4), _mm256_set1_epi8(15));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * part), _mm256_set1_epi8(3)), 4);
    return _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
}

/* The 32 codes of sub-block s of a Q4_K (0..15) or Q5_K (0..31, its fifth bit added) super-block. */
static inline __attribute__((always_inline)) __m256i k4_codes32(int type, const uint8_t *b, int s) {
    __m256i v = _mm256_loadu_si256((const __m256i *)((type == Q4_K ? b + 16 : b + 48) + 32 * (s / 2)));
    __m256i q = _mm256_and_si256((s & 1) ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(15));
    if (type != Q5_K) return q;
    __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
    return _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, s), _mm256_set1_epi8(1)), 4));
}

/* The sum of a vector's eight int32 lanes. */
static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

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

/* 32 signed bytes in memory -> four vectors of 8 floats, each widened straight from its 8 bytes (what widen32
 * gives, with fewer shuffles: the float32-activation Q8_0 product, e.g. an LM head, is bound by this decode). */
static inline void widen32_at(const uint8_t *p, __m256 *w) {
    for (int i = 0; i < 4; i++) w[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * i))));
}

/* 8 codes 0..15 (low bytes of `codes`) -> their NF4 levels: two 8-entry permutes, bit 3 picks which. */
static inline __m256 nf4_levels8(__m128i codes) {
    __m256i index = _mm256_cvtepu8_epi32(codes);
    __m256 low = _mm256_permutevar8x32_ps(_mm256_loadu_ps(NF4_LEVELS), index);
    __m256 high = _mm256_permutevar8x32_ps(_mm256_loadu_ps(NF4_LEVELS + 8), index);
    return _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(index, 28)));
}

/* 32 codes 0..15 -> four vectors of 8 NF4 levels. */
static inline void nf4_levels32(__m256i codes, __m256 *w) {
    __m128i low = _mm256_castsi256_si128(codes), high = _mm256_extracti128_si256(codes, 1);
    w[0] = nf4_levels8(low);
    w[1] = nf4_levels8(_mm_srli_si128(low, 8));
    w[2] = nf4_levels8(high);
    w[3] = nf4_levels8(_mm_srli_si128(high, 8));
}

/* 16 e4m3 bytes -> two vectors of 8 floats / 256 (the 2^8 is folded into the block scale). */
static inline void e4m3_widen16(__m128i v, __m256 *w) {
    __m256i wide = _mm256_cvtepu8_epi16(v);
    __m256i bits = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(wide, _mm256_set1_epi16(0x80)), 8),
                                   _mm256_slli_epi16(_mm256_and_si256(wide, _mm256_set1_epi16(0x7F)), 7));
    w[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(bits));
    w[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1));
}

static inline void e4m3_widen32(__m256i v, __m256 *w) {
    e4m3_widen16(_mm256_castsi256_si128(v), w);
    e4m3_widen16(_mm256_extracti128_si256(v, 1), w + 2);
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

/* A Q5_0 / Q5_1 block's 32 codes 0..31 (value order): the 16 bytes of low nibbles at qs, bit l of the 32-bit
 * field at high as bit 4 of value l (each byte picks its field byte, tests its bit, keeps 16 where set). */
static inline __m256i codes5_32(const uint8_t *high, const uint8_t *qs) {
    uint32_t bits;
    memcpy(&bits, high, 4);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m256i low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
    __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                         _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    return _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(16)));
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

#ifdef __AVX512F__
/* Q8_0 . float32 x in 512-bit vectors: 16 codes widen in one step (the 256-bit walk below takes four instructions
 * per 8 codes and bound the float32-activation product, e.g. a tied Q8_0 LM head, by them, not by memory). Each
 * row's sum has one order whatever m, as in the walk below. */
static inline __attribute__((always_inline)) void row_dot_q8_0_avx512(const uint8_t *row, const float *x, const int64_t m,
                                                                     int64_t cols, float *out) {
    __m512 acc[MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < cols / 32; k++) {
        const uint8_t *b = row + (size_t)(k * block_bytes(Q8_0));
        __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2))));
        __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18))));
        __m512 d = _mm512_set1_ps(half_to_float(b));
        for (int64_t i = 0; i < m; i++) {
            const float *xi = x + i * cols + 32 * k;
            __m512 s = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xi + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(xi)));
            acc[i] = _mm512_fmadd_ps(d, s, acc[i]);
        }
    }
    for (int64_t i = 0; i < m; i++) out[i] = _mm512_reduce_add_ps(acc[i]);
}
#endif

#ifdef __AVX512F__
/* 32 int8 codes -> two vectors of 16 floats. */
static inline __attribute__((always_inline)) void widen32_avx512(__m256i q, __m512 *w) {
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    w[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
}

/* Q4_K / Q5_K / Q6_K . float32 x in 512-bit vectors: 16 codes widen in two instructions, a Q6_K 16-value group is one
 * vector with one scale (the scale goes into the weights once, for every row), and each row keeps two sums (values
 * 0-15 and 16-31 of each run) so one row's chain of dependent FMAs does not set the pace. The 256-bit walk below held a float32-activation LM head (a Q4_K_M file's Q6_K output) to
 * 17 GB/s, a Q4_K one to 8. Each row's sum has one order whatever m. */
static inline __attribute__((always_inline)) void row_dot_k_avx512(const int type, const uint8_t *row, const float *x,
                                                                  const float *xsum, const int64_t m, int64_t cols, float *out) {
    __m512 acc[MAX_M][2];
    float offset[MAX_M];
    const int64_t groups = cols / 32, size = block_bytes(type);
    for (int64_t i = 0; i < m; i++) { acc[i][0] = acc[i][1] = _mm512_setzero_ps(); offset[i] = 0.0f; }
    for (int64_t k = 0; k < cols / 256; k++) {
        const uint8_t *b = row + (size_t)(k * size);
        __m512 w[2];
        if (type == Q6_K) {
            const int8_t *scales = (const int8_t *)(b + 192);
            const float d = half_to_float(b + 208);
            for (int h = 0; h < 2; h++) {
                for (int part = 0; part < 4; part++) {
                    widen32_avx512(q6_k_codes32(b, h, part), w);
                    const int index = 8 * h + 2 * part;
                    w[0] = _mm512_mul_ps(w[0], _mm512_set1_ps(d * (float)scales[index]));
                    w[1] = _mm512_mul_ps(w[1], _mm512_set1_ps(d * (float)scales[index + 1]));
                    const int64_t at = 256 * k + 128 * h + 32 * part;
                    for (int64_t i = 0; i < m; i++) {
                        const float *xi = x + i * cols + at;
                        acc[i][0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xi), acc[i][0]);
                        acc[i][1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xi + 16), acc[i][1]);
                    }
                }
            }
        } else { /* Q4_K, Q5_K: ds * (q . x) - dm * sum(x) per 32-value sub-block */
            const float d = half_to_float(b), dmin = half_to_float(b + 2);
            for (int s = 0; s < 8; s++) {
                int scale, min;
                scale_min_k4(s, b + 4, &scale, &min);
                widen32_avx512(k4_codes32(type, b, s), w);
                const __m512 ds = _mm512_set1_ps(d * (float)scale);
                w[0] = _mm512_mul_ps(w[0], ds);
                w[1] = _mm512_mul_ps(w[1], ds);
                const float dm = dmin * (float)min;
                for (int64_t i = 0; i < m; i++) {
                    const float *xi = x + i * cols + 256 * k + 32 * s;
                    acc[i][0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xi), acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xi + 16), acc[i][1]);
                    offset[i] -= dm * xsum[i * groups + 8 * k + s];
                }
            }
        }
    }
    for (int64_t i = 0; i < m; i++) out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1])) + offset[i];
}
#endif

/* Inlined into one copy per (type, m) below: with both constant, the accumulators live in registers. */
static inline __attribute__((always_inline)) void row_dot_avx2(const int type, const uint8_t *row, const float *x, const float *xsum,
                                                              const int64_t m, int64_t cols, float *out) {
#ifdef __AVX512F__
    if (type == Q8_0) { row_dot_q8_0_avx512(row, x, m, cols, out); return; }
    if (type == Q4_K || type == Q5_K || type == Q6_K) { row_dot_k_avx512(type, row, x, xsum, m, cols, out); return; }
#endif
    __m256 acc[MAX_M];
    float offset[MAX_M];
    __m256 w[4];
    const __m128i low4 = _mm_set1_epi8(15);
    const __m256i low4x2 = _mm256_set1_epi8(15);
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
        } else if (type == Q5_0 || type == Q5_1) {
            const uint8_t *high = b + (type == Q5_0 ? 2 : 4);
            __m256i q = codes5_32(high, high + 4);
            if (type == Q5_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
            widen32(q, w);
            accumulate32(w, half_to_float(b), type == Q5_1 ? half_to_float(b + 2) : 0.0f, x, xsum, m, cols, k, groups, 32 * k, acc, offset);
        } else if (type == Q8_0) {
            widen32_at(b + 2, w);
            accumulate32(w, half_to_float(b), 0.0f, x, xsum, m, cols, k, groups, 32 * k, acc, offset);
        } else if (type == NF4) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b + 2));
            float d = half_to_float(b);
            nf4_levels32(_mm256_and_si256(v, low4x2), w);
            accumulate32(w, d, 0.0f, x, xsum, m, cols, 2 * k, groups, 64 * k, acc, offset);
            nf4_levels32(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4x2), w);
            accumulate32(w, d, 0.0f, x, xsum, m, cols, 2 * k + 1, groups, 64 * k + 32, acc, offset);
        } else if (type == FP8) {
            e4m3_widen32(_mm256_loadu_si256((const __m256i *)(b + 1)), w);
            accumulate32(w, e8m0_to_float(b[0]) * 256.0f, 0.0f, x, xsum, m, cols, k, groups, 32 * k, acc, offset);
        } else if (type == Q2_K || type == Q3_K) { /* the block dequantized first: float32 activations are rare here */
            float values[256];
            dequantize_block(type, b, values);
            for (int c = 0; c < 8; c++) {
                for (int v = 0; v < 4; v++) w[v] = _mm256_loadu_ps(values + 32 * c + 8 * v);
                accumulate32(w, 1.0f, 0.0f, x, xsum, m, cols, 8 * k + c, groups, 256 * k + 32 * c, acc, offset);
            }
        } else if (type == Q4_K || type == Q5_K) {
            float d = half_to_float(b), dmin = half_to_float(b + 2);
            for (int s = 0; s < 8; s++) {
                int scale, min;
                scale_min_k4(s, b + 4, &scale, &min);
                widen32(k4_codes32(type, b, s), w);
                accumulate32(w, d * (float)scale, -dmin * (float)min, x, xsum, m, cols, 8 * k + s, groups, 256 * k + 32 * s, acc, offset);
            }
        } else { /* Q6_K */
            const int8_t *scales = (const int8_t *)(b + 192);
            float d = half_to_float(b + 208);
            for (int h = 0; h < 2; h++) {
                for (int part = 0; part < 4; part++) {
                    widen32(q6_k_codes32(b, h, part), w);
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
        case 5: row_dot_avx2(TYPE, row, x, xsum, 5, cols, out); break; \
        case 6: row_dot_avx2(TYPE, row, x, xsum, 6, cols, out); break; \
        case 7: row_dot_avx2(TYPE, row, x, xsum, 7, cols, out); break; \
        default: row_dot_avx2(TYPE, row, x, xsum, 8, cols, out); break; /* m == MAX_M */ \
        } \
    }
ROW_DOT_FOR_TYPE(Q4_0)
ROW_DOT_FOR_TYPE(Q4_1)
ROW_DOT_FOR_TYPE(Q5_0)
ROW_DOT_FOR_TYPE(Q5_1)
ROW_DOT_FOR_TYPE(Q8_0)
ROW_DOT_FOR_TYPE(Q2_K)
ROW_DOT_FOR_TYPE(Q3_K)
ROW_DOT_FOR_TYPE(Q4_K)
ROW_DOT_FOR_TYPE(Q5_K)
ROW_DOT_FOR_TYPE(Q6_K)
ROW_DOT_FOR_TYPE(NF4)
ROW_DOT_FOR_TYPE(FP8)

static void row_dot_fast(int type, const uint8_t *row, const float *x, const float *xsum, int64_t m, int64_t cols, float *out) {
    switch (type) {
    case Q4_0: row_dot_Q4_0(row, x, xsum, m, cols, out); break;
    case Q4_1: row_dot_Q4_1(row, x, xsum, m, cols, out); break;
    case Q5_0: row_dot_Q5_0(row, x, xsum, m, cols, out); break;
    case Q5_1: row_dot_Q5_1(row, x, xsum, m, cols, out); break;
    case Q8_0: row_dot_Q8_0(row, x, xsum, m, cols, out); break;
    case Q2_K: row_dot_Q2_K(row, x, xsum, m, cols, out); break;
    case Q3_K: row_dot_Q3_K(row, x, xsum, m, cols, out); break;
    case Q4_K: row_dot_Q4_K(row, x, xsum, m, cols, out); break;
    case Q5_K: row_dot_Q5_K(row, x, xsum, m, cols, out); break;
    case NF4: row_dot_NF4(row, x, xsum, m, cols, out); break;
    case FP8: row_dot_FP8(row, x, xsum, m, cols, out); break;
    default: row_dot_Q6_K(row, x, xsum, m, cols, out); break;
    }
}

/* acc + 32 unsigned bytes u . 32 signed bytes s, as 8 int32 partial sums (lane j: bytes 4j..4j+3).
 * Without VNNI, callers keep u <= 128 and |s| <= 127, so maddubs's int16 pairs never saturate. */
static inline __m256i dot_u8_s8_accumulate(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

static inline __m256i dot_u8_s8_i32(__m256i u, __m256i s) { return dot_u8_s8_accumulate(_mm256_setzero_si256(), u, s); }

/* dot_u8_s8_i32 as float. */
static inline __m256 dot_u8_s8(__m256i u, __m256i s) { return _mm256_cvtepi32_ps(dot_u8_s8_i32(u, s)); }

/* Signed bytes w . signed bytes s: |w| . (s with w's sign), the unsigned x signed product above. */
static inline __m256i dot_s8_s8_i32(__m256i w, __m256i s) { return dot_u8_s8_i32(_mm256_sign_epi8(w, w), _mm256_sign_epi8(s, w)); }
static inline __m256 dot_s8_s8(__m256i w, __m256i s) { return _mm256_cvtepi32_ps(dot_s8_s8_i32(w, s)); }

static inline __m256i load_act(const act_block *a) { return _mm256_loadu_si256((const __m256i *)a->q); }

/* 16 bytes of nibbles -> 32 values 0..15: low nibbles first, then high (GGML's order within a block). */
static inline __m256i nibbles32(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

/* Inlined per (type, m) like row_dot_avx2; xq holds m rows of cols/32 activation blocks. */
static inline __attribute__((always_inline)) void row_dot_int8_body(const int type, const uint8_t *row, const act_block *xq,
                                                                   const int64_t m, int64_t cols, float *out) {
    __m256 acc[MAX_M];
    float offset[MAX_M];
    const __m256i one = _mm256_set1_epi8(1), three = _mm256_set1_epi8(3);
    int64_t groups = cols / 32, blocks = cols / block_values(type), size = block_bytes(type);
    for (int64_t i = 0; i < m; i++) { acc[i] = _mm256_setzero_ps(); offset[i] = 0.0f; }
    for (int64_t k = 0; k < blocks; k++) {
        const uint8_t *b = row + (size_t)(k * size);
        if (type == Q4_0 || type == Q4_1) {
            __m256i q = nibbles32(b + (type == Q4_0 ? 2 : 4));
            float d = half_to_float(b), min = type == Q4_1 ? half_to_float(b + 2) : -8.0f * d; /* Q4_0: d*(q-8) */
            for (int64_t i = 0; i < m; i++) {
                const act_block *a = xq + i * groups + k;
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d), dot_u8_s8(q, load_act(a)), acc[i]);
                offset[i] += min * a->qsum;
            }
        } else if (type == Q5_0 || type == Q5_1) {
            const uint8_t *high = b + (type == Q5_0 ? 2 : 4);
            __m256i q = codes5_32(high, high + 4);
            float d = half_to_float(b), min = type == Q5_1 ? half_to_float(b + 2) : -16.0f * d; /* Q5_0: d*(q-16) */
            for (int64_t i = 0; i < m; i++) {
                const act_block *a = xq + i * groups + k;
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d), dot_u8_s8(q, load_act(a)), acc[i]);
                offset[i] += min * a->qsum;
            }
        } else if (type == Q8_0) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
            float d = half_to_float(b);
            for (int64_t i = 0; i < m; i++) {
                const act_block *a = xq + i * groups + k;
                acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d), dot_s8_s8(q, load_act(a)), acc[i]);
            }
        } else if (type == Q2_K || type == Q3_K) {
            /* 32 values (run h, shift j) span two 16-value groups: lanes 0-3 of a dot hold the first, 4-7 the second,
             * so each half gets its group's scale (and Q2_K's min, times the activations' sum from a dot with ones). */
            const __m256i codes_hi = _mm256_loadu_si256((const __m256i *)b); /* Q3_K's high bits */
            float d = half_to_float(b + (type == Q2_K ? 80 : 108)), dmin = type == Q2_K ? half_to_float(b + 82) : 0.0f;
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(b + (type == Q2_K ? 16 : 32) + 32 * h));
                for (int j = 0; j < 4; j++) {
                    const int g = 8 * h + 2 * j;
                    __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), three);
                    float scale_a, scale_b, min_a = 0.0f, min_b = 0.0f;
                    if (type == Q2_K) {
                        scale_a = d * (float)(b[g] & 15), scale_b = d * (float)(b[g + 1] & 15);
                        min_a = dmin * (float)(b[g] >> 4), min_b = dmin * (float)(b[g + 1] >> 4);
                    } else {
                        __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(codes_hi, 4 * h + j), one), 2);
                        q = _mm256_sub_epi8(_mm256_or_si256(q, high), _mm256_set1_epi8(4));
                        scale_a = d * (float)q3_k_scale(b + 96, g), scale_b = d * (float)q3_k_scale(b + 96, g + 1);
                    }
                    const __m256 scale = _mm256_set_m128(_mm_set1_ps(scale_b), _mm_set1_ps(scale_a));
                    const __m256 mins = _mm256_set_m128(_mm_set1_ps(min_b), _mm_set1_ps(min_a));
                    for (int64_t i = 0; i < m; i++) {
                        const act_block *a = xq + i * groups + 8 * k + 4 * h + j;
                        const __m256i act = load_act(a);
                        const __m256 ad = _mm256_set1_ps(a->d);
                        if (type == Q2_K) {
                            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(scale, ad), dot_u8_s8(q, act), acc[i]);
                            acc[i] = _mm256_fnmadd_ps(_mm256_mul_ps(mins, ad), dot_u8_s8(one, act), acc[i]);
                        } else {
                            acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(scale, ad), dot_s8_s8(q, act), acc[i]);
                        }
                    }
                }
            }
        } else if (type == Q4_K || type == Q5_K) {
            float d = half_to_float(b), dmin = half_to_float(b + 2);
            for (int s = 0; s < 8; s++) {
                int scale, min;
                scale_min_k4(s, b + 4, &scale, &min);
                const __m256i q = k4_codes32(type, b, s);
                float ds = d * (float)scale, dm = dmin * (float)min;
                for (int64_t i = 0; i < m; i++) {
                    const act_block *a = xq + i * groups + 8 * k + s;
                    acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(ds * a->d), dot_u8_s8(q, load_act(a)), acc[i]);
                    offset[i] -= dm * a->qsum;
                }
            }
        } else { /* Q6_K: 16-value groups, so lanes 0-3 (values 0-15) and 4-7 (16-31) get their own scale */
            const int8_t *scales = (const int8_t *)(b + 192);
            float d = half_to_float(b + 208);
            for (int h = 0; h < 2; h++) {
                for (int part = 0; part < 4; part++) {
                    const __m256i q = q6_k_codes32(b, h, part);
                    int index = 8 * h + 2 * part;
                    __m256 scale = _mm256_set_m128(_mm_set1_ps(d * (float)scales[index + 1]), _mm_set1_ps(d * (float)scales[index]));
                    for (int64_t i = 0; i < m; i++) {
                        const act_block *a = xq + i * groups + 8 * k + 4 * h + part;
                        acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(a->d)), dot_s8_s8(q, load_act(a)), acc[i]);
                    }
                }
            }
        }
    }
    for (int64_t i = 0; i < m; i++) out[i] = hsum(acc[i]) + offset[i];
}

#define ROW_DOT_INT8_FOR_TYPE(TYPE) \
    static void row_dot_int8_##TYPE(const uint8_t *row, const act_block *xq, int64_t m, int64_t cols, float *out) { \
        switch (m) { \
        case 1: row_dot_int8_body(TYPE, row, xq, 1, cols, out); break; \
        case 2: row_dot_int8_body(TYPE, row, xq, 2, cols, out); break; \
        case 3: row_dot_int8_body(TYPE, row, xq, 3, cols, out); break; \
        case 4: row_dot_int8_body(TYPE, row, xq, 4, cols, out); break; \
        case 5: row_dot_int8_body(TYPE, row, xq, 5, cols, out); break; \
        case 6: row_dot_int8_body(TYPE, row, xq, 6, cols, out); break; \
        case 7: row_dot_int8_body(TYPE, row, xq, 7, cols, out); break; \
        default: row_dot_int8_body(TYPE, row, xq, 8, cols, out); break; /* m == MAX_M */ \
        } \
    }
ROW_DOT_INT8_FOR_TYPE(Q4_0)
ROW_DOT_INT8_FOR_TYPE(Q4_1)
ROW_DOT_INT8_FOR_TYPE(Q5_0)
ROW_DOT_INT8_FOR_TYPE(Q5_1)
ROW_DOT_INT8_FOR_TYPE(Q8_0)
ROW_DOT_INT8_FOR_TYPE(Q2_K)
ROW_DOT_INT8_FOR_TYPE(Q3_K)
ROW_DOT_INT8_FOR_TYPE(Q4_K)
ROW_DOT_INT8_FOR_TYPE(Q5_K)
ROW_DOT_INT8_FOR_TYPE(Q6_K)

static void row_dot_int8(int type, const uint8_t *row, const act_block *xq, int64_t m, int64_t cols, float *out) {
    switch (type) {
    case Q4_0: row_dot_int8_Q4_0(row, xq, m, cols, out); break;
    case Q4_1: row_dot_int8_Q4_1(row, xq, m, cols, out); break;
    case Q5_0: row_dot_int8_Q5_0(row, xq, m, cols, out); break;
    case Q5_1: row_dot_int8_Q5_1(row, xq, m, cols, out); break;
    case Q8_0: row_dot_int8_Q8_0(row, xq, m, cols, out); break;
    case Q2_K: row_dot_int8_Q2_K(row, xq, m, cols, out); break;
    case Q3_K: row_dot_int8_Q3_K(row, xq, m, cols, out); break;
    case Q4_K: row_dot_int8_Q4_K(row, xq, m, cols, out); break;
    case Q5_K: row_dot_int8_Q5_K(row, xq, m, cols, out); break;
    default: row_dot_int8_Q6_K(row, xq, m, cols, out); break;
    }
}

/* How far ahead of the block in use the x8 kernel asks for weight bytes: the hardware prefetcher alone left
 * a decode step's stream of small matrices ~10% slower (measured on a 2-core AMD EPYC, 512-4096 tried). */
#define X8_PREFETCH_BYTES 1024

/* Activation word t of a block (its int8 values 4t..4t+3) in every 32-bit lane, straight from memory. */
static inline __m256i act_word(const act_block *a, int t) { return _mm256_broadcastd_epi32(_mm_loadu_si32(a->q + 4 * t)); }

/* Eight rows' codes of one 32-value block . one activation block, as int32 per row (row r in lane r): codes[t] holds
 * values 4t..4t+3 of row r in 32-bit lane r (t < 4), codes[4 + t] values 16+4t..16+4t+3; each meets its activation
 * word broadcast to every lane. The eight dpbusd run as four chains of two (one chain of eight waited on its latency). */
static inline __attribute__((always_inline)) __m256i x8_int_sums(const __m256i *codes, const act_block *a) {
    __m256i part[4];
    for (int t = 0; t < 4; t++)
        part[t] = dot_u8_s8_accumulate(dot_u8_s8_i32(codes[t], act_word(a, t)), codes[4 + t], act_word(a, 4 + t));
    return _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
}

/* acc += x8_int_sums * scale * a->d and offset += min * a->qsum, lane r for row r. */
static inline __attribute__((always_inline)) void x8_accumulate(const __m256i *codes, const act_block *a, __m256 scale, __m256 min,
                                                                __m256 *acc, __m256 *offset) {
    __m256 sums = _mm256_cvtepi32_ps(x8_int_sums(codes, a));
    *acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(scale, _mm256_set1_ps(a->d)), *acc);
    *offset = _mm256_fmadd_ps(min, _mm256_set1_ps(a->qsum), *offset);
}

static inline __attribute__((always_inline)) void x8_store_rows(const __m256 *acc, const __m256 *offset, int64_t m, float *out) {
    for (int64_t i = 0; i < m; i++) _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(acc[i], offset[i]));
}

/* One Q4_0_X8 / Q4_1_X8 / Q5_0_X8 / Q5_1_X8 group (eight weight rows) . m activation rows -> out[i * 8 + r]. Load t of
 * a block's codes holds code bytes 4t..4t+3 of row r in 32-bit lane r: low nibbles are values 4t..4t+3, high nibbles
 * values 16+4t..16+4t+3. So each load meets one activation word (four int8 values) broadcast to every lane, and the
 * eight dot products leave the eight rows' sums in row order with no horizontal reduction: per activation row and
 * block, eight dpbusd (four chains of two: one chain of eight waited on its latency), three adds, one convert and two
 * FMAs (scale; min times the activations' sum). Measured against the earlier layout (three hadds per activation row
 * and block) on one process, alternating: 1.14x (m = 1) to 1.32x (m = 4) faster on a 3072 x 576 Q4_1 weight. Q5's fifth bits (row
 * r's 32-bit word in lane r) are shifted to each value's byte as bit 4. Per activation row the arithmetic does not
 * depend on m. */
static inline __attribute__((always_inline)) void x8_group_q4_q5_body(const int type, const uint8_t *group, const act_block *xq,
                                                                     const int64_t m, int64_t cols, float *out) {
    const __m256i low4 = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16);
    const int64_t groups = cols / 32, size = 8 * block_bytes(type), halves = x8_halves(type), high_at = 16 * halves;
    const int five_bits = x8_high_bytes(type) != 0;
    const int64_t codes_at = high_at + (five_bits ? 32 : 0);
    /* Q5: a lane's bits 4t..4t+3 (after shifting the word right by 4t) to its four bytes, one bit each (byte 0's
       low nibble); values 16+4t.. likewise from byte 2. */
    const __m256i byte0 = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i byte2 = _mm256_add_epi8(byte0, _mm256_set1_epi8(2));
    const __m256i bit_of_byte = _mm256_set1_epi32(0x08040201);
    __m256 acc[MAX_M], offset[MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = offset[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < groups; k++) {
        const uint8_t *b = group + (size_t)(k * size);
        for (int line = 0; line < size; line += 64) _mm_prefetch((const char *)(b + X8_PREFETCH_BYTES + line), _MM_HINT_T0);
        __m256i codes[8]; /* codes[t]: values 4t..4t+3 (low nibbles), codes[4 + t]: values 16+4t.. (high nibbles) */
        const __m256i high = five_bits ? _mm256_loadu_si256((const __m256i *)(b + high_at)) : _mm256_setzero_si256();
        for (int t = 0; t < 4; t++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b + codes_at + 32 * t));
            codes[t] = _mm256_and_si256(v, low4);
            codes[4 + t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if (five_bits) {
                __m256i shifted = _mm256_srli_epi32(high, 4 * t);
                __m256i set_lo = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(shifted, byte0), bit_of_byte), bit_of_byte);
                __m256i set_hi = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(shifted, byte2), bit_of_byte), bit_of_byte);
                codes[t] = _mm256_or_si256(codes[t], _mm256_and_si256(set_lo, sixteen));
                codes[4 + t] = _mm256_or_si256(codes[4 + t], _mm256_and_si256(set_hi, sixteen));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        const __m256 min = halves == 2 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16)))
                                       : _mm256_mul_ps(d, _mm256_set1_ps(five_bits ? -16.0f : -8.0f)); /* d*(q-8), Q5_0 d*(q-16) */
        for (int64_t i = 0; i < m; i++) x8_accumulate(codes, xq + i * groups + k, d, min, &acc[i], &offset[i]);
    }
    x8_store_rows(acc, offset, m, out);
}

/* x8_group_int8_TYPE: BODY (an x8 group kernel taking the type) inlined for every m = 1..MAX_M (decode, verification
 * of up to 7 drafts, small batches), so the m accumulator pairs stay in registers: with m only known at run time they
 * live in memory, and a pass of 5-8 rows cost several times one row although the weights are read once. */
#define X8_GROUP_INT8_FOR_TYPE(TYPE, BODY) \
    static void x8_group_int8_##TYPE(const uint8_t *group, const act_block *xq, int64_t m, int64_t cols, float *out) { \
        switch (m) { \
        case 1: BODY(TYPE, group, xq, 1, cols, out); break; \
        case 2: BODY(TYPE, group, xq, 2, cols, out); break; \
        case 3: BODY(TYPE, group, xq, 3, cols, out); break; \
        case 4: BODY(TYPE, group, xq, 4, cols, out); break; \
        case 5: BODY(TYPE, group, xq, 5, cols, out); break; \
        case 6: BODY(TYPE, group, xq, 6, cols, out); break; \
        case 7: BODY(TYPE, group, xq, 7, cols, out); break; \
        default: BODY(TYPE, group, xq, 8, cols, out); break; /* m == MAX_M */ \
        } \
    }

X8_GROUP_INT8_FOR_TYPE(Q4_0_X8, x8_group_q4_q5_body)
X8_GROUP_INT8_FOR_TYPE(Q4_1_X8, x8_group_q4_q5_body)
X8_GROUP_INT8_FOR_TYPE(Q5_0_X8, x8_group_q4_q5_body)
X8_GROUP_INT8_FOR_TYPE(Q5_1_X8, x8_group_q4_q5_body)

/* x8_int_sums for signed codes where dpbusd's unsigned operand cannot take them as they are (no VNNI: maddubs would
 * saturate at 255 * 127 * 2): |w| times the activations carrying w's sign (dot_s8_s8_i32's trick), per word. */
static inline __attribute__((always_inline)) __m256i x8_int_sums_signed(const __m256i *codes, const __m256i *magnitudes,
                                                                        const act_block *a) {
    __m256i part[4];
    for (int t = 0; t < 4; t++)
        part[t] = dot_u8_s8_accumulate(dot_u8_s8_i32(magnitudes[t], _mm256_sign_epi8(act_word(a, t), codes[t])),
                                       magnitudes[4 + t], _mm256_sign_epi8(act_word(a, 4 + t), codes[4 + t]));
    return _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
}

/* x8_group_q4_q5_body for Q8_0_X8: a block of eight rows is the eight fp16 scales, then the 32 signed codes of each row
 * in 4-byte parts (load t: codes 4t..4t+3 of row r in lane r). With VNNI the codes are made unsigned, u = w + 128 (one
 * xor per load, shared by every activation row), and the integer sum corrected in integers, sum(w q) = sum(u q) -
 * 128 sum(q): exact, so the float steps are the row-by-row kernel's. Without VNNI, x8_int_sums_signed. */
static inline __attribute__((always_inline)) void x8_group_q8_0_body(const uint8_t *group, const act_block *xq, const int64_t m,
                                                                    int64_t cols, float *out) {
    const int64_t groups = cols / 32, size = 8 * block_bytes(Q8_0_X8);
    __m256 acc[MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < groups; k++) {
        const uint8_t *b = group + (size_t)(k * size);
        for (int line = 0; line < size; line += 64) _mm_prefetch((const char *)(b + X8_PREFETCH_BYTES + line), _MM_HINT_T0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        __m256i codes[8];
        for (int t = 0; t < 8; t++) codes[t] = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * t));
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
        for (int t = 0; t < 8; t++) codes[t] = _mm256_xor_si256(codes[t], _mm256_set1_epi8((char)0x80));
#else
        __m256i magnitudes[8];
        for (int t = 0; t < 8; t++) magnitudes[t] = _mm256_sign_epi8(codes[t], codes[t]);
#endif
        for (int64_t i = 0; i < m; i++) {
            const act_block *a = xq + i * groups + k;
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
            __m256i sums = _mm256_sub_epi32(x8_int_sums(codes, a), _mm256_set1_epi32(128 * a->sum));
#else
            __m256i sums = x8_int_sums_signed(codes, magnitudes, a);
#endif
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d, _mm256_set1_ps(a->d)), acc[i]);
        }
    }
    for (int64_t i = 0; i < m; i++) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

static void x8_group_int8_Q8_0_X8(const uint8_t *group, const act_block *xq, int64_t m, int64_t cols, float *out) {
    switch (m) { /* every m = 1..MAX_M inlined, as X8_GROUP_INT8_FOR_TYPE does */
    case 1: x8_group_q8_0_body(group, xq, 1, cols, out); break;
    case 2: x8_group_q8_0_body(group, xq, 2, cols, out); break;
    case 3: x8_group_q8_0_body(group, xq, 3, cols, out); break;
    case 4: x8_group_q8_0_body(group, xq, 4, cols, out); break;
    case 5: x8_group_q8_0_body(group, xq, 5, cols, out); break;
    case 6: x8_group_q8_0_body(group, xq, 6, cols, out); break;
    case 7: x8_group_q8_0_body(group, xq, 7, cols, out); break;
    default: x8_group_q8_0_body(group, xq, 8, cols, out); break; /* m == MAX_M */
    }
}
/* One Q4_K_X8 / Q5_K_X8 group (eight weight rows) . m activation rows -> out[i * 8 + r]. A super-block of eight rows holds the
 * eight d and dmin, the rows' 12 scale bytes as three 32-bit words per lane (so the six-bit scales and mins of all eight
 * rows unpack in four vector operations, from GGUF's packing: scales 0-3 and mins 0-3 are words 0 and 1 masked to six
 * bits, scales and mins 4-7 the low / high nibbles of word 2 with the top two bits of words 0 / 1), then the 128 code
 * bytes per row in 4-byte parts: load u (32 bytes) holds code bytes 4u..4u+3 of row r in lane r, i.e. values
 * 4(u % 8)..+3 of sub-blocks 2(u / 8) (low nibbles) and 2(u / 8) + 1 (high); every field in row order. Q5_K puts its
 * 32 bytes of fifth bits before the codes, in eight such parts: bit s of byte l is value l of sub-block s. */
static inline __attribute__((always_inline)) void x8_group_k_body(const int type, const uint8_t *group, const act_block *xq,
                                                                 const int64_t m, int64_t cols, float *out) {
    const __m256i low4 = _mm256_set1_epi8(15), six = _mm256_set1_epi32(0x3F3F3F3F), nibble = _mm256_set1_epi32(0x0F0F0F0F);
    const __m256i top2 = _mm256_set1_epi32(0x03030303), byte = _mm256_set1_epi32(0xFF);
    const int five_bits = type == Q5_K_X8;
    const __m256i one = _mm256_set1_epi8(1);
    const int64_t groups = cols / 32, blocks = cols / 256, size = 8 * block_bytes(type);
    __m256 acc[MAX_M], offset[MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = offset[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < blocks; k++) {
        const uint8_t *b = group + (size_t)(k * size);
        for (int line = 0; line < size; line += 64) _mm_prefetch((const char *)(b + size + line), _MM_HINT_T0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
        const __m256 minus_dmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16))));
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(b + 32)), w1 = _mm256_loadu_si256((const __m256i *)(b + 64));
        const __m256i w2 = _mm256_loadu_si256((const __m256i *)(b + 96));
        const __m256i scales[2] = {_mm256_and_si256(w0, six),
                                   _mm256_or_si256(_mm256_and_si256(w2, nibble), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), top2), 4))};
        const __m256i mins[2] = {_mm256_and_si256(w1, six),
                                 _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), nibble),
                                                 _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), top2), 4))};
        const uint8_t *high = b + 128, *code_bytes = b + (five_bits ? 384 : 128);
        for (int s = 0; s < 8; s++) {
            const int shift = 8 * (s % 4);
            const __m256 scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(scales[s / 4], shift), byte)));
            const __m256 min = _mm256_mul_ps(minus_dmin, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(mins[s / 4], shift), byte)));
            const uint8_t *pair = code_bytes + 256 * (s / 2); /* loads 8(s/2)..8(s/2)+7: sub-blocks 2(s/2), 2(s/2) + 1 */
            __m256i codes[8];
            for (int u = 0; u < 8; u++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(pair + 32 * u));
                codes[u] = _mm256_and_si256(s & 1 ? _mm256_srli_epi16(v, 4) : v, low4);
                if (five_bits) { /* bit s of each byte -> bit 4 (a 16-bit shift: the mask keeps the byte's own bit) */
                    __m256i h = _mm256_loadu_si256((const __m256i *)(high + 32 * u));
                    codes[u] = _mm256_or_si256(codes[u], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, s), one), 4));
                }
            }
            for (int64_t i = 0; i < m; i++) x8_accumulate(codes, xq + i * groups + 8 * k + s, scale, min, &acc[i], &offset[i]);
        }
    }
    x8_store_rows(acc, offset, m, out);
}

X8_GROUP_INT8_FOR_TYPE(Q4_K_X8, x8_group_k_body)
X8_GROUP_INT8_FOR_TYPE(Q5_K_X8, x8_group_k_body)

/* Q2_K_X8 / Q3_K_X8 / Q6_K_X8: each 16 values of a block have their own scale, so the four dot products of each half of
 * an activation block (codes[t]: values 4t..4t+3, row r in lane r) sum apart. The codes go in unsigned (dpbusd's
 * operand) and each half's constant part returns through the activations' sum over it: acc += half sum * scale[e] *
 * a->d, offset += bias[e] * a->d * half_sum[e], bias[e] the row's value for code 0. */
static inline __attribute__((always_inline)) void x8_accumulate_halves(const __m256i *codes, const act_block *a, const __m256 *scale,
                                                                       const __m256 *bias, __m256 *acc, __m256 *offset) {
    const __m256 ad = _mm256_set1_ps(a->d);
    for (int e = 0; e < 2; e++) {
        __m256i sums = _mm256_add_epi32(
            dot_u8_s8_accumulate(dot_u8_s8_i32(codes[4 * e], act_word(a, 4 * e)), codes[4 * e + 1], act_word(a, 4 * e + 1)),
            dot_u8_s8_accumulate(dot_u8_s8_i32(codes[4 * e + 2], act_word(a, 4 * e + 2)), codes[4 * e + 3], act_word(a, 4 * e + 3)));
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(scale[e], ad), *acc);
        *offset = _mm256_fmadd_ps(bias[e], _mm256_set1_ps(a->d * (float)a->half_sum[e]), *offset);
    }
}

/* Byte j (0..3) of each 32-bit lane, as float (sign-extended when `is_signed`). */
static inline __m256 lane_byte(__m256i word, int j, int is_signed) {
    __m256i up = _mm256_slli_epi32(word, 24 - 8 * j);
    return _mm256_cvtepi32_ps(is_signed ? _mm256_srai_epi32(up, 24) : _mm256_srli_epi32(up, 24));
}

/* One Q2_K_X8 / Q3_K_X8 / Q6_K_X8 group (eight weight rows) . m activation rows -> out[i * 8 + r]. Value l of the
 * block's 32-value run (h, j) (values 128h + 32j + l) takes its low bits from code byte 32h + l (Q2_K / Q3_K: bits 2j,
 * 2j + 1; Q6_K: low nibble of byte 64h + 32(j % 2) + l for j < 2, high nibble for j >= 2, bits 2j, 2j + 1 of byte 32h + l
 * of the high pairs on top) and, for Q3_K, bit 4h + j of high byte l as bit 2. Codes: Q2_K 0..3 (value d*sc*q -
 * dmin*m), Q3_K 0..7 (d*sc*(q - 4)), Q6_K 0..63 (d*sc*(q - 32)). The fields of all eight rows lie in 4-byte parts
 * (load w: bytes 4w..4w+3 of each row), fp16 fields last. Per activation row the arithmetic does not depend on m. */
static inline __attribute__((always_inline)) void x8_group_k16_body(const int type, const uint8_t *group, const act_block *xq,
                                                                   const int64_t m, int64_t cols, float *out) {
    const __m256i low4 = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const int64_t groups = cols / 32, blocks = cols / 256, size = 8 * block_bytes(type);
    /* Where the parts lie in a super-block of eight rows (X8_Q2_K, X8_Q3_K, X8_Q6_K). */
    const int codes_at = type == Q2_K_X8 ? 128 : type == Q3_K_X8 ? 256 : 0, high_at = type == Q3_K_X8 ? 0 : 1024;
    const int scales_at = type == Q2_K_X8 ? 0 : type == Q3_K_X8 ? 768 : 1536, d_at = type == Q2_K_X8 ? 640 : type == Q3_K_X8 ? 864 : 1664;
    __m256 acc[MAX_M], offset[MAX_M];
    for (int64_t i = 0; i < m; i++) acc[i] = offset[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < blocks; k++) {
        const uint8_t *b = group + (size_t)(k * size);
        for (int line = 0; line < size; line += 64) _mm_prefetch((const char *)(b + size + line), _MM_HINT_T0);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + d_at)));
        __m256 scale[16], bias[16]; /* per 16-value group: every row's scale and its value for code 0 */
        if (type == Q2_K_X8) {
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + d_at + 16)));
            for (int u = 0; u < 4; u++) {
                const __m256i word = _mm256_loadu_si256((const __m256i *)(b + 32 * u));
                const __m256i low = _mm256_and_si256(word, low4), high = _mm256_and_si256(_mm256_srli_epi16(word, 4), low4);
                for (int j = 0; j < 4; j++) {
                    scale[4 * u + j] = _mm256_mul_ps(d, lane_byte(low, j, 0));
                    bias[4 * u + j] = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, lane_byte(high, j, 0)));
                }
            }
        } else if (type == Q3_K_X8) {
            const __m256i s01[2] = {_mm256_loadu_si256((const __m256i *)(b + scales_at)), _mm256_loadu_si256((const __m256i *)(b + scales_at + 32))};
            const __m256i s2 = _mm256_loadu_si256((const __m256i *)(b + scales_at + 64));
            for (int g = 0; g < 16; g++) { /* 4 low bits: byte g % 8 (high nibble for g >= 8); 2 high: byte 8 + g % 4 >> 2(g / 4) */
                __m256i word = s01[(g % 8) / 4];
                __m256i low = _mm256_and_si256(g < 8 ? word : _mm256_srli_epi16(word, 4), low4);
                __m256i high = _mm256_and_si256(_mm256_srli_epi16(s2, 2 * (g / 4)), three);
                __m256 sc = _mm256_sub_ps(lane_byte(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), g % 4, 0), _mm256_set1_ps(32.0f));
                scale[g] = _mm256_mul_ps(d, sc);
                bias[g] = _mm256_mul_ps(scale[g], _mm256_set1_ps(-4.0f));
            }
        } else {
            for (int u = 0; u < 4; u++) {
                const __m256i word = _mm256_loadu_si256((const __m256i *)(b + scales_at + 32 * u));
                for (int j = 0; j < 4; j++) {
                    scale[4 * u + j] = _mm256_mul_ps(d, lane_byte(word, j, 1));
                    bias[4 * u + j] = _mm256_mul_ps(scale[4 * u + j], _mm256_set1_ps(-32.0f));
                }
            }
        }
        __m256i hmask[8]; /* Q3_K's high bits: load t holds high bytes 4t..4t+3 of each row */
        if (type == Q3_K_X8)
            for (int t = 0; t < 8; t++) hmask[t] = _mm256_loadu_si256((const __m256i *)(b + high_at + 32 * t));
        for (int h = 0; h < 2; h++) {
            __m256i pairs[8]; /* Q6_K's high bit pairs of this half */
            if (type == Q6_K_X8)
                for (int t = 0; t < 8; t++) pairs[t] = _mm256_loadu_si256((const __m256i *)(b + high_at + 32 * (8 * h + t)));
            for (int j = 0; j < 4; j++) {
                __m256i codes[8];
                const uint8_t *code_words = b + codes_at + 32 * (type == Q6_K_X8 ? 16 * h + 8 * (j & 1) : 8 * h);
                for (int t = 0; t < 8; t++) {
                    __m256i v = _mm256_loadu_si256((const __m256i *)(code_words + 32 * t));
                    if (type == Q6_K_X8) {
                        v = _mm256_and_si256(j < 2 ? v : _mm256_srli_epi16(v, 4), low4);
                        codes[t] = _mm256_or_si256(v, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(pairs[t], 2 * j), three), 4));
                    } else {
                        codes[t] = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), three);
                        if (type == Q3_K_X8)
                            codes[t] = _mm256_or_si256(codes[t], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hmask[t], 4 * h + j), one), 2));
                    }
                }
                const int g = 8 * h + 2 * j;
                for (int64_t i = 0; i < m; i++)
                    x8_accumulate_halves(codes, xq + i * groups + 8 * k + 4 * h + j, scale + g, bias + g, &acc[i], &offset[i]);
            }
        }
    }
    x8_store_rows(acc, offset, m, out);
}

X8_GROUP_INT8_FOR_TYPE(Q2_K_X8, x8_group_k16_body)
X8_GROUP_INT8_FOR_TYPE(Q3_K_X8, x8_group_k16_body)
X8_GROUP_INT8_FOR_TYPE(Q6_K_X8, x8_group_k16_body)
#endif

/* Portable path: one block dequantized to the stack, then dotted with each row of x. */
static void row_dot_portable(int type, const uint8_t *row, const float *x, int64_t m, int64_t cols, float *out) {
    float values[256]; /* the largest block */
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

/* One block of 32 activations -> int8 (the act_block comment). The scalar form is the reference; the AVX2 form
 * computes the same values: the max is exact, d and its inverse are the same two operations, and
 * _mm256_round_ps to nearest is nearbyintf's round-half-even (the default rounding mode). */
static inline void quantize_act_block(const float *v, act_block *a) {
#ifdef __AVX2__
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 amax8 = _mm256_setzero_ps();
    for (int l = 0; l < 32; l += 8) amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + l)));
    __m128 amax4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    amax4 = _mm_max_ps(amax4, _mm_movehl_ps(amax4, amax4));
    float amax = _mm_cvtss_f32(_mm_max_ss(amax4, _mm_movehdup_ps(amax4)));
    float d = amax / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int j = 0; j < 4; j++) {
        __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(v + 8 * j), _mm256_set1_ps(inverse));
        q[j] = _mm256_cvtps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const int half_sum[2] = {hsum_epi32(_mm256_add_epi32(q[0], q[1])), hsum_epi32(_mm256_add_epi32(q[2], q[3]))};
    /* packs interleave 128-bit lanes: the permute puts the 32 values back in order */
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)a->q, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
    float amax = 0.0f;
    for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(v[l]));
    float d = amax / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
    int half_sum[2] = {0, 0};
    for (int l = 0; l < 32; l++) {
        int q = (int)nearbyintf(v[l] * inverse);
        a->q[l] = (int8_t)q;
        half_sum[l / 16] += q;
    }
#endif
    a->d = d;
    a->half_sum[0] = half_sum[0];
    a->half_sum[1] = half_sum[1];
    a->sum = half_sum[0] + half_sum[1];
    a->qsum = d * (float)a->sum;
}

/* m rows of x [m, cols] -> m * cols/32 int8 blocks; round half to even, like torch.round. */
static void quantize_activations(const float *x, int64_t m, int64_t cols, act_block *out) {
    int64_t groups = cols / 32;
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < groups; g++) quantize_act_block(x + i * cols + 32 * g, out + i * groups + g);
}

static int row_dot_rows(int type, int path, const uint8_t *row, const float *x, const float *xsum, const act_block *xq,
                        int64_t m, int64_t cols, float *out) {
#ifdef __AVX2__
    if (path == PATH_INT8) { row_dot_int8(type, row, xq, m, cols, out); return 0; }
    if (path == PATH_FLOAT) { row_dot_fast(type, row, x, xsum, m, cols, out); return 0; }
#endif
    (void)xsum; (void)xq;
    row_dot_portable(type, row, x, m, cols, out);
    return 0;
}

/* Group g of an x8 weight . x: the int8 path in eight-row vectors, any other path on the group's plain rows
 * (`plain`: 8 rows of scratch), with the bits the plain layout gives. */
static void x8_group_rows(int type, int path, const uint8_t *group, const float *x, const float *xsum, const act_block *xq,
                          int64_t m, int64_t cols, uint8_t *plain, float *out) {
#ifdef __AVX2__
    if (path == PATH_INT8) {
        switch (type) {
        case Q4_0_X8: x8_group_int8_Q4_0_X8(group, xq, m, cols, out); break;
        case Q4_1_X8: x8_group_int8_Q4_1_X8(group, xq, m, cols, out); break;
        case Q5_0_X8: x8_group_int8_Q5_0_X8(group, xq, m, cols, out); break;
        case Q5_1_X8: x8_group_int8_Q5_1_X8(group, xq, m, cols, out); break;
        case Q4_K_X8: x8_group_int8_Q4_K_X8(group, xq, m, cols, out); break;
        case Q5_K_X8: x8_group_int8_Q5_K_X8(group, xq, m, cols, out); break;
        case Q6_K_X8: x8_group_int8_Q6_K_X8(group, xq, m, cols, out); break;
        case Q2_K_X8: x8_group_int8_Q2_K_X8(group, xq, m, cols, out); break;
        case Q3_K_X8: x8_group_int8_Q3_K_X8(group, xq, m, cols, out); break;
        default: x8_group_int8_Q8_0_X8(group, xq, m, cols, out); break;
        }
        return;
    }
#endif
    int64_t blocks = cols / block_values(type), row_bytes = blocks * block_bytes(type);
    float row_out[MAX_M];
    x8_to_plain_group(type, group, blocks, plain);
    for (int64_t r = 0; r < 8; r++) {
        row_dot_rows(plain_type(type), path, plain + (size_t)(r * row_bytes), x, xsum, xq, m, cols, row_out);
        for (int64_t i = 0; i < m; i++) out[8 * i + r] = row_out[i];
    }
}

/* gemv_pass's loop for x8 weights: parallel over groups of eight rows. */
static int x8_gemv_groups(int type, int path, const uint8_t *w, const float *x, const float *xsum, const act_block *xq,
                          const float *bias, float *y, int64_t m, int64_t rows, int64_t cols) {
    int64_t group_bytes = 8 * (cols / block_values(type)) * block_bytes(type);
    int failed = 0;
    #pragma omp parallel
    {
        uint8_t *plain = path == PATH_INT8 ? NULL : (uint8_t *)malloc((size_t)group_bytes);
        if (path != PATH_INT8 && plain == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t g = 0; g < rows / 8; g++) {
            float out[8 * MAX_M];
            if (path != PATH_INT8 && plain == NULL) continue;
            x8_group_rows(type, path, w + (size_t)(g * group_bytes), x, xsum, xq, m, cols, plain, out);
            for (int64_t i = 0; i < m; i++)
                for (int64_t r = 0; r < 8; r++) y[i * rows + 8 * g + r] = out[8 * i + r] + (bias ? bias[8 * g + r] : 0.0f);
        }
        free(plain);
    }
    return failed ? -2 : 0;
}

/* One pass over the weight: y[m, rows] = x[m, cols] . w[rows, cols]^T (+ bias), 1 <= m <= MAX_M. */
static int gemv_pass(int type, const float *x, const uint8_t *w, const float *bias, float *y, int64_t m, int64_t rows,
                     int64_t cols, int path) {
    if (path == PATH_INT8 && (type == NF4 || type == FP8)) return -4; /* no integer path for float codes */
    if (is_x8(type) && rows % 8 != 0) return -5; /* x8 layouts hold whole groups of eight rows */
#ifndef __AVX2__
    if (path != PATH_PORTABLE) return -3;
#endif
    int64_t groups = cols / 32, row_bytes = cols / block_values(type) * block_bytes(type);
    float *xsum = NULL;
    act_block *xq = NULL;
    if (path == PATH_INT8) {
        xq = (act_block *)malloc(sizeof(act_block) * (size_t)(m * groups));
        if (xq == NULL) return -2;
        quantize_activations(x, m, cols, xq);
    } else if (path == PATH_FLOAT) {
        xsum = (float *)malloc(sizeof(float) * (size_t)(m * groups));
        if (xsum == NULL) return -2;
        for (int64_t i = 0; i < m; i++)
            for (int64_t g = 0; g < groups; g++) {
                float sum = 0.0f;
                for (int l = 0; l < 32; l++) sum += x[i * cols + 32 * g + l];
                xsum[i * groups + g] = sum;
            }
    }
    int status = 0;
    if (is_x8(type)) {
        status = x8_gemv_groups(type, path, w, x, xsum, xq, bias, y, m, rows, cols);
    } else {
        #pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            float out[MAX_M];
            row_dot_rows(type, path, w + (size_t)n * (size_t)row_bytes, x, xsum, xq, m, cols, out);
            for (int64_t i = 0; i < m; i++) y[i * rows + n] = out[i] + (bias ? bias[n] : 0.0f);
        }
    }
    free(xsum);
    free(xq);
    return status;
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include "../../layers/csrc/amx_tiles.h"
#define EMBER_GGML_AMX 1
/* From this many rows an int8-path product runs on AMX tiles (amx_linear) instead of int8 passes: measured on a Xeon
 * with AMX against the passes, per call, at 64 / 128 / 512 rows: Qwen2.5-Coder-1.5B's Q4_K 17920 x 1536 1.4x / 2.0x /
 * 3.3x, Q6_K 1536 x 8960 1.3x / 2.2x / 4.0x, SmolLM2's Q4_1 3072 x 576 1.0x / 1.8x / 2.6x (the dequantization, once
 * per call, is what fewer rows cannot pay back). */
#define AMX_GGML_MIN_ROWS 64
#define AMX_WEIGHT_ROWS 32 /* weight rows dequantized at a time: two 16-row tiles */

/* x [m, cols] rounded to bfloat16 as the weight-side tiles read it: 16-row blocks, each cols / 2 pair rows of 16
   words (word i of pair row q: x[16 b + i, 2q .. 2q + 1]); rows past m (to `blocks` x 16) are zero. */
static void activation_pair_tiles(const float *x, int64_t m, int64_t cols, int64_t blocks, uint32_t *tiles) {
    int64_t pairs = cols / 2;
    memset(tiles, 0, (size_t)(blocks * TILE_ROWS * pairs) * sizeof(uint32_t));
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < m; r++) {
        uint32_t *block = tiles + (r / TILE_ROWS) * TILE_ROWS * pairs + r % TILE_ROWS;
        for (int64_t c = 0; c < cols; c += 32) {
            __m512bh rounded = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + r * cols + c + 16), _mm512_loadu_ps(x + r * cols + c));
            uint32_t words[16];
            _mm512_storeu_si512(words, (__m512i)rounded);
            for (int j = 0; j < 16; j++) block[(c / 2 + j) * TILE_ROWS] = words[j];
        }
    }
}

/* Weight rows first .. first + 31 as bfloat16 [32, cols] (rows past `rows` zero), through their exact float32 values. */
static void weight_rows_bf16(int type, const uint8_t *w, int64_t rows, int64_t cols, int64_t first, uint8_t *plain,
                             float *values, uint16_t *out) {
    int64_t size = block_bytes(type), blocks = cols / block_values(type), row_bytes = blocks * size;
    for (int64_t g = first; g < first + AMX_WEIGHT_ROWS; g += 8) {
        int64_t count = rows - g < 8 ? (rows - g > 0 ? rows - g : 0) : 8;
        const uint8_t *source = w + (size_t)(g * row_bytes);
        if (is_x8(type) && count > 0) {
            x8_to_plain_group(type, source, blocks, plain);
            source = plain;
        }
        for (int64_t r = 0; r < count; r++)
            for (int64_t k = 0; k < blocks; k++)
                dequantize_block(plain_type(type), source + (size_t)((r * blocks + k) * size), values + r * cols + block_values(type) * k);
        for (int64_t r = 0; r < 8; r++)
            for (int64_t c = 0; c < cols; c += 32) {
                __m512bh rounded = r < count ? _mm512_cvtne2ps_pbh(_mm512_loadu_ps(values + r * cols + c + 16), _mm512_loadu_ps(values + r * cols + c))
                                             : (__m512bh)_mm512_setzero_si512();
                _mm512_storeu_si512(out + (g - first + r) * cols + c, (__m512i)rounded);
            }
    }
}

/* y rows a0 .. a0 + 15 (those below m), weight rows w0 .. w0 + 15 (those below `rows`), from a sum tile
   stored as sums[weight row][activation row] (+ bias). */
static void store_transposed(const float *sums, float *y, const float *bias, int64_t a0, int64_t m, int64_t w0, int64_t rows) {
    for (int64_t i = 0; i < TILE_ROWS && a0 + i < m; i++)
        for (int64_t o = 0; o < TILE_ROWS && w0 + o < rows; o++)
            y[(a0 + i) * rows + w0 + o] = sums[o * TILE_ROWS + i] + (bias ? bias[w0 + o] : 0.0f);
}

/* 32 dequantized weight rows (w0 ..) times activation blocks b and b + 1 (32 rows), all of k. */
static void amx_weight_block(const uint16_t *weights, const uint32_t *tiles, int64_t cols, const float *bias, float *y,
                             int64_t m, int64_t rows, int64_t w0, int64_t b) {
    int64_t pairs = cols / 2;
    const uint32_t *b0 = tiles + b * TILE_ROWS * pairs, *b1 = b0 + TILE_ROWS * pairs;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t q0 = 0; q0 < pairs; q0 += TILE_PAIRS) {
        _tile_loadd(4, weights + 2 * q0, cols * sizeof(uint16_t));
        _tile_loadd(5, weights + TILE_ROWS * cols + 2 * q0, cols * sizeof(uint16_t));
        _tile_loadd(6, b0 + q0 * TILE_ROWS, TILE_ROWS * sizeof(uint32_t));
        _tile_loadd(7, b1 + q0 * TILE_ROWS, TILE_ROWS * sizeof(uint32_t));
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float sums[TILE_ROWS * TILE_ROWS];
    int64_t a0 = b * TILE_ROWS;
    _tile_stored(0, sums, TILE_ROWS * sizeof(float));
    store_transposed(sums, y, bias, a0, m, w0, rows);
    _tile_stored(1, sums, TILE_ROWS * sizeof(float));
    store_transposed(sums, y, bias, a0 + TILE_ROWS, m, w0, rows);
    _tile_stored(2, sums, TILE_ROWS * sizeof(float));
    store_transposed(sums, y, bias, a0, m, w0 + TILE_ROWS, rows);
    _tile_stored(3, sums, TILE_ROWS * sizeof(float));
    store_transposed(sums, y, bias, a0 + TILE_ROWS, m, w0 + TILE_ROWS, rows);
}

/* y[m, rows] = x . w^T (+ bias) on AMX tiles: x rounded to bfloat16, each 32 weight rows dequantized exactly and
   rounded to bfloat16 once per call (in the thread's L2), then run against every activation row. The weights are
   the tiles' A side, row-major as they dequantize; the sums come out transposed. Returns -2 when memory ran out. */
static int amx_linear(int type, const float *x, const uint8_t *w, const float *bias, float *y, int64_t m, int64_t rows, int64_t cols) {
    int64_t act_blocks = (m + 2 * TILE_ROWS - 1) / (2 * TILE_ROWS) * 2, weight_blocks = (rows + AMX_WEIGHT_ROWS - 1) / AMX_WEIGHT_ROWS;
    uint32_t *tiles = (uint32_t *)malloc((size_t)(act_blocks * TILE_ROWS * cols / 2) * sizeof(uint32_t));
    if (tiles == NULL) return -2;
    activation_pair_tiles(x, m, cols, act_blocks, tiles);
    int failed = 0;
    #pragma omp parallel
    {
        uint16_t *weights = (uint16_t *)malloc((size_t)(AMX_WEIGHT_ROWS * cols) * sizeof(uint16_t));
        float *values = (float *)malloc((size_t)(8 * cols) * sizeof(float));
        uint8_t *plain = (uint8_t *)malloc((size_t)(8 * cols / block_values(type) * block_bytes(type)));
        if (weights == NULL || values == NULL || plain == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        if (!failed) { /* every thread or none reaches the loop below (a worksharing loop needs the whole team) */
            configure_tiles();
            #pragma omp for schedule(static)
            for (int64_t item = 0; item < weight_blocks; item++) {
                weight_rows_bf16(type, w, rows, cols, item * AMX_WEIGHT_ROWS, plain, values, weights);
                for (int64_t b = 0; b < act_blocks; b += 2)
                    amx_weight_block(weights, tiles, cols, bias, y, m, rows, item * AMX_WEIGHT_ROWS, b);
            }
            _tile_release();
        }
        free(weights);
        free(values);
        free(plain);
    }
    free(tiles);
    return failed ? -2 : 0;
}
#endif

/* y[m, rows] = x[m, cols] . w[rows, cols]^T (+ bias) on `path`, any m >= 1: MAX_M rows per pass over the
 * weight, so every row gets the arithmetic of a decode step whatever the batch (the int8 path rounds each
 * row on its own); where AMX tiles run the int8 path's products of AMX_GGML_MIN_ROWS rows or more, those
 * rows get the tiles' arithmetic instead (bfloat16 x and weights, float32 sums). Returns 0; -1 if m < 1, -2 if memory ran out, -3 if this build lacks the path, -4 if
 * the type lacks it, -5 if an x8 weight's rows are not a multiple of 8. */
int ember_ggml_gemv(int type, const float *x, const uint8_t *w, const float *bias, float *y, int64_t m, int64_t rows,
                    int64_t cols, int path) {
    if (m < 1) return -1;
#ifdef EMBER_GGML_AMX
    if (path == PATH_INT8 && m >= AMX_GGML_MIN_ROWS && type != NF4 && type != FP8 && !(is_x8(type) && rows % 8 != 0) && amx_ready())
        return amx_linear(type, x, w, bias, y, m, rows, cols);
#endif
    for (int64_t start = 0; start < m; start += MAX_M) {
        int64_t count = m - start < MAX_M ? m - start : MAX_M;
        int status = gemv_pass(type, x + start * cols, w, bias, y + start * rows, count, rows, cols, path);
        if (status != 0) return status;
    }
    return 0;
}

/* A GGML weight as the compiled decoder layer's product pointer sees it (ember/layers/csrc/decoder_layer.c
 * calls products as gemm_fn(x, weight, bias, y, m, n, k)). A GPTQ / AWQ weight (ember.quant.ggml.zero_point) also
 * sets the zero-point fields; a plain GGML weight leaves them NULL / 0. A weight whose row ranges keep different
 * formats (ember.quant.ggml.blocks.GGMLRowParts) sets only row_parts. */
typedef struct {
    int type, path;
    const uint8_t *blocks;
    const int64_t *input_order;   /* [k]: x's column for each stored column, or NULL (columns in order) */
    const float *offsets;         /* [groups, n]: s * (c - z) per group and output row, or NULL */
    const int64_t *column_groups; /* [k]: the group of each stored column (read with offsets) */
    int64_t groups;
    const void *row_parts;        /* a ggml_row_parts, or NULL */
} ggml_weight;

/* Part j of a row-parts weight gives rows[j] output rows through its own ggml_weight (a fused q/k/v whose parts mix
 * k-quants: Q4_K q and k, a Q6_K v). */
#define MAX_ROW_PARTS 4
typedef struct {
    int64_t count;
    const ggml_weight *weights[MAX_ROW_PARTS];
    int64_t rows[MAX_ROW_PARTS];
} ggml_row_parts;

/* y[r, o] += sum over groups g of (sum of x[r, c] over the stored columns c of group g) * offsets[g, o]. */
static int add_zero_point_offsets(const float *x, const ggml_weight *w, float *y, int64_t m, int64_t n, int64_t k) {
    int64_t groups = w->groups;
    float *sums = (float *)calloc((size_t)(m * groups), sizeof(float));
    if (sums == NULL) return -2;
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < k; c++) sums[r * groups + w->column_groups[c]] += x[r * k + c];
    for (int64_t r = 0; r < m; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float sum = sums[r * groups + g], *offsets = w->offsets + g * n;
            float *out = y + r * n;
            for (int64_t o = 0; o < n; o++) out[o] += sum * offsets[o]; /* vectorizes over o */
        }
    free(sums);
    return 0;
}

/* ember_ggml_gemv on x's columns gathered in the weight's input order, then the zero-point offsets. */
static int zero_point_linear(const float *x, const ggml_weight *w, const float *bias, float *y, int64_t m, int64_t n, int64_t k) {
    float *gathered = NULL;
    if (w->input_order != NULL) {
        gathered = (float *)malloc(sizeof(float) * (size_t)(m * k));
        if (gathered == NULL) return -2;
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < k; c++) gathered[r * k + c] = x[r * k + w->input_order[c]];
        x = gathered;
    }
    int status = ember_ggml_gemv(w->type, x, w->blocks, bias, y, m, n, k, w->path);
    if (status == 0 && w->offsets != NULL) status = add_zero_point_offsets(x, w, y, m, n, k);
    free(gathered);
    return status;
}

/* Each part's product (a plain GGML weight: no zero points) into scratch, its columns copied to their place in y [m, n]. */
static int row_parts_linear(const float *x, const ggml_row_parts *parts, const float *bias, float *y, int64_t m, int64_t n, int64_t k) {
    int64_t widest = 0, offset = 0;
    for (int64_t j = 0; j < parts->count; j++) widest = parts->rows[j] > widest ? parts->rows[j] : widest;
    float *part_y = (float *)malloc(sizeof(float) * (size_t)(m * widest));
    if (part_y == NULL) return -2;
    int status = 0;
    for (int64_t j = 0; j < parts->count && status == 0; j++) {
        const ggml_weight *w = parts->weights[j];
        const int64_t rows = parts->rows[j];
        status = ember_ggml_gemv(w->type, x, w->blocks, bias ? bias + offset : NULL, part_y, m, rows, k, w->path);
        for (int64_t i = 0; i < m && status == 0; i++) memcpy(y + i * n + offset, part_y + i * rows, sizeof(float) * (size_t)rows);
        offset += rows;
    }
    free(part_y);
    return status;
}

/* y[m, n] = x[m, k] . W^T (+ bias) with gemm_fn's signature: `ember_ggml_gemv` on the weight's type and path
 * (with the zero-point terms where the weight has them). gemm_fn returns nothing: a failure (out of memory)
 * fills y with NaN rather than leave it wrong. */
void ember_ggml_linear(const float *x, const void *weight, const float *bias, float *y, int64_t m, int64_t n, int64_t k) {
    const ggml_weight *w = (const ggml_weight *)weight;
    int status = w->row_parts != NULL ? row_parts_linear(x, (const ggml_row_parts *)w->row_parts, bias, y, m, n, k)
                 : (w->input_order == NULL && w->offsets == NULL) ? ember_ggml_gemv(w->type, x, w->blocks, bias, y, m, n, k, w->path)
                                                                  : zero_point_linear(x, w, bias, y, m, n, k);
    if (status != 0)
        for (int64_t i = 0; i < m * n; i++) y[i] = NAN;
}

/* The row count from which int8-path products run on AMX tiles here (x and the weights rounded to bfloat16); 0 where
 * they never do (not built for them, or Linux refused the tile state). */
int ember_ggml_tile_rows(void) {
#ifdef EMBER_GGML_AMX
    return amx_ready() ? AMX_GGML_MIN_ROWS : 0;
#else
    return 0;
#endif
}

/* Bit mask of the paths this build has: 1 << PATH_INT8 | 1 << PATH_FLOAT | 1 << PATH_PORTABLE. */
int ember_ggml_paths(void) {
#ifdef __AVX2__
    return (1 << PATH_INT8) | (1 << PATH_FLOAT) | (1 << PATH_PORTABLE);
#else
    return 1 << PATH_PORTABLE;
#endif
}

/* The integer dot-product instructions PATH_INT8 was built with: 2 AVX-VNNI, 1 AVX512-VNNI, 0 AVX2 maddubs. */
int ember_ggml_int8_dot_kind(void) {
#if defined(__AVXVNNI__)
    return 2;
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return 1;
#else
    return 0;
#endif
}
