/* Publish-and-wait for ranks that share one memory segment (ember/parallel/shared_exchange.py).

   The segment starts with one 64-byte line per rank holding the number of the last exchange that
   rank has written its slot for. A rank copies its data into its slot, then publishes the exchange's
   number with a release store; a reader waits with acquire loads until every rank's number has
   reached the exchange's, after which every slot's bytes are visible to it. Waiting spins (a pause
   per poll), and yields the core after a while, so ranks that outnumber the cores still progress. */
#include <sched.h>
#include <stdint.h>
#include <time.h>

#define FLAG_STRIDE 64      /* bytes between two ranks' numbers: one cache line each */
#define SPINS_BEFORE_YIELD 2048
#define POLLS_PER_CLOCK_READ 256

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* This rank's slot of exchange `number` is written. */
void ember_shared_publish(char *segment, int64_t rank, uint64_t number) {
    __atomic_store_n((uint64_t *)(segment + rank * FLAG_STRIDE), number, __ATOMIC_RELEASE);
}

/* 0 once every rank has published `number` (or a later one); 1 + the first rank still missing after
   `wait_s` seconds otherwise (the caller decides whether to wait again). */
int64_t ember_shared_wait(const char *segment, int64_t world, uint64_t number, double wait_s) {
    double deadline = now_s() + wait_s;
    for (int64_t r = 0; r < world; r++) {
        const uint64_t *flag = (const uint64_t *)(segment + r * FLAG_STRIDE);
        uint64_t polls = 0;
        while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < number) {
            if (++polls < SPINS_BEFORE_YIELD)
                relax();
            else
                sched_yield();
            if (polls % POLLS_PER_CLOCK_READ == 0 && now_s() > deadline) return r + 1;
        }
    }
    return 0;
}
