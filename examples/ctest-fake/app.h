/*
 * A small application library that moves objects with libhipobj: what an
 * application's own code looks like, and what its tests (test_app.c) drive
 * against the fake libhipobj.
 *
 * The application has an S3 client of its own (struct app_s3): it sends a
 * request that carries the token, reads the reply, and can also do a plain
 * GET or PUT. app_get and app_put try RDMA first and fall back to the
 * plain request when the server declines it (hipObjS3Error).
 */
#ifndef APP_H
#define APP_H

#include <stddef.h>

struct app_s3 {
    /* Sends the request for `key` with `token` (op: HIPOBJ_RDMA_OP_GET or
     * HIPOBJ_RDMA_OP_PUT); 0 on success. */
    int (*send)(void *self, int op, const char *key, const char *token, size_t len);
    /* The x-amz-rdma-reply of the last request; 0 on success. */
    int (*reply)(void *self, char *reply, size_t *len);
    /* A plain GET or PUT of `len` bytes at `buf`; 0 on success. */
    int (*plain)(void *self, int op, const char *key, void *buf, size_t len);
    void *self;
};

/* How a transfer went. */
enum app_path { APP_FAILED = 0, APP_RDMA = 1, APP_PLAIN = 2 };

/* Starts libhipobj (GPU 0); 0 on success. */
int app_start(void);
/* Stops it. */
void app_stop(void);
/* Reads object `key` into `buf` (len bytes, registered for the call). */
enum app_path app_get(struct app_s3 *s3, const char *key, void *buf, size_t len);
/* Writes `len` bytes of `buf` as object `key`. */
enum app_path app_put(struct app_s3 *s3, const char *key, void *buf, size_t len);
/* The last libhipobj error, as hipObjGetErrorString names it. */
const char *app_last_error(void);

#endif
