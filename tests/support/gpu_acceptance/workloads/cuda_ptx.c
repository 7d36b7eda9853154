/* cuda-ptx: JIT-load a hand-written PTX kernel through the CUDA driver API and check what it computes.
 *
 * No CUDA headers or toolkit: the few driver-API entry points used are declared here and found with dlopen and
 * dlsym in libcuda.so.1, so the program needs only glibc to build and run. It prints key=value lines (read by
 * tests/support/gpu_acceptance), ends with CUDA_PTX_OK, and exits 0 only when every element came back right.
 * Exit 1: a CUDA call failed; 2: libcuda.so.1 could not be loaded.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_ptx.h" /* static const char KERNEL_PTX[]: workloads/kernel.ptx, written by --prepare */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct {
    int type; /* CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0 */
    union {
        struct {
            unsigned int val;
        } smCount;
    } param;
} CUexecAffinityParam;

enum {
    ATTR_MULTIPROCESSORS = 16,
    ATTR_CC_MAJOR = 75,
    ATTR_CC_MINOR = 76,
    JIT_ERROR_LOG_BUFFER = 5,
    JIT_ERROR_LOG_BUFFER_SIZE = 6,
    ELEMENTS = 1 << 20,
};

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetExecAffinity)(CUexecAffinityParam *, int);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*ModuleLoadDataEx)(CUmodule *, const void *, unsigned int, int *, void **);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*CtxSynchronize)(void);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static void *library;

