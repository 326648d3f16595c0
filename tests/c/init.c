/* hipObjInit on a machine where it cannot succeed: no RDMA device and no
 * usable GPU (spec section 4, row 2; src/core/instance.rs).
 *
 *  - config NULL, flags != 0, gpuDevice < -1: {InvalidValue, 0};
 *  - a valid config without nicHint: libibverbs loads, then no GPU can be
 *    used and there is no hint, so {RdmaError, hip} where hip is
 *    100 (hipErrorNoDevice) when the HIP runtime cannot be loaded, else
 *    what hipGetDeviceCount itself returns here (HIP 5.2 without a GPU:
 *    100 as well);
 *  - a valid config with nicHint "rxe0": the GPU-less path applies and the
 *    hinted device does not exist, so opening it fails: {RdmaError, 0};
 *  - without libibverbs at all, both give {RdmaError, 0} (checked first);
 *  - a failed init publishes nothing: every non-[C] function still says
 *    NotInitialized, and the next init fails the same way (never
 *    AlreadyInitialized).
 *
 * The program probes the machine (libibverbs present? RDMA devices? the
 * HIP runtime's answer to hipGetDeviceCount?) to pick between those
 * expectations, and fails outright on a machine that has an RDMA device or
 * a GPU, where these expectations do not apply. */
#include "check.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>

enum verbs_state { VERBS_MISSING, VERBS_NO_DEVICE, VERBS_HAS_DEVICES };

static enum verbs_state probe_verbs(void)
{
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        lib = dlopen("libibverbs.so", RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == NULL) {
        return VERBS_MISSING;
    }
    void **(*get_list)(int *) = NULL;
    void (*free_list)(void **) = NULL;
    void *sym = dlsym(lib, "ibv_get_device_list");
    memcpy(&get_list, &sym, sizeof sym);
    sym = dlsym(lib, "ibv_free_device_list");
    memcpy(&free_list, &sym, sizeof sym);
    if (get_list == NULL || free_list == NULL) {
        return VERBS_MISSING;
    }
    int count = 0;
    errno = 0;
    void **list = get_list(&count);
    if (list == NULL) {
        /* ENOSYS: no kernel verbs support, i.e. no device. */
        if (errno == ENOSYS) {
            return VERBS_NO_DEVICE;
        }
        fprintf(stderr, "ibv_get_device_list failed: errno %d\n", errno);
        return VERBS_HAS_DEVICES;
    }
    free_list(list);
    return count == 0 ? VERBS_NO_DEVICE : VERBS_HAS_DEVICES;
}

/* The sonames and functions the library's HIP loader needs
 * (src/platform/gpu/loader.rs SONAMES, src/platform/gpu/sys.rs HipFns),
 * in its order. */
static const char *const hip_sonames[] = {
    "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
    "libamdhip64.so",
};
static const char *const hip_functions[] = {
    "hipGetDeviceCount",       "hipGetDevice",          "hipSetDevice",
    "hipDeviceGetPCIBusId",    "hipPointerGetAttributes",
    "hipMemGetAddressRange",   "hipHostMalloc",         "hipHostFree",
    "hipMemcpyAsync",          "hipEventCreateWithFlags",
    "hipEventRecord",          "hipEventQuery",         "hipEventDestroy",
    "hipDeviceSynchronize",
};

#define HIP_ERROR_NO_DEVICE 100
#define HIP_HAS_GPU (-1)

/* The hipError the library reports when init finds no usable GPU:
 * hipErrorNoDevice when the runtime cannot be loaded (or lacks a
 * function the library needs), else hipGetDeviceCount's own error code
 * (and hipErrorNoDevice for a count of 0). HIP_HAS_GPU if it finds one. */
