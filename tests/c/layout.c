/* The ABI facts of spec sections 2 and 3 that a compiler can see: macro
 * values, enumerator values, struct sizes, offsets, alignments and member
 * types, and the exact prototypes of section 4. Checked at compile time
 * (_Static_assert, #if) and again at run time. */
#include "check.h"

#include <stdalign.h>
#include <stddef.h>

/* ---- Macros: integer constant expressions usable by the preprocessor. */
#if HIPOBJ_VERSION_MAJOR != 0
#error "HIPOBJ_VERSION_MAJOR must be 0"
#endif
#if HIPOBJ_VERSION_MINOR < 0 || HIPOBJ_VERSION_PATCH < 0
#error "HIPOBJ_VERSION_MINOR/PATCH must be non-negative"
#endif
#if HIPOBJ_BASE_ERR != 6000
#error "HIPOBJ_BASE_ERR must be 6000"
#endif
#if HIPOBJ_RDMA_OP_PUT != 0 || HIPOBJ_RDMA_OP_GET != 1
#error "HIPOBJ_RDMA_OP_PUT/GET must be 0/1"
#endif
#if HIPOBJ_RDMA_REPLY_NOT_IMPLEMENTED != 501
#error "HIPOBJ_RDMA_REPLY_NOT_IMPLEMENTED must be 501"
#endif
#if HIPOBJ_SYNC_TO_HOST != 0 || HIPOBJ_SYNC_TO_DEVICE != 1
#error "HIPOBJ_SYNC_TO_HOST/DEVICE must be 0/1"
#endif
#ifndef HIPOBJ_API
#error "HIPOBJ_API must be defined"
#endif

/* HIPOBJ_API is the default-visibility attribute under GCC/Clang. */
#define STR_(x) #x
#define STR(x) STR_(x)

/* ---- Enumerators. */
_Static_assert(sizeof(hipObjOpError_t) == sizeof(int), "enum is int-sized");
_Static_assert(hipObjSuccess == 0, "");
_Static_assert(hipObjInvalidValue == 1, "");
_Static_assert(hipObjNotInitialized == 2, "");
_Static_assert(hipObjAlreadyInitialized == 3, "");
_Static_assert(hipObjRdmaError == 4, "");
_Static_assert(hipObjS3Error == 5, "");
_Static_assert(hipObjBufNotRegistered == 6, "");
_Static_assert(hipObjBufAlreadyRegistered == 7, "");
_Static_assert(hipObjNicNotFound == 8, "");
_Static_assert(hipObjDmabufNotSupported == 9, "");
_Static_assert(hipObjSizeTooLarge == 10, "");
_Static_assert(hipObjInternalError == 11, "");
_Static_assert(hipObjNotSupported == 12, "");
_Static_assert(hipObjBusy == 13, "");

/* ---- hipObjError_t. */
_Static_assert(sizeof(hipObjError_t) == 8, "hipObjError_t size");
_Static_assert(alignof(hipObjError_t) == 4, "hipObjError_t alignment");
_Static_assert(offsetof(hipObjError_t, opError) == 0, "opError @0");
_Static_assert(offsetof(hipObjError_t, hipError) == 4, "hipError @4");
_Static_assert(_Generic(((hipObjError_t *)0)->opError,
                        hipObjOpError_t: 1, default: 0),
               "opError is a hipObjOpError_t");
_Static_assert(_Generic(((hipObjError_t *)0)->hipError, int: 1, default: 0),
               "hipError is an int");

/* ---- hipObjHandle_t. */
_Static_assert(_Generic((hipObjHandle_t)0, void *: 1, default: 0),
               "hipObjHandle_t is void *");

/* ---- hipObjOps_t. */
typedef int (*send_fn)(void *ctx, const char *token, size_t tokenLen);
typedef int (*recv_fn)(void *ctx, char *reply, size_t *replyLen);
_Static_assert(sizeof(hipObjOps_t) == 16, "hipObjOps_t size");
_Static_assert(alignof(hipObjOps_t) == 8, "hipObjOps_t alignment");
_Static_assert(offsetof(hipObjOps_t, sendRequest) == 0, "sendRequest @0");
_Static_assert(offsetof(hipObjOps_t, recvReply) == 8, "recvReply @8");
_Static_assert(_Generic(((hipObjOps_t *)0)->sendRequest, send_fn: 1,
                        default: 0),
               "sendRequest prototype");
