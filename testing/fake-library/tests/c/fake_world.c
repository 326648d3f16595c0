/*
 * The C API on an initialized library: the fake library (libhipobj on its
 * fake world), whose S3 test server the callbacks below reach through the
 * controls of hipobj_fake.h. Covers the argument rules
 * that need an instance, GET and PUT byte-exact through hipObjOps_t, and
 * the application-driven path.
 */
#include "check.h"
#include "hipobj_fake.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { SIZE = 65536 };

static int calls;

static int counting_send(void *ctx, const char *token, size_t len) {
    calls++;
    return hipobjFakeSendRequest(ctx, token, len);
}

static int counting_recv(void *ctx, char *reply, size_t *len) {
    calls++;
    return hipobjFakeRecvReply(ctx, reply, len);
}

static int failing_send(void *ctx, const char *token, size_t len) {
    (void)ctx;
    (void)token;
    (void)len;
    return 42;
}

int main(void) {
    if (setenv("HIPOBJ_COMPLETION_TIMEOUT_MS", "500", 1) != 0) {
        return 2;
    }
    hipObjConfig_t config = {0};
    config.gpuDevice = 0;
    CHECK_ERR(hipObjInit(&config), hipObjSuccess, 0);
    CHECK_ERR(hipObjInit(&config), hipObjAlreadyInitialized, 0);

    unsigned char *buf = calloc(SIZE, 1);
    unsigned char *object = malloc(SIZE);
    unsigned char *seen = malloc(SIZE);
    CHECK(buf && object && seen);
    if (!buf || !object || !seen) {
        return 2;
    }
    for (size_t i = 0; i < SIZE; i++) {
        object[i] = (unsigned char)(i * 7 + 3);
    }
    CHECK(hipobjFakeSetObject(object, SIZE) == 0);

    /* Registration rules. */
    CHECK_ERR(hipObjBufRegisterHost(NULL, SIZE), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjBufRegisterHost(buf, 0), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjBufRegisterHost(buf, (size_t)4294967296ULL + 1), hipObjSizeTooLarge, 0);
    CHECK_ERR(hipObjBufRegisterHost(buf, SIZE), hipObjSuccess, 0);
    CHECK_ERR(hipObjBufRegisterHost(buf, SIZE), hipObjBufAlreadyRegistered, 0);

    /* Transfer rules, in order, with no callback called. */
    int get = HIPOBJ_RDMA_OP_GET, put = HIPOBJ_RDMA_OP_PUT;
    hipObjOps_t ops = {counting_send, counting_recv};
    hipObjOps_t half = {counting_send, NULL};
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 0, NULL, &get), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 0, &half, &get), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjGet(NULL, NULL, SIZE, 0, &ops, &get), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjGet(NULL, buf, 0, 0, &ops, &get), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjGet(NULL, buf, 1, -1, &ops, &get), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjGet(NULL, buf + 1, 1, 0, &ops, &get), hipObjBufNotRegistered, 0);
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 1, &ops, &get), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjPut(NULL, buf, 1, SIZE, &ops, &put), hipObjInvalidValue, 0);
    CHECK_INT(calls, 0);

    /* GET and PUT, byte-exact. */
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 0, &ops, &get), hipObjSuccess, 0);
    CHECK_INT(calls, 2);
    CHECK(memcmp(buf, object, SIZE) == 0);
    for (size_t i = 0; i < SIZE; i++) {
        buf[i] = (unsigned char)(255 - i % 256);
    }
    CHECK_ERR(hipObjPut(NULL, buf, SIZE / 2, SIZE / 2, &ops, &put), hipObjSuccess, 0);
    CHECK(hipobjFakeGetObject(seen, SIZE / 2) == 0);
    CHECK(memcmp(seen, buf + SIZE / 2, SIZE / 2) == 0);

    /* A failing callback is an S3 error; the library stays usable. */
    hipObjOps_t failing = {failing_send, counting_recv};
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 0, &failing, &get), hipObjS3Error, 0);
    CHECK(hipobjFakeSetObject(object, SIZE) == 0);
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 0, &ops, &get), hipObjSuccess, 0);
    CHECK(memcmp(buf, object, SIZE) == 0);

    /* The application-driven path. */
    char *token = NULL;
    CHECK_ERR(hipObjGetRdmaToken(buf, SIZE, 5, &token), hipObjInvalidValue, 0);
    CHECK(token == NULL);
    CHECK_ERR(hipObjGetRdmaToken(buf, SIZE, HIPOBJ_RDMA_OP_GET, &token), hipObjSuccess, 0);
    CHECK(token != NULL && strlen(token) == 88);
    char ip[16];
    CHECK_ERR(hipObjTokenClientNic(token, ip, sizeof ip), hipObjSuccess, 0);
    CHECK_STR(ip, "192.0.2.1");
    memset(buf, 0, SIZE);
    CHECK_INT(hipobjFakeServe(token, HIPOBJ_RDMA_OP_GET), 200);
    CHECK_ERR(hipObjBufSync(buf, SIZE, 0, HIPOBJ_SYNC_TO_DEVICE), hipObjSuccess, 0);
    CHECK(memcmp(buf, object, SIZE) == 0);
    CHECK_ERR(hipObjPutRdmaToken(token), hipObjSuccess, 0);

    /* As the original's clients do it: the token copied into the request's
     * header with the address and size appended ("%s:%016lx:%016lx"), and
     * released at once, before the request is sent. */
    char header[TOKEN_HEX + 40];
    token = NULL;
    CHECK_ERR(hipObjGetRdmaToken(buf, SIZE, HIPOBJ_RDMA_OP_GET, &token), hipObjSuccess, 0);
    CHECK(token != NULL);
    if (token == NULL) {
        return CHECK_DONE();
    }
    int written = snprintf(header, sizeof header, "%s:%016lx:%016lx", token,
                           (unsigned long)(uintptr_t)buf, (unsigned long)SIZE);
    CHECK_INT(written, TOKEN_HEX + 34);
    CHECK_ERR(hipObjPutRdmaToken(token), hipObjSuccess, 0);
    memset(buf, 0, SIZE);
    CHECK(hipobjFakeSetObject(object, SIZE) == 0);
    CHECK_INT(hipobjFakeServe(header, HIPOBJ_RDMA_OP_GET), 200);
    CHECK_ERR(hipObjBufSync(buf, SIZE, 0, HIPOBJ_SYNC_TO_DEVICE), hipObjSuccess, 0);
    CHECK(memcmp(buf, object, SIZE) == 0);

    /* Fake GPU memory: registered as GPU memory, filled by a GET, read
     * back through the fake runtime's copy. */
    unsigned char *dev = hipobjFakeDeviceAlloc(SIZE);
    CHECK(dev != NULL);
    CHECK(hipobjFakeDeviceAlloc(0) == NULL);
    CHECK_ERR(hipObjBufRegister(dev, SIZE), hipObjSuccess, 0);
    CHECK(hipobjFakeSetObject(object, SIZE) == 0);
    CHECK_ERR(hipObjGet(NULL, dev, SIZE, 0, &ops, &get), hipObjSuccess, 0);
    memset(seen, 0, SIZE);
    CHECK(hipobjFakeDeviceRead(seen, dev, SIZE) == 0);
    CHECK(memcmp(seen, object, SIZE) == 0);
    CHECK(hipobjFakeDeviceWrite(dev, buf, SIZE) == 0);
    CHECK_ERR(hipObjPut(NULL, dev, SIZE, 0, &ops, &put), hipObjSuccess, 0);
    CHECK(hipobjFakeGetObject(seen, SIZE) == 0);
    CHECK(memcmp(seen, buf, SIZE) == 0);
    CHECK(hipobjFakeDeviceRead(seen, dev, SIZE + 1) == -1);
    CHECK_ERR(hipObjBufDeregister(dev), hipObjSuccess, 0);
    CHECK(hipobjFakeDeviceFree(dev) == 0);
    CHECK(hipobjFakeDeviceFree(dev) == -1);

    CHECK_ERR(hipObjBufDeregister(buf), hipObjSuccess, 0);
    CHECK_ERR(hipObjBufDeregister(buf), hipObjBufNotRegistered, 0);
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 0, &ops, &get), hipObjNotInitialized, 0);
    free(buf);
    free(object);
    free(seen);
    return CHECK_DONE();
}
