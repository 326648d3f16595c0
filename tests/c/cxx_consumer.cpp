// A C++11 consumer of hipobj.h: the header compiles as C++11 with strict
// warnings, its declarations get C linkage (the program links against the
// C symbols of libhipobj.so), and its types behave as in C.
#include <hipobj.h>

#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <type_traits>

static int failures = 0;

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,     \
                         __LINE__, #cond);                                  \
            ++failures;                                                     \
        }                                                                   \
    } while (0)

static_assert(sizeof(hipObjOpError_t) == sizeof(int), "enum is int-sized");
static_assert(hipObjSuccess == 0 && hipObjBusy == 13, "enumerator values");
static_assert(std::is_standard_layout<hipObjError_t>::value, "POD result");
static_assert(std::is_trivially_copyable<hipObjError_t>::value, "POD result");
static_assert(sizeof(hipObjError_t) == 8, "hipObjError_t size");
static_assert(offsetof(hipObjError_t, hipError) == 4, "hipError @4");
static_assert(sizeof(hipObjOps_t) == 16, "hipObjOps_t size");
static_assert(offsetof(hipObjOps_t, recvReply) == 8, "recvReply @8");
static_assert(sizeof(hipObjConfig_t) == 48, "hipObjConfig_t size");
static_assert(offsetof(hipObjConfig_t, flags) == 32, "flags @32");
static_assert(offsetof(hipObjConfig_t, gpuDevice) == 36, "gpuDevice @36");
static_assert(offsetof(hipObjConfig_t, nicHint) == 40, "nicHint @40");
static_assert(std::is_same<decltype(hipObjConfig_t::flags), uint32_t>::value,
              "flags is uint32_t");
static_assert(std::is_same<hipObjHandle_t, void *>::value, "opaque handle");
static_assert(
    std::is_same<decltype(&hipObjGet),
                 hipObjError_t (*)(hipObjHandle_t, void *, size_t, off_t,
                                   hipObjOps_t *, void *)>::value,
    "hipObjGet prototype");
static_assert(std::is_same<decltype(&hipObjGetErrorString),
                           const char *(*)(hipObjOpError_t)>::value,
              "hipObjGetErrorString prototype");

// Callbacks written in C++ fit the C function-pointer members.
extern "C" {
static int send_request(void *, const char *, size_t) { return 0; }
static int recv_reply(void *, char *, size_t *) { return 0; }
}

int main()
{
    hipObjOpError_t e = hipObjNicNotFound;
    CHECK(std::strcmp(hipObjGetErrorString(e), "NIC not found") == 0);
    CHECK(std::strcmp(hipObjGetErrorString(static_cast<hipObjOpError_t>(14)),
                      "Unknown error") == 0);
    CHECK(std::strcmp(hipObjGetErrorString(
                          static_cast<hipObjOpError_t>(INT_MIN)),
                      "Unknown error") == 0);

    int major = -1, minor = -1, patch = -1;
    hipObjError_t r = hipObjGetVersion(&major, &minor, &patch);
    CHECK(r.opError == hipObjSuccess && r.hipError == 0);
    CHECK(major == HIPOBJ_VERSION_MAJOR && minor == HIPOBJ_VERSION_MINOR &&
          patch == HIPOBJ_VERSION_PATCH);
    char expected[64];
    std::snprintf(expected, sizeof expected, "%d.%d.%d", major, minor, patch);
    CHECK(std::strcmp(hipObjGetVersionString(), expected) == 0);

    int code = 0;
    r = hipObjParseRdmaReply("206\r\n", 5, &code);
    CHECK(r.opError == hipObjSuccess && code == 206);

    hipObjConfig_t config = hipObjConfig_t();
    config.flags = 1;
    config.gpuDevice = -1;
    config.nicHint = "rxe0";
    r = hipObjInit(&config);
    CHECK(r.opError == hipObjInvalidValue && r.hipError == 0);

    hipObjOps_t ops = {send_request, recv_reply};
    char buffer[64];
    r = hipObjGet(nullptr, buffer, sizeof buffer, 0, &ops, nullptr);
    CHECK(r.opError == hipObjNotInitialized && r.hipError == 0);
    r = hipObjPut(nullptr, buffer, sizeof buffer, 0, &ops, nullptr);
    CHECK(r.opError == hipObjNotInitialized && r.hipError == 0);

    r = hipObjShutdown();
    CHECK(r.opError == hipObjSuccess);

    if (failures != 0) {
        std::fprintf(stderr, "cxx_consumer: %d check(s) failed\n", failures);
        return 1;
    }
    return 0;
}