static int probe_hip(void)
{
    void *lib = NULL;
    for (size_t i = 0; lib == NULL && i < sizeof hip_sonames / sizeof *hip_sonames; i++) {
        lib = dlopen(hip_sonames[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == NULL) {
        return HIP_ERROR_NO_DEVICE;
    }
    for (size_t i = 0; i < sizeof hip_functions / sizeof *hip_functions; i++) {
        if (dlsym(lib, hip_functions[i]) == NULL) {
            return HIP_ERROR_NO_DEVICE;
        }
    }
    int (*get_count)(int *) = NULL;
    void *sym = dlsym(lib, "hipGetDeviceCount");
    memcpy(&get_count, &sym, sizeof sym);
    int count = 0;
    int code = get_count(&count);
    if (code != 0) {
        return code;
    }
    return count > 0 ? HIP_HAS_GPU : HIP_ERROR_NO_DEVICE;
}

#define NI hipObjNotInitialized

static void nothing_was_published(const char *after)
{
    static unsigned char buf[4096];
    int ctx = 0;
    hipObjOps_t ops = {NULL, NULL};
    char *token = (char *)buf;
    hipObjError_t r = hipObjBufRegisterHost(buf, sizeof buf);
    if (r.opError != NI || r.hipError != 0) {
        CHECK_FAIL_("after %s: hipObjBufRegisterHost returned {%d, %d}",
                    after, (int)r.opError, r.hipError);
    }
    CHECK_ERR(hipObjBufRegister(buf, sizeof buf), NI, 0);
    CHECK_ERR(hipObjBufDeregister(buf), NI, 0);
    CHECK_ERR(hipObjBufSync(buf, 16, 0, HIPOBJ_SYNC_TO_HOST), NI, 0);
    CHECK_ERR(hipObjGet(NULL, buf, 16, 0, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjPut(NULL, buf, 16, 0, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjGetRdmaToken(buf, 16, HIPOBJ_RDMA_OP_GET, &token), NI, 0);
    CHECK(token == (char *)buf);
}

static hipObjConfig_t valid_config(void)
{
    hipObjConfig_t c;
    memset(&c, 0xa5, sizeof c); /* padding and all: no stale zeros */
    c.endpoint = "http://127.0.0.1:9000";
    c.region = "us-east-1";
    c.accessKey = "AKIAIOSFODNN7EXAMPLE";
    c.secretKey = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    c.flags = 0;
    c.gpuDevice = 0;
    c.nicHint = NULL;
    return c;
}

/* Calls hipObjInit(config) and checks the result is {op, hip}. */
static void expect_init(const char *what, hipObjConfig_t *config, int op,
                        int hip)
{
    hipObjError_t r = hipObjInit(config);
    if ((int)r.opError != op || r.hipError != hip) {
        CHECK_FAIL_("hipObjInit(%s) returned {%d (%s), hipError %d}, "
                    "expected {%d (%s), hipError %d}",
                    what, (int)r.opError, hipObjGetErrorString(r.opError),
                    r.hipError, op, hipObjGetErrorString((hipObjOpError_t)op),
                    hip);
    }
    nothing_was_published(what);
}

int main(void)
{
    enum verbs_state verbs = probe_verbs();
    if (verbs == VERBS_HAS_DEVICES) {
        fprintf(stderr,
                "init.c: this machine has an RDMA device (or libibverbs "
                "fails to list them); the expectations here are for a "
                "machine without one\n");
        return 1;
    }
    const int hip = probe_hip();
    if (hip == HIP_HAS_GPU) {
        fprintf(stderr,
                "init.c: this machine has a GPU; the expectations here are "
                "for a machine without one\n");
        return 1;
    }
    const int no_hint_op = hipObjRdmaError;
    const int no_hint_hip = verbs == VERBS_MISSING ? 0 : hip;
    const int hint_op = hipObjRdmaError;
    fprintf(stderr, "libibverbs %s, HIP says %d; expecting {%d, %d} without "
            "a hint, {%d, 0} with one\n",
            verbs == VERBS_MISSING ? "missing" : "present, no device", hip,
            no_hint_op, no_hint_hip, hint_op);

    /* ---- Argument checks, in order, before anything else. */
    expect_init("NULL", NULL, hipObjInvalidValue, 0);

    hipObjConfig_t c = valid_config();
    c.flags = 1;
    expect_init("flags=1", &c, hipObjInvalidValue, 0);
    c.flags = 0x80000000u;
    expect_init("flags=0x80000000", &c, hipObjInvalidValue, 0);
    c.flags = UINT32_MAX;
    c.nicHint = "rxe0";
    expect_init("flags=~0 with hint", &c, hipObjInvalidValue, 0);

    c = valid_config();
    c.gpuDevice = -2;
    expect_init("gpuDevice=-2", &c, hipObjInvalidValue, 0);
    c.gpuDevice = INT_MIN;
    expect_init("gpuDevice=INT_MIN", &c, hipObjInvalidValue, 0);
    c.nicHint = "rxe0";
    expect_init("gpuDevice=-2 with hint", &c, hipObjInvalidValue, 0);
    c.flags = 2;
    expect_init("flags=2 and gpuDevice<-1", &c, hipObjInvalidValue, 0);

    /* ---- Valid configurations: the machine decides. */
    c = valid_config();
    expect_init("no hint, gpuDevice 0", &c, no_hint_op, no_hint_hip);
    expect_init("no hint, gpuDevice 0, again", &c, no_hint_op, no_hint_hip);
    c.gpuDevice = -1;
    expect_init("no hint, gpuDevice -1", &c, no_hint_op, no_hint_hip);
    c.endpoint = c.region = c.accessKey = c.secretKey = NULL;
    expect_init("no hint, all strings NULL", &c, no_hint_op, no_hint_hip);

    c = valid_config();
    c.nicHint = "rxe0";
    expect_init("nicHint rxe0", &c, hint_op, 0);
    expect_init("nicHint rxe0, again", &c, hint_op, 0);
    c.gpuDevice = -1;
    expect_init("nicHint rxe0, gpuDevice -1", &c, hint_op, 0);
    c.nicHint = "rxe0,mlx5_0";
    expect_init("nicHint rxe0,mlx5_0", &c, hint_op, 0);

    /* The argument checks still come first after machine failures. */
    expect_init("NULL, after failures", NULL, hipObjInvalidValue, 0);

    /* Back to the no-hint case: the failures do not stick. */
    c = valid_config();
    expect_init("no hint, last", &c, no_hint_op, no_hint_hip);

    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    nothing_was_published("shutdown");
    c.nicHint = "rxe0";
    expect_init("nicHint rxe0, after shutdown", &c, hint_op, 0);
    return CHECK_DONE();
}
