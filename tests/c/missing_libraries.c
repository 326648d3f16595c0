/* The library where the dynamic loader finds nothing but libc, this
 * program and libhipobj itself: no libibverbs, no librdmacm, no HIP
 * runtime (tests/c_api.rs runs it chrooted into a directory holding only
 * those files). Nothing may crash:
 *
 *  - hipObjInit returns {hipObjRdmaError, 0} (libibverbs is checked first,
 *    spec section 4 row 2), with and without a NIC hint, and again on a
 *    second try (a failed load is retried, and fails the same way);
 *  - it names the missing library on stderr (checked by the runner);
 *  - nothing is published: the other calls say NotInitialized;
 *  - the calls that need no library work: error strings, version, reply
 *    parsing, token helpers;
 *  - hipObjShutdown succeeds, initialized or not.
 *
 * The program first checks that the libraries are indeed out of reach, so
 * that a runner that failed to isolate it fails loudly instead of testing
 * nothing. */
#include "check.h"

#include <dlfcn.h>
#include <stdlib.h>

/* Every library the library under test would open (src/platform: the
 * verbs, CM and HIP loaders), by the names it tries. */
static const char *const vendor_sonames[] = {
    "libibverbs.so.1",  "libibverbs.so",       "librdmacm.so.1",
    "libamdhip64.so.7", "libamdhip64.so.6",    "libamdhip64.so.5",
    "libamdhip64.so",   "libhsa-runtime64.so.1",
};

static int vendor_libraries_are_out_of_reach(void)
{
    int reachable = 0;
    for (size_t i = 0; i < sizeof vendor_sonames / sizeof *vendor_sonames; i++) {
        void *lib = dlopen(vendor_sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (lib != NULL) {
            fprintf(stderr, "missing_libraries.c: %s can be loaded here\n",
                    vendor_sonames[i]);
            dlclose(lib);
            reachable = 1;
        }
    }
    return !reachable;
}

static hipObjConfig_t config(int gpu_device, const char *nic_hint)
{
    hipObjConfig_t c;
    memset(&c, 0, sizeof c);
    c.endpoint = "http://127.0.0.1:9000";
    c.region = "us-east-1";
    c.flags = 0;
    c.gpuDevice = gpu_device;
    c.nicHint = nic_hint;
    return c;
}

static void nothing_was_published(void)
{
    static unsigned char buf[4096];
    int ctx = 0;
    hipObjOps_t ops = {NULL, NULL};
    char *token = (char *)buf;
    const hipObjOpError_t ni = hipObjNotInitialized;
    CHECK_ERR(hipObjBufRegisterHost(buf, sizeof buf), ni, 0);
    CHECK_ERR(hipObjBufRegister(buf, sizeof buf), ni, 0);
    CHECK_ERR(hipObjBufDeregister(buf), ni, 0);
    CHECK_ERR(hipObjBufSync(buf, 16, 0, HIPOBJ_SYNC_TO_HOST), ni, 0);
    CHECK_ERR(hipObjGet(NULL, buf, 16, 0, &ops, &ctx), ni, 0);
    CHECK_ERR(hipObjPut(NULL, buf, 16, 0, &ops, &ctx), ni, 0);
    CHECK_ERR(hipObjGetRdmaToken(buf, 16, HIPOBJ_RDMA_OP_GET, &token), ni, 0);
    CHECK(token == (char *)buf);
}

static void the_calls_that_need_no_library_work(void)
{
    CHECK_STR(hipObjGetErrorString(hipObjRdmaError), "RDMA error");
    CHECK_STR(hipObjGetErrorString(hipObjSuccess), "Success");
    CHECK_STR(hipObjGetErrorString((hipObjOpError_t)1000), "Unknown error");

    char expected[64];
    snprintf(expected, sizeof expected, "%d.%d.%d", HIPOBJ_VERSION_MAJOR,
             HIPOBJ_VERSION_MINOR, HIPOBJ_VERSION_PATCH);
    CHECK_STR(hipObjGetVersionString(), expected);
    int major = -1, minor = -1, patch = -1;
    CHECK_ERR(hipObjGetVersion(&major, &minor, &patch), hipObjSuccess, 0);
    CHECK_INT(major, HIPOBJ_VERSION_MAJOR);
    CHECK_INT(minor, HIPOBJ_VERSION_MINOR);
    CHECK_INT(patch, HIPOBJ_VERSION_PATCH);

    int code = 0;
    CHECK_ERR(hipObjParseRdmaReply("206", 3, &code), hipObjSuccess, 0);
    CHECK_INT(code, 206);

    struct test_token t;
    memset(&t, 0, sizeof t);
    t.transport = 0x01;
    t.gid[10] = 0xff;
    t.gid[11] = 0xff;
    t.gid[12] = 192;
    t.gid[13] = 0;
    t.gid[14] = 2;
    t.gid[15] = 7;
    char hex[TOKEN_HEX + 1];
    token_hex(&t, 0, hex);
    char ip[16];
    CHECK_ERR(hipObjTokenClientNic(hex, ip, sizeof ip), hipObjSuccess, 0);
    CHECK_STR(ip, "192.0.2.7");

    char *owned = malloc(TOKEN_HEX + 1);
    CHECK(owned != NULL);
    if (owned != NULL) {
        memcpy(owned, hex, sizeof hex);
        CHECK_ERR(hipObjPutRdmaToken(owned), hipObjSuccess, 0);
    }
}

int main(void)
{
    if (!vendor_libraries_are_out_of_reach()) {
        fprintf(stderr, "missing_libraries.c: not isolated from the vendor "
                        "libraries; nothing would be tested\n");
        return 1;
    }

    the_calls_that_need_no_library_work();
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);

    hipObjConfig_t current_gpu = config(-1, NULL);
    CHECK_ERR(hipObjInit(&current_gpu), hipObjRdmaError, 0);
    nothing_was_published();

    hipObjConfig_t hinted = config(-1, "rxe0");
    CHECK_ERR(hipObjInit(&hinted), hipObjRdmaError, 0);
    nothing_was_published();

    hipObjConfig_t first_gpu = config(0, "mlx5_0,rxe0");
    CHECK_ERR(hipObjInit(&first_gpu), hipObjRdmaError, 0);
    nothing_was_published();

    /* The argument checks still come first. */
    CHECK_ERR(hipObjInit(NULL), hipObjInvalidValue, 0);

    the_calls_that_need_no_library_work();
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    return CHECK_DONE();
}