_Static_assert(_Generic(((hipObjOps_t *)0)->recvReply, recv_fn: 1,
                        default: 0),
               "recvReply prototype");

/* ---- hipObjConfig_t. */
#define CONFIG_MEMBER_IS(member, type)                                    \
    _Generic(((hipObjConfig_t *)0)->member, type: 1, default: 0)
_Static_assert(sizeof(hipObjConfig_t) == 48, "hipObjConfig_t size");
_Static_assert(alignof(hipObjConfig_t) == 8, "hipObjConfig_t alignment");
_Static_assert(offsetof(hipObjConfig_t, endpoint) == 0, "endpoint @0");
_Static_assert(offsetof(hipObjConfig_t, region) == 8, "region @8");
_Static_assert(offsetof(hipObjConfig_t, accessKey) == 16, "accessKey @16");
_Static_assert(offsetof(hipObjConfig_t, secretKey) == 24, "secretKey @24");
_Static_assert(offsetof(hipObjConfig_t, flags) == 32, "flags @32");
_Static_assert(offsetof(hipObjConfig_t, gpuDevice) == 36, "gpuDevice @36");
_Static_assert(offsetof(hipObjConfig_t, nicHint) == 40, "nicHint @40");
_Static_assert(CONFIG_MEMBER_IS(endpoint, const char *), "endpoint type");
_Static_assert(CONFIG_MEMBER_IS(region, const char *), "region type");
_Static_assert(CONFIG_MEMBER_IS(accessKey, const char *), "accessKey type");
_Static_assert(CONFIG_MEMBER_IS(secretKey, const char *), "secretKey type");
_Static_assert(CONFIG_MEMBER_IS(flags, uint32_t), "flags type");
_Static_assert(CONFIG_MEMBER_IS(gpuDevice, int), "gpuDevice type");
_Static_assert(CONFIG_MEMBER_IS(nicHint, const char *), "nicHint type");

/* ---- off_t as hipObjGet/Put/BufSync take it (LP64). */
_Static_assert(sizeof(off_t) == 8, "off_t is 64-bit");

/* ---- The exact prototypes of section 4: assigning each function to a
 * pointer of the spec's type is a hard error (-Werror) on any mismatch. */
static const char *(*const p_error_string)(hipObjOpError_t) =
    hipObjGetErrorString;
static hipObjError_t (*const p_init)(hipObjConfig_t *) = hipObjInit;
static hipObjError_t (*const p_shutdown)(void) = hipObjShutdown;
static hipObjError_t (*const p_register)(void *, size_t) = hipObjBufRegister;
static hipObjError_t (*const p_register_host)(void *, size_t) =
    hipObjBufRegisterHost;
static hipObjError_t (*const p_deregister)(void *) = hipObjBufDeregister;
static hipObjError_t (*const p_get)(hipObjHandle_t, void *, size_t, off_t,
                                    hipObjOps_t *, void *) = hipObjGet;
static hipObjError_t (*const p_put)(hipObjHandle_t, const void *, size_t,
                                    off_t, hipObjOps_t *, void *) = hipObjPut;
static hipObjError_t (*const p_sync)(void *, size_t, off_t, int) =
    hipObjBufSync;
static hipObjError_t (*const p_get_token)(const void *, size_t, int,
                                          char **) = hipObjGetRdmaToken;
static hipObjError_t (*const p_put_token)(char *) = hipObjPutRdmaToken;
static hipObjError_t (*const p_parse_reply)(const char *, size_t, int *) =
    hipObjParseRdmaReply;
static hipObjError_t (*const p_client_nic)(const char *, char *, size_t) =
    hipObjTokenClientNic;
static const char *(*const p_version_string)(void) = hipObjGetVersionString;
static hipObjError_t (*const p_version)(int *, int *, int *) =
    hipObjGetVersion;

