/* A stand-in for libcuda.so.1: the few driver-API functions cuda_alloc calls, with no GPU.
 *
 * Built by fakecuda.py (gcc -shared) for the tests and for `scripts/device-check --simulate`.
 * It hands out fake device pointers (no memory is touched), keeps the books the way the
 * driver does, and fails the way the driver fails:
 *
 *   FAKE_CUDA_INIT_ERROR=N     cuInit returns N (e.g. 999 CUDA_ERROR_UNKNOWN, 35 INSUFFICIENT_DRIVER)
 *   FAKE_CUDA_DEVICES=N        devices present (default 1); 0: cuInit says CUDA_ERROR_NO_DEVICE
 *   FAKE_CUDA_TOTAL_MIB=N      each device's memory (default 24576)
 *   FAKE_CUDA_CONTEXT_MIB=N    what a context costs, counted from cuDevicePrimaryCtxRetain (default 0)
 *   FAKE_CUDA_ALLOC_LIMIT=N    after N successful cuMemAlloc calls, every further one fails with
 *                              CUDA_ERROR_OUT_OF_MEMORY (default: no limit)
 *   FAKE_CUDA_DIR=DIR          share one device between processes: each process keeps its bytes
 *                              in DIR/<pid>; an allocation that would take the live processes
 *                              past FAKE_CUDA_TOTAL_MIB fails with CUDA_ERROR_OUT_OF_MEMORY
 *   FAKE_CUDA_TRACE=FILE       append "alloc <ptr> <bytes>" / "free <ptr> <bytes>" lines
 *
 * The variables are read at each call, so a test may change them between calls.  As with the
 * driver, every call before cuInit fails with CUDA_ERROR_NOT_INITIALIZED, and memory calls need
 * a context current on the calling thread (cuCtxSetCurrent is per thread), else
 * CUDA_ERROR_INVALID_CONTEXT.  fake_cuda_* functions let an in-process test read the books.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <dirent.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
};

#define MIB (1024ULL * 1024ULL)
#define PAGE (2ULL * MIB)
#define MAX_ALLOCS 65536

struct alloc { CUdeviceptr ptr; size_t bytes; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized = 0;
static int retained = 0;            /* primary-context references */
static struct alloc allocs[MAX_ALLOCS];
static int live = 0;
static unsigned long long used_bytes = 0;   /* allocations, rounded up to 2 MiB pages */
static unsigned long long alloc_calls = 0, free_calls = 0, ok_allocs = 0;
static CUdeviceptr next_ptr = 0x7f0000000000ULL;
static __thread CUcontext current = NULL;
static char primary_ctx_token;      /* its address is the fake primary context */

static long env_long(const char *name, long fallback) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return fallback;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    return (end != NULL && *end == '\0') ? n : fallback;
}

static unsigned long long total_bytes(void) { return (unsigned long long)env_long("FAKE_CUDA_TOTAL_MIB", 24576) * MIB; }
static unsigned long long context_bytes(void) { return retained ? (unsigned long long)env_long("FAKE_CUDA_CONTEXT_MIB", 0) * MIB : 0; }
static unsigned long long own_bytes(void) { return used_bytes + context_bytes(); }

static void trace(const char *what, CUdeviceptr ptr, size_t bytes) {
    const char *path = getenv("FAKE_CUDA_TRACE");
    if (path == NULL || *path == '\0') return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd < 0) return;
    char line[128];
    int n = snprintf(line, sizeof line, "%s 0x%llx %zu %d\n", what, ptr, bytes, (int)getpid());
    if (n > 0) { ssize_t w = write(fd, line, (size_t)n); (void)w; }
    close(fd);
}

/* -- the shared ledger (FAKE_CUDA_DIR) -------------------------------------------------- */

static int ledger_lock(const char *dir) {
    char path[4096];
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return -1;
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) { close(fd); return -1; }
    return fd;
}

static void ledger_unlock(int fd) { if (fd >= 0) { flock(fd, LOCK_UN); close(fd); } }

static unsigned long long others_bytes(const char *dir) {
    unsigned long long sum = 0;
    DIR *d = opendir(dir);
    if (d == NULL) return 0;
    struct dirent *e;
    pid_t self = getpid();
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        long pid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || pid <= 0 || pid == self) continue;
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) continue;   /* gone: its memory too */
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL) continue;
        unsigned long long bytes = 0;
        if (fscanf(f, "%llu", &bytes) == 1) sum += bytes;
        fclose(f);
    }
    closedir(d);
    return sum;
}

static void ledger_write(const char *dir) {
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
    snprintf(tmp, sizeof tmp, "%s/.%d.tmp", dir, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL) return;
    fprintf(f, "%llu\n", own_bytes());
    fclose(f);
    rename(tmp, path);
}

static void ledger_update(void) {
    const char *dir = getenv("FAKE_CUDA_DIR");
    if (dir == NULL || *dir == '\0') return;
    int fd = ledger_lock(dir);
    pthread_mutex_lock(&lock);
    ledger_write(dir);
    pthread_mutex_unlock(&lock);
    ledger_unlock(fd);
}