static void *symbol(const char *name, int required) {
    void *found = dlsym(library, name);
    if (found == NULL && required) {
        printf("error=libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return found;
}

static void load(void) {
    library = dlopen("libcuda.so.1", RTLD_NOW);
    if (library == NULL) {
        printf("error=dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
    *(void **)&cu.Init = symbol("cuInit", 1);
    *(void **)&cu.DriverGetVersion = symbol("cuDriverGetVersion", 1);
    *(void **)&cu.DeviceGetCount = symbol("cuDeviceGetCount", 1);
    *(void **)&cu.DeviceGet = symbol("cuDeviceGet", 1);
    *(void **)&cu.DeviceGetName = symbol("cuDeviceGetName", 1);
    *(void **)&cu.DeviceGetAttribute = symbol("cuDeviceGetAttribute", 1);
    *(void **)&cu.DevicePrimaryCtxRetain = symbol("cuDevicePrimaryCtxRetain", 1);
    *(void **)&cu.DevicePrimaryCtxRelease = symbol("cuDevicePrimaryCtxRelease_v2", 1);
    *(void **)&cu.CtxSetCurrent = symbol("cuCtxSetCurrent", 1);
    *(void **)&cu.CtxGetExecAffinity = symbol("cuCtxGetExecAffinity", 0); /* CUDA 11.4+ */
    *(void **)&cu.MemGetInfo = symbol("cuMemGetInfo_v2", 1);
    *(void **)&cu.ModuleLoadDataEx = symbol("cuModuleLoadDataEx", 1);
    *(void **)&cu.ModuleGetFunction = symbol("cuModuleGetFunction", 1);
    *(void **)&cu.ModuleUnload = symbol("cuModuleUnload", 1);
    *(void **)&cu.MemAlloc = symbol("cuMemAlloc_v2", 1);
    *(void **)&cu.MemFree = symbol("cuMemFree_v2", 1);
    *(void **)&cu.MemcpyHtoD = symbol("cuMemcpyHtoD_v2", 1);
    *(void **)&cu.MemcpyDtoH = symbol("cuMemcpyDtoH_v2", 1);
    *(void **)&cu.LaunchKernel = symbol("cuLaunchKernel", 1);
    *(void **)&cu.CtxSynchronize = symbol("cuCtxSynchronize", 1);
    *(void **)&cu.GetErrorString = symbol("cuGetErrorString", 1);
}

static void check(CUresult result, const char *what) {
    if (result != 0) {
        const char *text = "unknown";
        cu.GetErrorString(result, &text);
        printf("error=%s: CUDA error %d (%s)\n", what, result, text);
        exit(1);
    }
}

static void describe(CUdevice device) {
    char name[256] = {0};
    int version = 0, count = 0, major = 0, minor = 0, sms = 0;
    check(cu.DriverGetVersion(&version), "cuDriverGetVersion");
    check(cu.DeviceGetCount(&count), "cuDeviceGetCount");
    check(cu.DeviceGetName(name, (int)sizeof name - 1, device), "cuDeviceGetName");
    check(cu.DeviceGetAttribute(&major, ATTR_CC_MAJOR, device), "cuDeviceGetAttribute(cc major)");
    check(cu.DeviceGetAttribute(&minor, ATTR_CC_MINOR, device), "cuDeviceGetAttribute(cc minor)");
    check(cu.DeviceGetAttribute(&sms, ATTR_MULTIPROCESSORS, device), "cuDeviceGetAttribute(multiprocessors)");
    printf("driver_api_version=%d\ndevice_count=%d\ndevice_name=%s\ncompute_capability=%d.%d\nmultiprocessors=%d\n",
           version, count, name, major, minor, sms);
}

static void describe_context(void) {
    size_t free_bytes = 0, total_bytes = 0;
    check(cu.MemGetInfo(&free_bytes, &total_bytes), "cuMemGetInfo");
    printf("memory_free_bytes=%zu\nmemory_total_bytes=%zu\n", free_bytes, total_bytes);
    if (cu.CtxGetExecAffinity != NULL) {
        CUexecAffinityParam affinity;
        memset(&affinity, 0, sizeof affinity);
        /* Under MPS with an active thread percentage, the SM count this context may use. */
        if (cu.CtxGetExecAffinity(&affinity, 0) == 0) {
            printf("exec_affinity_sm_count=%u\n", affinity.param.smCount.val);
        }
    }
}

static CUfunction load_kernel(CUmodule *module) {
    char log[8192] = {0};
    int options[] = {JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_BUFFER_SIZE};
    void *values[] = {log, (void *)(uintptr_t)sizeof log};
    CUresult loaded = cu.ModuleLoadDataEx(module, KERNEL_PTX, 2, options, values);
    if (loaded != 0) {
        printf("jit_log=%s\n", log);
    }
    check(loaded, "cuModuleLoadDataEx (PTX JIT)");
    printf("ptx_jit=ok\n");
    CUfunction function;
    check(cu.ModuleGetFunction(&function, *module, "scale_add"), "cuModuleGetFunction(scale_add)");
    return function;
}

static int run_kernel(CUfunction function) {
    size_t bytes = ELEMENTS * sizeof(float);
    float *in = malloc(bytes), *out = malloc(bytes), a = 3.0f;
    unsigned int n = ELEMENTS;
    CUdeviceptr d_in, d_out;
    for (unsigned int i = 0; i < n; i++) in[i] = (float)(i % 1024) * 0.5f;
    check(cu.MemAlloc(&d_in, bytes), "cuMemAlloc");
    check(cu.MemAlloc(&d_out, bytes), "cuMemAlloc");
    check(cu.MemcpyHtoD(d_in, in, bytes), "cuMemcpyHtoD");
    void *params[] = {&d_out, &d_in, &a, &n};
    check(cu.LaunchKernel(function, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
    check(cu.CtxSynchronize(), "cuCtxSynchronize");
    check(cu.MemcpyDtoH(out, d_out, bytes), "cuMemcpyDtoH");
    unsigned int wrong = 0;
    for (unsigned int i = 0; i < n; i++) {
        /* Exact in float: every product and sum here is an integer or half-integer below 2^24. */
        if (out[i] != a * in[i] + (float)i) wrong++;
    }
    printf("elements=%u\nwrong=%u\n", n, wrong);
    cu.MemFree(d_in);
    cu.MemFree(d_out);
    free(in);
    free(out);
    return wrong == 0;
}

int main(void) {
    CUdevice device;
    CUcontext context;
    CUmodule module;
    setvbuf(stdout, NULL, _IOLBF, 0);
    load();
    check(cu.Init(0), "cuInit");
    check(cu.DeviceGet(&device, 0), "cuDeviceGet(0)");
    describe(device);
    check(cu.DevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    check(cu.CtxSetCurrent(context), "cuCtxSetCurrent");
    describe_context();
    int right = run_kernel(load_kernel(&module));
    cu.ModuleUnload(module);
    cu.DevicePrimaryCtxRelease(device);
    if (!right) {
        printf("error=the kernel's results are wrong\n");
        return 1;
    }
    printf("CUDA_PTX_OK\n");
    return 0;
}
