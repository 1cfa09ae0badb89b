/* AMX tile setup shared by the tile kernels (layers/csrc/amx_gemm.h, quant/ggml/ggml_source.c).

   Linux hands a process the AMX tile state only when asked (arch_prctl), once per process; where it
   refuses, `amx_ready()` is 0 and callers take their other path. Every kernel here uses eight tiles
   of 16 rows x 64 bytes: four float32 sum tiles (0-3) and two pairs of operand tiles (4-5, 6-7).
   Tile configuration is per thread: each OpenMP thread calls `configure_tiles()` before its tiles. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <immintrin.h>

#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux's arch_prctl code asking for an extended state component */
#define XFEATURE_XTILEDATA 18      /* ... the AMX tile data */
#define TILE_ROWS 16
#define TILE_PAIRS 16              /* bfloat16 pairs per 64-byte tile row: 32 values of k */

typedef struct __attribute__((packed)) {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config;

static pthread_once_t amx_permission_once = PTHREAD_ONCE_INIT;
static int amx_permitted; /* written once, under amx_permission_once */

static void request_amx_permission(void) {
    amx_permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static int amx_ready(void) {
    pthread_once(&amx_permission_once, request_amx_permission);
    return amx_permitted;
}

/* Eight tiles of 16 rows x 64 bytes, for the calling thread. */
static void configure_tiles(void) {
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = TILE_ROWS;
        config.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&config);
}