/* -- the driver API ------------------------------------------------------------------------- */

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    long forced = env_long("FAKE_CUDA_INIT_ERROR", 0);
    if (forced != 0) return (CUresult)forced;
    if (env_long("FAKE_CUDA_DEVICES", 1) <= 0) return CUDA_ERROR_NO_DEVICE;
    pthread_mutex_lock(&lock);
    initialized = 1;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = (int)env_long("FAKE_CUDA_DEVICES", 1);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= env_long("FAKE_CUDA_DEVICES", 1)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= env_long("FAKE_CUDA_DEVICES", 1)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "Fake CUDA Device %d", dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= env_long("FAKE_CUDA_DEVICES", 1)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)total_bytes();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= env_long("FAKE_CUDA_DEVICES", 1)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    retained++;
    pthread_mutex_unlock(&lock);
    ledger_update();
    *pctx = &primary_ctx_token;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= env_long("FAKE_CUDA_DEVICES", 1)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    if (retained == 0) { pthread_mutex_unlock(&lock); return CUDA_ERROR_INVALID_CONTEXT; }
    retained--;
    pthread_mutex_unlock(&lock);
    ledger_update();
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != NULL && ctx != (CUcontext)&primary_ctx_token) return CUDA_ERROR_INVALID_CONTEXT;
    current = ctx;
    return CUDA_SUCCESS;
}

static CUresult need_context(void) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (current == NULL || retained == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return need_context(); }

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    CUresult r = need_context();
    if (r != CUDA_SUCCESS) return r;
    if (free_bytes == NULL || total == NULL) return CUDA_ERROR_INVALID_VALUE;
    const char *dir = getenv("FAKE_CUDA_DIR");
    pthread_mutex_lock(&lock);
    unsigned long long used = own_bytes();
    pthread_mutex_unlock(&lock);
    if (dir != NULL && *dir != '\0') used += others_bytes(dir);
    unsigned long long all = total_bytes();
    *total = (size_t)all;
    *free_bytes = (size_t)(used >= all ? 0 : all - used);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUresult r = need_context();
    if (r != CUDA_SUCCESS) return r;
    if (dptr == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long rounded = ((bytesize + PAGE - 1) / PAGE) * PAGE;
    const char *dir = getenv("FAKE_CUDA_DIR");
    int shared = dir != NULL && *dir != '\0';
    int fd = shared ? ledger_lock(dir) : -1;
    pthread_mutex_lock(&lock);
    alloc_calls++;
    long limit = env_long("FAKE_CUDA_ALLOC_LIMIT", -1);
    unsigned long long others = shared ? others_bytes(dir) : 0;
    if ((limit >= 0 && ok_allocs >= (unsigned long long)limit) || live >= MAX_ALLOCS
        || own_bytes() + others + rounded > total_bytes()) {
        pthread_mutex_unlock(&lock);
        ledger_unlock(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUdeviceptr ptr = next_ptr;
    next_ptr += rounded;
    allocs[live].ptr = ptr;
    allocs[live].bytes = bytesize;
    live++;
    used_bytes += rounded;
    ok_allocs++;
    if (shared) ledger_write(dir);
    pthread_mutex_unlock(&lock);
    ledger_unlock(fd);
    trace("alloc", ptr, bytesize);
    *dptr = ptr;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult r = need_context();
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&lock);
    free_calls++;
    for (int i = 0; i < live; i++) {
        if (allocs[i].ptr == dptr) {
            size_t bytes = allocs[i].bytes;
            used_bytes -= ((bytes + PAGE - 1) / PAGE) * PAGE;
            allocs[i] = allocs[live - 1];
            live--;
            pthread_mutex_unlock(&lock);
            ledger_update();
            trace("free", dptr, bytes);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    (void)value;
    CUresult r = need_context();
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < live; i++) {
        if (dst >= allocs[i].ptr && dst + n <= allocs[i].ptr + allocs[i].bytes) {
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

static const char *error_name(CUresult error) {
    switch (error) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case 35: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return NULL;
    }
}

static const char *error_string(CUresult error) {
    switch (error) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case 35: return "CUDA driver version is insufficient for CUDA runtime version";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case 999: return "unknown error";
    default: return NULL;
    }
}

/* As the driver does: an unknown code gives CUDA_ERROR_INVALID_VALUE and *pStr = NULL. */
CUresult cuGetErrorName(CUresult error, const char **pstr) {
    if (pstr == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pstr = error_name(error);
    return *pstr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pstr) {
    if (pstr == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pstr = error_string(error);
    return *pstr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* -- the books, for in-process tests ------------------------------------------------------- */

int fake_cuda_live(void) { return live; }
unsigned long long fake_cuda_used_bytes(void) { return used_bytes; }
unsigned long long fake_cuda_alloc_calls(void) { return alloc_calls; }
unsigned long long fake_cuda_free_calls(void) { return free_calls; }
int fake_cuda_retained(void) { return retained; }

void fake_cuda_reset(void) {
    pthread_mutex_lock(&lock);
    initialized = 0;
    retained = 0;
    live = 0;
    used_bytes = alloc_calls = free_calls = ok_allocs = 0;
    current = NULL;
    pthread_mutex_unlock(&lock);
}
