/* A clock shift for one redis-server in a test: preloaded (LD_PRELOAD), it adds
 * CLOCK_SHIFT_S seconds to the wall clock (gettimeofday, time, clock_gettime's realtime
 * clocks); the monotonic clocks stay true. libfaketime cannot run Redis (its jemalloc calls
 * clock_gettime while libfaketime initialises); this calls the kernel directly, so nothing
 * recurses. Compiled by the tests (helpers/private_redis.rs) with the system's cc. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long offset(void) {
    const char *s = getenv("CLOCK_SHIFT_S");
    return s ? atol(s) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset();
    return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    long r = syscall(SYS_gettimeofday, tv, tz);
    if (r == 0 && tv) tv->tv_sec += offset();
    return (int)r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
