/* A stand-in for the CUDA driver (libcuda.so.1) answering the seven calls nx's device facts make,
 * for kernels/tests/gpu_facts.rs: two devices, an H200 and a made-up one, with the values a real
 * driver gives an H200. Built with -DFAKE_INIT=code, cuInit fails with that code. */
#include <string.h>

#ifndef FAKE_INIT
#define FAKE_INIT 0
#endif

typedef int CUresult;
typedef int CUdevice;

static const char *names[] = {"NVIDIA H200", "NVIDIA Fake Z9"};

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return FAKE_INIT;
}
CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 2; return 0; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal > 1) return 101;
    *d = 10 + ordinal;
    return 0;
}
CUresult cuDeviceGetName(char *buf, int len, CUdevice d) {
    if (d < 10 || d > 11) return 101;
    strncpy(buf, names[d - 10], (size_t)len);
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    *bytes = d == 10 ? (size_t)150754820096ULL : (size_t)(24ULL << 30);
    return 0;
}
CUresult cuDeviceGetAttribute(int *x, int attribute, CUdevice d) {
    int h200 = d == 10;
    switch (attribute) {
    case 16: *x = h200 ? 132 : 7; return 0;          /* multiprocessors */
    case 38: *x = h200 ? 52428800 : 1 << 20; return 0; /* L2 */
    case 75: *x = h200 ? 9 : 12; return 0;           /* compute capability */
    case 76: *x = h200 ? 0 : 1; return 0;
    case 81: *x = h200 ? 233472 : 65536; return 0;   /* shared memory per multiprocessor */
    case 97: *x = h200 ? 232448 : 49152; return 0;   /* opt-in shared memory per block */
    default: return 1;                               /* CUDA_ERROR_INVALID_VALUE */
    }
}
