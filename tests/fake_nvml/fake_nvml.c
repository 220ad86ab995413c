/* A fault-injecting stand-in for libnvidia-ml.so.1, loaded through GPULOOP_NVML_LIB by the
 * driver-fault tests. FAKE_NVML picks the fault: hang-init (nvmlInit never returns),
 * hang-mem (memory reads never return), hang-gpu1 (only GPU 1's memory reads never return),
 * lost (GPU 1 has fallen off the bus), garbage (the
 * process list holds impossible pids and FAKE_PID, a live process that uses no GPU).
 * Symbols it lacks are errors in nvml-wrapper, never calls.
 * FAKE_NVML_DELAY_MS="init=10,attach=6,util=2" adds the driver's own costs as measured on
 * H200s (nvmlInit, the first handle of each GPU, its first utilisation read), so that a local
 * latency bench shows the shape of the critical path; tests never set it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem_v2;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_v2;

static int mode(const char *m) {
    const char *v = getenv("FAKE_NVML");
    return v && strcmp(v, m) == 0;
}
static void hang(void) { for (;;) pause(); }

/* Milliseconds FAKE_NVML_DELAY_MS gives `what` ("init", "attach", "util"), 0 if none. */
static unsigned delay_ms(const char *what) {
    const char *v = getenv("FAKE_NVML_DELAY_MS"), *p;
    size_t n = strlen(what);
    for (p = v; p && (p = strstr(p, what)); p += n)
        if ((p == v || p[-1] == ',') && p[n] == '=') return (unsigned)atoi(p + n + 1);
    return 0;
}
static void pause_ms(unsigned ms) {
    struct timespec t = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (ms && nanosleep(&t, &t) != 0) {}
}
/* Per GPU, once: a second caller waits for the first, as the driver's attach does. */
static pthread_mutex_t once_lock[2][2] = {
    { PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER },
    { PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER } };
static int once_done[2][2];
static void first_time(unsigned gpu, int which, const char *what) {
    pthread_mutex_lock(&once_lock[which][gpu]);
    if (!once_done[which][gpu]) { pause_ms(delay_ms(what)); once_done[which][gpu] = 1; }
    pthread_mutex_unlock(&once_lock[which][gpu]);
}

int nvmlInit_v2(void) { if (mode("hang-init")) hang(); pause_ms(delay_ms("init")); return 0; }
int nvmlInitWithFlags(unsigned flags) { (void)flags; return nvmlInit_v2(); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 15 ? "GPU is lost" : "fake NVML error"; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
    if (i >= 2) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    first_time(i, 0, "attach");
    *d = (void *)(unsigned long)(i + 1);
    return 0;
}
int nvmlDeviceGetMinorNumber(void *d, unsigned *m) { *m = (unsigned)(unsigned long)d - 1; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void *d, mem_v2 *m) {
    if (mode("hang-mem") || (mode("hang-gpu1") && (unsigned long)d == 2)) hang();
    if (mode("lost") && (unsigned long)d == 2) return 15; /* NVML_ERROR_GPU_IS_LOST */
    m->total = 80ULL << 30;
    m->reserved = 0;
    m->used = (unsigned long)d == 1 && mode("garbage") ? 500ULL << 20 : 0;
    m->free = m->total - m->used;
    return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *count, proc_v2 *infos) {
    unsigned pids[5] = {0, 1, 4194304, 0xffffffffu, 0};
    unsigned n = 0;
    if (mode("garbage") && (unsigned long)d == 1) {
        const char *p = getenv("FAKE_PID");
        pids[4] = p ? (unsigned)atoi(p) : 0;
        n = 5;
    }
    if (infos == NULL || *count < n) { *count = n; return n ? 7 : 0; } /* INSUFFICIENT_SIZE */
    for (unsigned i = 0; i < n; i++) {
        infos[i].pid = pids[i];
        infos[i].used = 100ULL << 20;
        infos[i].gi = infos[i].ci = 0xffffffffu;
    }
    *count = n;
    return 0;
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *d, unsigned *count, proc_v2 *infos) {
    (void)d; (void)infos; *count = 0; return 0;
}
typedef struct { unsigned gpu, memory; } util_t;
int nvmlDeviceGetUtilizationRates(void *d, util_t *u) {
    first_time((unsigned)(unsigned long)d - 1, 1, "util");
    u->gpu = u->memory = 0;
    return 0;
}
int nvmlDeviceGetTemperature(void *d, int sensor, unsigned *t) { (void)d; (void)sensor; *t = 30; return 0; }
