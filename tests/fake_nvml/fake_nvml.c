/* A fault-injecting stand-in for libnvidia-ml.so.1, loaded through GPULOOP_NVML_LIB by the
 * driver-fault tests. FAKE_NVML picks the fault: hang-init (nvmlInit never returns),
 * hang-mem (memory reads never return), hang-gpu1 (only GPU 1's memory reads never return),
 * lost (GPU 1 has fallen off the bus), garbage (the
 * process list holds impossible pids and FAKE_PID, a live process that uses no GPU), faults
 * (the fault queries answer as an H200 with driver 580 does: ECC on, retired pages Not
 * Supported, remapped rows and the recovery action; GPU 1 has 3 corrected and 2 uncorrected
 * volatile ECC errors, a row remap pending and the recovery action GPU_RESET). Outside
 * `faults` those queries, and the PCI info, are Not Supported.
 * Symbols it lacks are errors in nvml-wrapper, never calls.
 * FAKE_NVML_DELAY_MS="init=10,attach=6,util=2" adds the driver's own costs as measured on
 * H200s (nvmlInit, the first handle of each GPU, its first utilisation read), so that a local
 * latency bench shows the shape of the critical path; tests never set it. */
#include <pthread.h>
#include <stdio.h>
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

/* The fault queries (FAKE_NVML=faults). 3 is NVML_ERROR_NOT_SUPPORTED. */
#define NOT_SUPPORTED 3
static unsigned gpu_of(void *d) { return (unsigned)(unsigned long)d - 1; }
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_t;
int nvmlDeviceGetPciInfo_v3(void *d, pci_t *p) {
    if (!mode("faults")) return NOT_SUPPORTED;
    memset(p, 0, sizeof *p);
    p->bus = 0x18 + gpu_of(d);
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    return 0;
}
int nvmlDeviceGetEccMode(void *d, int *current, int *pending) {
    (void)d;
    if (!mode("faults")) return NOT_SUPPORTED;
    *current = *pending = 1;
    return 0;
}
/* errorType 0 corrected, 1 uncorrected; counterType 0 volatile, 1 aggregate. */
int nvmlDeviceGetTotalEccErrors(void *d, int errorType, int counterType, unsigned long long *n) {
    if (!mode("faults")) return NOT_SUPPORTED;
    *n = 0;
    if (gpu_of(d) == 1 && counterType == 0) *n = errorType == 0 ? 3 : 2;
    return 0;
}
int nvmlDeviceGetRetiredPages(void *d, int cause, unsigned *count, unsigned long long *addresses) {
    (void)d; (void)cause; (void)count; (void)addresses;
    return NOT_SUPPORTED;
}
int nvmlDeviceGetRetiredPages_v2(void *d, int cause, unsigned *count, unsigned long long *addresses,
                                 unsigned long long *timestamps) {
    (void)d; (void)cause; (void)count; (void)addresses; (void)timestamps;
    return NOT_SUPPORTED;
}
int nvmlDeviceGetRetiredPagesPendingStatus(void *d, int *pending) {
    (void)d; (void)pending;
    return NOT_SUPPORTED;
}
int nvmlDeviceGetRemappedRows(void *d, unsigned *corr, unsigned *unc, unsigned *pending, unsigned *failure) {
    if (!mode("faults")) return NOT_SUPPORTED;
    int one = gpu_of(d) == 1;
    *corr = 0;
    *unc = one;
    *pending = one;
    *failure = 0;
    return 0;
}
typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType, nvmlReturn;
    union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; } value;
} field_t;
int nvmlDeviceGetFieldValues(void *d, int count, field_t *values) {
    for (int i = 0; i < count; i++) {
        if (!mode("faults") || values[i].fieldId != 230) {
            values[i].nvmlReturn = NOT_SUPPORTED;
            continue;
        }
        values[i].valueType = 1; /* unsigned int */
        values[i].nvmlReturn = 0;
        values[i].value.ui = gpu_of(d) == 1 ? 1 : 0; /* GPU_RESET, NONE */
    }
    return 0;
}
