#include "app.h"

#include <hipobj.h>

static hipObjOpError_t last_error = hipObjSuccess;

struct call {
    struct app_s3 *s3;
    int op;
    const char *key;
};

static int send_request(void *ctx, const char *token, size_t len) {
    struct call *call = ctx;
    return call->s3->send(call->s3->self, call->op, call->key, token, len);
}

static int recv_reply(void *ctx, char *reply, size_t *len) {
    struct call *call = ctx;
    return call->s3->reply(call->s3->self, reply, len);
}

int app_start(void) {
    hipObjConfig_t config = {0};
    config.gpuDevice = 0;
    hipObjError_t e = hipObjInit(&config);
    last_error = e.opError;
    return e.opError == hipObjSuccess ? 0 : -1;
}

void app_stop(void) {
    hipObjShutdown();
}

const char *app_last_error(void) {
    return hipObjGetErrorString(last_error);
}

static enum app_path transfer(struct app_s3 *s3, int op, const char *key, void *buf, size_t len) {
    hipObjError_t e = hipObjBufRegisterHost(buf, len);
    last_error = e.opError;
    if (e.opError != hipObjSuccess) {
        return APP_FAILED;
    }
    struct call call = {s3, op, key};
    hipObjOps_t ops = {send_request, recv_reply};
    e = op == HIPOBJ_RDMA_OP_GET ? hipObjGet(NULL, buf, len, 0, &ops, &call)
                                 : hipObjPut(NULL, buf, len, 0, &ops, &call);
    last_error = e.opError;
    enum app_path path = APP_RDMA;
    if (e.opError == hipObjS3Error) {
        /* The server declined RDMA (or the request failed): plain HTTP. */
        path = s3->plain(s3->self, op, key, buf, len) == 0 ? APP_PLAIN : APP_FAILED;
    } else if (e.opError != hipObjSuccess) {
        path = APP_FAILED;
    }
    hipObjBufDeregister(buf);
    return path;
}

enum app_path app_get(struct app_s3 *s3, const char *key, void *buf, size_t len) {
    return transfer(s3, HIPOBJ_RDMA_OP_GET, key, buf, len);
}

enum app_path app_put(struct app_s3 *s3, const char *key, void *buf, size_t len) {
    return transfer(s3, HIPOBJ_RDMA_OP_PUT, key, buf, len);
}
