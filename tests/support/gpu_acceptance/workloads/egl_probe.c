/* egl-probe: headless EGL on the GPU. Through libEGL.so.1 (glvnd's dispatcher, dlopen'ed; the image's part), which
 * finds NVIDIA's libEGL_nvidia.so.0 through its vendor file in /usr/share/glvnd/egl_vendor.d (the driver's part,
 * from the CDI spec): enumerate EGL devices (EGL_EXT_device_enumeration), open the first one's display on the
 * device platform and initialise it. key=value lines, EGL_OK at the end; exit 0 when a device display
 * initialised, 1 when not, 2 when libEGL.so.1 could not be loaded. No EGL headers: the entry points are declared.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

typedef int32_t EGLint;
typedef unsigned int EGLBoolean;
typedef unsigned int EGLenum;
typedef void *EGLDisplay;
typedef void *EGLDeviceEXT;
typedef void (*Function)(void);

enum { EGL_VENDOR = 0x3053, EGL_VERSION = 0x3054, EGL_EXTENSIONS = 0x3055, PLATFORM_DEVICE = 0x313F };
enum { DRM_DEVICE_FILE = 0x3233, MAX_DEVICES = 16 };

static Function (*GetProcAddress)(const char *);
static EGLBoolean (*Initialize)(EGLDisplay, EGLint *, EGLint *);
static EGLBoolean (*Terminate)(EGLDisplay);
static const char *(*QueryString)(EGLDisplay, EGLint);
static EGLint (*GetError)(void);
static EGLBoolean (*QueryDevices)(EGLint, EGLDeviceEXT *, EGLint *);
static const char *(*QueryDeviceString)(EGLDeviceEXT, EGLint);
static EGLDisplay (*GetPlatformDisplay)(EGLenum, void *, const EGLint *);

static int load(void) {
    void *library = dlopen("libEGL.so.1", RTLD_NOW);
    if (library == NULL) {
        printf("error=dlopen libEGL.so.1: %s\n", dlerror());
        return 0;
    }
    *(void **)&GetProcAddress = dlsym(library, "eglGetProcAddress");
    *(void **)&Initialize = dlsym(library, "eglInitialize");
    *(void **)&Terminate = dlsym(library, "eglTerminate");
    *(void **)&QueryString = dlsym(library, "eglQueryString");
    *(void **)&GetError = dlsym(library, "eglGetError");
    if (!GetProcAddress || !Initialize || !Terminate || !QueryString || !GetError) {
        printf("error=libEGL.so.1 lacks an EGL 1.4 entry point\n");
        return 0;
    }
    *(void **)&QueryDevices = (void *)GetProcAddress("eglQueryDevicesEXT");
    *(void **)&QueryDeviceString = (void *)GetProcAddress("eglQueryDeviceStringEXT");
    *(void **)&GetPlatformDisplay = (void *)GetProcAddress("eglGetPlatformDisplayEXT");
    return 1;
}

static const char *or_none(const char *text) { return text != NULL ? text : "(none)"; }

int main(void) {
    EGLDeviceEXT devices[MAX_DEVICES];
    EGLint count = 0, major = 0, minor = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!load()) return 2;
    printf("client_extensions=%s\n", or_none(QueryString(NULL, EGL_EXTENSIONS)));
    if (!QueryDevices || !QueryDeviceString || !GetPlatformDisplay) {
        /* glvnd found no vendor library offering the device extensions: no vendor file, or it failed to load. */
        printf("error=no eglQueryDevicesEXT / eglGetPlatformDisplayEXT (no EGL vendor with device support)\n");
        return 1;
    }
    if (!QueryDevices(MAX_DEVICES, devices, &count)) {
        printf("error=eglQueryDevicesEXT failed: 0x%x\n", GetError());
        return 1;
    }
    printf("devices=%d\n", count);
    for (EGLint d = 0; d < count && d < MAX_DEVICES; d++) {
        printf("device%d_extensions=%s\n", d, or_none(QueryDeviceString(devices[d], EGL_EXTENSIONS)));
        printf("device%d_drm_file=%s\n", d, or_none(QueryDeviceString(devices[d], DRM_DEVICE_FILE)));
    }
    if (count == 0) {
        printf("error=no EGL device\n");
        return 1;
    }
    EGLDisplay display = GetPlatformDisplay(PLATFORM_DEVICE, devices[0], NULL);
    if (display == NULL || !Initialize(display, &major, &minor)) {
        printf("error=eglInitialize on device 0 failed: 0x%x\n", GetError());
        return 1;
    }
    printf("egl_version=%d.%d\nvendor=%s\nversion_string=%s\n", major, minor, or_none(QueryString(display, EGL_VENDOR)),
           or_none(QueryString(display, EGL_VERSION)));
    Terminate(display);
    printf("EGL_OK\n");
    return 0;
}
