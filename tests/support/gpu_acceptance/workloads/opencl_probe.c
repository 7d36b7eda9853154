/* opencl-probe: list OpenCL platforms and GPU devices through the ICD loader (libOpenCL.so.1, dlopen'ed; the
 * image's part), which finds NVIDIA's ICD through /etc/OpenCL/vendors (the driver's part, from the CDI spec).
 * key=value lines, OPENCL_OK at the end; exit 0 when a GPU device was found, 1 when none or a call failed,
 * 2 when libOpenCL.so.1 could not be loaded. No OpenCL headers: the few entry points are declared here.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;

enum { PLATFORM_VERSION = 0x0901, PLATFORM_NAME = 0x0902, PLATFORM_VENDOR = 0x0903 };
enum { DEVICE_NAME = 0x102B, DRIVER_VERSION = 0x102D, MAX_ENTRIES = 16 };
static const cl_ulong DEVICE_TYPE_GPU = 1 << 2;

static cl_int (*GetPlatformIDs)(cl_uint, cl_platform_id *, cl_uint *);
static cl_int (*GetPlatformInfo)(cl_platform_id, cl_uint, size_t, void *, size_t *);
static cl_int (*GetDeviceIDs)(cl_platform_id, cl_ulong, cl_uint, cl_device_id *, cl_uint *);
static cl_int (*GetDeviceInfo)(cl_device_id, cl_uint, size_t, void *, size_t *);

static int load(void) {
    void *library = dlopen("libOpenCL.so.1", RTLD_NOW);
    if (library == NULL) {
        printf("error=dlopen libOpenCL.so.1: %s\n", dlerror());
        return 0;
    }
    *(void **)&GetPlatformIDs = dlsym(library, "clGetPlatformIDs");
    *(void **)&GetPlatformInfo = dlsym(library, "clGetPlatformInfo");
    *(void **)&GetDeviceIDs = dlsym(library, "clGetDeviceIDs");
    *(void **)&GetDeviceInfo = dlsym(library, "clGetDeviceInfo");
    if (!GetPlatformIDs || !GetPlatformInfo || !GetDeviceIDs || !GetDeviceInfo) {
        printf("error=libOpenCL.so.1 lacks an OpenCL 1.0 entry point\n");
        return 0;
    }
    return 1;
}

static int list_devices(cl_uint p, cl_platform_id platform) {
    cl_device_id devices[MAX_ENTRIES];
    cl_uint count = 0;
    char text[256];
    cl_int status = GetDeviceIDs(platform, DEVICE_TYPE_GPU, MAX_ENTRIES, devices, &count);
    if (status != 0) {
        printf("platform%u_gpu_devices_error=%d\n", p, status);
        return 0;
    }
    printf("platform%u_gpu_devices=%u\n", p, count);
    for (cl_uint d = 0; d < count && d < MAX_ENTRIES; d++) {
        text[0] = 0;
        GetDeviceInfo(devices[d], DEVICE_NAME, sizeof text, text, NULL);
        printf("platform%u_device%u_name=%s\n", p, d, text);
        text[0] = 0;
        GetDeviceInfo(devices[d], DRIVER_VERSION, sizeof text, text, NULL);
        printf("platform%u_device%u_driver=%s\n", p, d, text);
    }
    return (int)count;
}

int main(void) {
    cl_platform_id platforms[MAX_ENTRIES];
    cl_uint count = 0;
    char text[256];
    int gpus = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!load()) return 2;
    cl_int status = GetPlatformIDs(MAX_ENTRIES, platforms, &count);
    printf("platforms=%u\n", status == 0 ? count : 0);
    if (status != 0) {
        /* -1001: CL_PLATFORM_NOT_FOUND_KHR, the loader found no ICD (no ICD file in /etc/OpenCL/vendors it could load). */
        printf("error=clGetPlatformIDs: %d\n", status);
        return 1;
    }
    for (cl_uint p = 0; p < count && p < MAX_ENTRIES; p++) {
        static const cl_uint fields[] = {PLATFORM_NAME, PLATFORM_VENDOR, PLATFORM_VERSION};
        static const char *names[] = {"name", "vendor", "version"};
        for (int f = 0; f < 3; f++) {
            text[0] = 0;
            GetPlatformInfo(platforms[p], fields[f], sizeof text, text, NULL);
            printf("platform%u_%s=%s\n", p, names[f], text);
        }
        gpus += list_devices(p, platforms[p]);
    }
    if (gpus == 0) {
        printf("error=no OpenCL GPU device\n");
        return 1;
    }
    printf("OPENCL_OK\n");
    return 0;
}