int main(void)
{
    /* Run-time copies of the compile-time facts. */
    CHECK_INT(HIPOBJ_BASE_ERR, 6000);
    CHECK_INT(HIPOBJ_RDMA_OP_PUT, 0);
    CHECK_INT(HIPOBJ_RDMA_OP_GET, 1);
    CHECK_INT(HIPOBJ_RDMA_REPLY_NOT_IMPLEMENTED, 501);
    CHECK_INT(HIPOBJ_SYNC_TO_HOST, 0);
    CHECK_INT(HIPOBJ_SYNC_TO_DEVICE, 1);
    CHECK_INT(HIPOBJ_VERSION_MAJOR, 0);
#if defined(__GNUC__) || defined(__clang__)
    CHECK_STR(STR(HIPOBJ_API), "__attribute__((visibility(\"default\")))");
#endif

    const int enumerators[] = {
        hipObjSuccess,          hipObjInvalidValue,
        hipObjNotInitialized,   hipObjAlreadyInitialized,
        hipObjRdmaError,        hipObjS3Error,
        hipObjBufNotRegistered, hipObjBufAlreadyRegistered,
        hipObjNicNotFound,      hipObjDmabufNotSupported,
        hipObjSizeTooLarge,     hipObjInternalError,
        hipObjNotSupported,     hipObjBusy,
    };
    for (int i = 0; i < 14; i++) {
        CHECK_INT(enumerators[i], i);
    }

    CHECK_INT(sizeof(hipObjOpError_t), sizeof(int));
    CHECK_INT(sizeof(hipObjError_t), 8);
    CHECK_INT(offsetof(hipObjError_t, opError), 0);
    CHECK_INT(offsetof(hipObjError_t, hipError), 4);
    CHECK_INT(sizeof(hipObjOps_t), 16);
    CHECK_INT(offsetof(hipObjOps_t, sendRequest), 0);
    CHECK_INT(offsetof(hipObjOps_t, recvReply), 8);
    CHECK_INT(sizeof(hipObjConfig_t), 48);
    CHECK_INT(offsetof(hipObjConfig_t, endpoint), 0);
    CHECK_INT(offsetof(hipObjConfig_t, region), 8);
    CHECK_INT(offsetof(hipObjConfig_t, accessKey), 16);
    CHECK_INT(offsetof(hipObjConfig_t, secretKey), 24);
    CHECK_INT(offsetof(hipObjConfig_t, flags), 32);
    CHECK_INT(offsetof(hipObjConfig_t, gpuDevice), 36);
    CHECK_INT(offsetof(hipObjConfig_t, nicHint), 40);
    CHECK_INT(sizeof(((hipObjConfig_t *)0)->flags), 4);
    CHECK_INT(sizeof(((hipObjConfig_t *)0)->gpuDevice), 4);
    CHECK_INT(sizeof(hipObjHandle_t), sizeof(void *));

    /* hipObjError_t comes back by value: the bytes of a returned struct
     * hold opError in the first int and hipError in the second. */
    hipObjError_t r = hipObjGetVersion(NULL, NULL, NULL);
    int words[2];
    memcpy(words, &r, sizeof words);
    CHECK_INT(words[0], hipObjInvalidValue);
    CHECK_INT(words[1], 0);

    /* Calls through the spec-typed pointers (library not initialized). */
    char nic[16];
    int code = 0;
    CHECK_STR(p_error_string(hipObjBusy), "Busy");
    CHECK_STR(p_version_string(), hipObjGetVersionString());
    CHECK_ERR(p_version(NULL, NULL, NULL), hipObjInvalidValue, 0);
    CHECK_ERR(p_init(NULL), hipObjInvalidValue, 0);
    CHECK_ERR(p_shutdown(), hipObjSuccess, 0);
    CHECK_ERR(p_register(NULL, 0), hipObjNotInitialized, 0);
    CHECK_ERR(p_register_host(NULL, 0), hipObjNotInitialized, 0);
    CHECK_ERR(p_deregister(NULL), hipObjNotInitialized, 0);
    CHECK_ERR(p_get(NULL, NULL, 0, 0, NULL, NULL), hipObjNotInitialized, 0);
    CHECK_ERR(p_put(NULL, NULL, 0, 0, NULL, NULL), hipObjNotInitialized, 0);
    CHECK_ERR(p_sync(NULL, 0, 0, 0), hipObjNotInitialized, 0);
    CHECK_ERR(p_get_token(NULL, 0, 0, NULL), hipObjNotInitialized, 0);
    CHECK_ERR(p_put_token(NULL), hipObjInvalidValue, 0);
    CHECK_ERR(p_parse_reply("204", 3, &code), hipObjSuccess, 0);
    CHECK_INT(code, 204);
    CHECK_ERR(p_client_nic("", nic, sizeof nic), hipObjInvalidValue, 0);
    return CHECK_DONE();
}
