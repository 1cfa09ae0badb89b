/* Many-row bfloat16 products on AMX tiles (Intel Advanced Matrix Extensions), for gemm.c.

   Where the CPU has AMX-BF16, one tdpbf16ps multiplies a 16 x 32 bfloat16 tile of activations by
   a 32 x 16 tile of weights into 16 x 16 float32 sums: 8,192 multiply-adds per instruction, about
   8x what vdpbf16ps gives a prefill chunk. The paired bfloat16 panels (k pairs x 16 lanes, 64 bytes
   a pair row) are already the weight tile's layout, so 16 pair rows of a panel load as one tile;
   the activations are the same bfloat16 pairs the vdpbf16ps kernel reads (rows ldx words apart, k
   zero-padded to a multiple of 32), so both paths see the same rounded inputs and each output is
   the exact products summed in float32 (in another order: the results agree to float32 rounding).
   A block of 32 rows x 32 outputs keeps four sum tiles; a panel's last k pairs are read through a
   zero-padded copy so no tile reads past the weights. Where Linux refuses the tile state
   (amx_tiles.h), the vdpbf16ps kernel runs instead. */
#include "amx_tiles.h"

/* From this many rows the tiles win: measured on a Xeon with AMX (bfloat16 weights 8960 x 1536, 576 x 576,
   3072 x 576, 49152 x 576), the vdpbf16ps walk is compute bound from 4 rows (time doubling with the rows),
   tiles stay at memory speed: 1.0x at 4 rows, 1.8x at 8, 3.5x at 16, 7-10x at 32 to 512; at 1 or 2 rows the
   walk is 1.2-2.6x faster (no tile setup, no 16-row tile for one row). Tiles 0-3 hold sums, 4-5 activations
   (16 rows x 32 bfloat16), 6-7 weights (16 k pairs x 16 outputs x 2). */
#define AMX_MIN_ROWS 4

/* Panel t's pair rows q0 .. q0 + 15: in place, or copied into `tail` with zeros past the panel's last pair. */
static inline const uint32_t *weight_tile(const uint32_t *packed, int64_t k_pairs, int64_t t, int64_t q0, uint32_t *tail) {
    const uint32_t *rows = packed + (t * k_pairs + q0) * NR;
    if (q0 + TILE_PAIRS <= k_pairs)
        return rows;
    memset(tail, 0, TILE_PAIRS * NR * sizeof(uint32_t));
    memcpy(tail, rows, (size_t)(k_pairs - q0) * NR * sizeof(uint32_t));
    return tail;
}

/* y rows r0 .. r0 + rows - 1, outputs of panel t, from a 16 x 16 sum tile stored at `sums` (+ bias). */
static void store_sums(const float *sums, float *y, const float *bias, int64_t r0, int64_t rows, int64_t t, int64_t n) {
    int64_t first = t * NR, width = n - first < NR ? n - first : NR;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < width; j++)
            y[(r0 + i) * n + first + j] = sums[i * NR + j] + (bias ? bias[first + j] : 0.0f);
}

/* 32 rows from r0 times panels t and t + 1 (both when `two_panels`, else t only), all of k. */
static void amx_block(const uint32_t *pairs, int64_t ldx, const uint32_t *packed, int64_t k_pairs, const float *bias,
                      float *y, int64_t m, int64_t n, int64_t r0, int64_t t, int two_panels) {
    uint32_t tail0[TILE_PAIRS * NR], tail1[TILE_PAIRS * NR];
    const uint32_t *a0 = pairs + r0 * ldx, *a1 = a0 + TILE_ROWS * ldx;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t q0 = 0; q0 < k_pairs; q0 += TILE_PAIRS) {
        _tile_loadd(4, a0 + q0, ldx * sizeof(uint32_t));
        _tile_loadd(5, a1 + q0, ldx * sizeof(uint32_t));
        _tile_loadd(6, weight_tile(packed, k_pairs, t, q0, tail0), NR * sizeof(uint32_t));
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        if (two_panels) {
            _tile_loadd(7, weight_tile(packed, k_pairs, t + 1, q0, tail1), NR * sizeof(uint32_t));
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    float sums[TILE_ROWS * NR];
    int64_t rows0 = m - r0 < TILE_ROWS ? m - r0 : TILE_ROWS, rows1 = m - r0 - TILE_ROWS;
    rows1 = rows1 < 0 ? 0 : rows1 < TILE_ROWS ? rows1 : TILE_ROWS;
    _tile_stored(0, sums, NR * sizeof(float));
    store_sums(sums, y, bias, r0, rows0, t, n);
    _tile_stored(1, sums, NR * sizeof(float));
    store_sums(sums, y, bias, r0 + TILE_ROWS, rows1, t, n);
    if (two_panels) {
        _tile_stored(2, sums, NR * sizeof(float));
        store_sums(sums, y, bias, r0, rows0, t + 1, n);
        _tile_stored(3, sums, NR * sizeof(float));
        store_sums(sums, y, bias, r0 + TILE_ROWS, rows1, t + 1, n);
    }
}

/* y = pairs . packed^T (+ bias) on AMX tiles; `pairs` holds 32 x ceil(m / 32) rows (the ones past m zero).
   Threads split the panel pairs; each walks every row block against its panels, which stay in its L2. */
static void amx_gemm_pairs(const uint32_t *pairs, int64_t ldx, const uint32_t *packed, const float *bias, float *y,
                           int64_t m, int64_t n, int64_t k_pairs) {
    int64_t num_panels = (n + NR - 1) / NR, num_items = (num_panels + 1) / 2;
    _Pragma("omp parallel")
    {
        configure_tiles();
        _Pragma("omp for schedule(static)")
        for (int64_t item = 0; item < num_items; item++)
            for (int64_t r0 = 0; r0 < m; r0 += 2 * TILE_ROWS)
                amx_block(pairs, ldx, packed, k_pairs, bias, y, m, n, r0, 2 * item, 2 * item + 1 < num_panels);
        _tile_release();
    }
}
