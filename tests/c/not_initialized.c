/* Without a successful hipObjInit, every function that is not [C] returns
 * {hipObjNotInitialized, 0} before looking at any argument (spec section 4):
 * with NULL, zero and garbage arguments, and with arguments that would be
 * valid. No callback is called and hipObjGetRdmaToken leaves *outToken
 * alone. hipObjShutdown succeeds when not initialized, repeatedly. */
#include "check.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

static int callbacks_called;

static int send_request(void *ctx, const char *token, size_t tokenLen)
{
    (void)ctx;
    (void)token;
    (void)tokenLen;
    callbacks_called++;
    return 0;
}

static int recv_reply(void *ctx, char *reply, size_t *replyLen)
{
    (void)ctx;
    memcpy(reply, "ok", 2);
    *replyLen = 2;
    callbacks_called++;
    return 0;
}

#define NI hipObjNotInitialized

static void every_call_is_not_initialized(const char *when)
{
    fprintf(stderr, "checking every non-[C] function %s\n", when);
    static unsigned char host[4096];
    void *heap = malloc(1 << 16);
    CHECK(heap != NULL);
    void *garbage = (void *)(uintptr_t)0xdeadbeefcafef00dull;
    void *odd = (void *)(uintptr_t)1;
    void *top = (void *)(uintptr_t)UINTPTR_MAX;
    const size_t four_gib = (size_t)1 << 32;
    hipObjOps_t ops = {send_request, recv_reply};
    hipObjOps_t null_ops = {NULL, NULL};
    hipObjOps_t half_ops = {send_request, NULL};
    int ctx = 0;

    /* hipObjBufRegister / hipObjBufRegisterHost */
    CHECK_ERR(hipObjBufRegister(NULL, 0), NI, 0);
    CHECK_ERR(hipObjBufRegister(NULL, 4096), NI, 0);
    CHECK_ERR(hipObjBufRegister(heap, 0), NI, 0);
    CHECK_ERR(hipObjBufRegister(heap, four_gib + 1), NI, 0);
    CHECK_ERR(hipObjBufRegister(heap, SIZE_MAX), NI, 0);
    CHECK_ERR(hipObjBufRegister(top, 2), NI, 0);
    CHECK_ERR(hipObjBufRegister(garbage, 4096), NI, 0);
    CHECK_ERR(hipObjBufRegister(heap, 1 << 16), NI, 0);
    CHECK_ERR(hipObjBufRegister(heap, four_gib), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(NULL, 0), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(NULL, 4096), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(heap, 0), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(heap, four_gib + 1), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(top, SIZE_MAX), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(odd, 1), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(host, sizeof host), NI, 0);
    CHECK_ERR(hipObjBufRegisterHost(heap, 1 << 16), NI, 0);

    /* hipObjBufDeregister */
    CHECK_ERR(hipObjBufDeregister(NULL), NI, 0);
    CHECK_ERR(hipObjBufDeregister(garbage), NI, 0);
    CHECK_ERR(hipObjBufDeregister(host), NI, 0);
    CHECK_ERR(hipObjBufDeregister(heap), NI, 0);

    /* hipObjBufSync: bad direction, NULL buffer, negative offset... */
    CHECK_ERR(hipObjBufSync(NULL, 0, 0, 0), NI, 0);
    CHECK_ERR(hipObjBufSync(NULL, 0, -1, 7), NI, 0);
    CHECK_ERR(hipObjBufSync(heap, 16, 0, -1), NI, 0);
    CHECK_ERR(hipObjBufSync(heap, 16, 0, 2), NI, 0);
    CHECK_ERR(hipObjBufSync(heap, 16, 0, INT_MIN), NI, 0);
    CHECK_ERR(hipObjBufSync(heap, 0, 0, HIPOBJ_SYNC_TO_HOST), NI, 0);
    CHECK_ERR(hipObjBufSync(heap, 16, -4096, HIPOBJ_SYNC_TO_HOST), NI, 0);
    CHECK_ERR(hipObjBufSync(garbage, SIZE_MAX, INT64_MAX, 1), NI, 0);
    CHECK_ERR(hipObjBufSync(heap, 4096, 0, HIPOBJ_SYNC_TO_HOST), NI, 0);
    CHECK_ERR(hipObjBufSync(heap, 4096, 4096, HIPOBJ_SYNC_TO_DEVICE), NI, 0);

    /* hipObjGet / hipObjPut: NULL ops, NULL callbacks, bad ranges... */
    CHECK_ERR(hipObjGet(NULL, NULL, 0, 0, NULL, NULL), NI, 0);
    CHECK_ERR(hipObjGet(NULL, NULL, 0, -1, &null_ops, NULL), NI, 0);
    CHECK_ERR(hipObjGet(garbage, heap, 16, 0, &half_ops, &ctx), NI, 0);
    CHECK_ERR(hipObjGet(NULL, heap, 0, 0, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjGet(NULL, heap, 16, -1, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjGet(NULL, garbage, SIZE_MAX, INT64_MAX, &ops, NULL), NI,
              0);
    CHECK_ERR(hipObjGet(NULL, heap, 4096, 0, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjGet(&ctx, heap, 4096, 8192, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjPut(NULL, NULL, 0, 0, NULL, NULL), NI, 0);
    CHECK_ERR(hipObjPut(NULL, NULL, 0, -1, &null_ops, NULL), NI, 0);
    CHECK_ERR(hipObjPut(garbage, heap, 16, 0, &half_ops, &ctx), NI, 0);
    CHECK_ERR(hipObjPut(NULL, heap, 0, 0, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjPut(NULL, heap, 16, -1, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjPut(NULL, garbage, SIZE_MAX, INT64_MAX, &ops, NULL), NI,
              0);
    CHECK_ERR(hipObjPut(NULL, heap, 4096, 0, &ops, &ctx), NI, 0);
    CHECK_ERR(hipObjPut(&ctx, host, sizeof host, 0, &ops, &ctx), NI, 0);
    CHECK_INT(callbacks_called, 0);

    /* hipObjGetRdmaToken: *outToken stays untouched in every case. */
    char sentinel_storage[] = "sentinel";
    char *const sentinel = sentinel_storage;
    char *token = sentinel;
    CHECK_ERR(hipObjGetRdmaToken(NULL, 0, 0, NULL), NI, 0);
    CHECK_ERR(hipObjGetRdmaToken(heap, 4096, 7, NULL), NI, 0);
    CHECK_ERR(hipObjGetRdmaToken(NULL, 0, 0, &token), NI, 0);
    CHECK(token == sentinel);
    CHECK_ERR(hipObjGetRdmaToken(heap, 4096, -1, &token), NI, 0);
    CHECK(token == sentinel);
    CHECK_ERR(hipObjGetRdmaToken(garbage, SIZE_MAX, 2, &token), NI, 0);
    CHECK(token == sentinel);
    CHECK_ERR(hipObjGetRdmaToken(heap, 4096, HIPOBJ_RDMA_OP_PUT, &token), NI,
              0);
    CHECK(token == sentinel);
    CHECK_ERR(hipObjGetRdmaToken(heap, 4096, HIPOBJ_RDMA_OP_GET, &token), NI,
              0);
    CHECK(token == sentinel);
    token = NULL;
    CHECK_ERR(hipObjGetRdmaToken(host, 16, HIPOBJ_RDMA_OP_GET, &token), NI,
              0);
    CHECK(token == NULL);
    CHECK_STR(sentinel_storage, "sentinel");

    free(heap);
}

int main(void)
{
    every_call_is_not_initialized("before any init or shutdown");

    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    every_call_is_not_initialized("after one shutdown");
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    every_call_is_not_initialized("after three shutdowns");
    return CHECK_DONE();
}
