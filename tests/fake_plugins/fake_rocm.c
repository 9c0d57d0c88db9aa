/* Stand-ins for ROCm's librocm-core.so.1 and libamdhip64.so.N in the variant-choice tests:
 *   FAKE_ROCM_CORE=M,m,p   getROCmVersion reports ROCm M.m.p
 *   FAKE_HIP=N             the HIP calls gpu_staging resolves; each fails with error 600+N and
 *                          hipGetErrorString names the major, so a test sees which one loaded */
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

#ifdef FAKE_ROCM_CORE
EXPORT int getROCmVersion(unsigned *major, unsigned *minor, unsigned *patch) {
    unsigned v[] = {FAKE_ROCM_CORE};
    *major = v[0];
    *minor = v[1];
    *patch = v[2];
    return 0;
}
#endif

#ifdef FAKE_HIP
#define STR2(x) #x
#define STR(x) STR2(x)
EXPORT int hipGetDevice(int *d) {
    *d = 0;
    return 0;
}
EXPORT int hipSetDevice(int d) {
    (void)d;
    return 0;
}
EXPORT int hipHostMalloc(void **p, size_t n, unsigned f) {
    (void)p;
    (void)n;
    (void)f;
    return 600 + FAKE_HIP;
}
EXPORT int hipHostFree(void *p) {
    (void)p;
    return 0;
}
EXPORT int hipMemcpy(void *d, const void *s, size_t n, int k) {
    (void)d;
    (void)s;
    (void)n;
    (void)k;
    return 600 + FAKE_HIP;
}
/* The async calls gpu_staging resolves at open (streams, events, pointer attributes). */
EXPORT int hipMemcpyAsync(void *d, const void *s, size_t n, int k, void *st) {
    (void)d;
    (void)s;
    (void)n;
    (void)k;
    (void)st;
    return 600 + FAKE_HIP;
}
EXPORT int hipStreamCreateWithFlags(void **s, unsigned f) {
    (void)f;
    *s = 0;
    return 600 + FAKE_HIP;
}
EXPORT int hipStreamDestroy(void *s) {
    (void)s;
    return 0;
}
EXPORT int hipEventCreateWithFlags(void **e, unsigned f) {
    (void)f;
    *e = 0;
    return 600 + FAKE_HIP;
}
EXPORT int hipEventRecord(void *e, void *s) {
    (void)e;
    (void)s;
    return 600 + FAKE_HIP;
}
EXPORT int hipEventSynchronize(void *e) {
    (void)e;
    return 600 + FAKE_HIP;
}
EXPORT int hipEventDestroy(void *e) {
    (void)e;
    return 0;
}
EXPORT int hipPointerGetAttributes(void *a, const void *p) {
    (void)a;
    (void)p;
    return 1;
}
EXPORT const char *hipGetErrorString(int rc) {
    (void)rc;
    return "fake HIP " STR(FAKE_HIP);
}
#endif
