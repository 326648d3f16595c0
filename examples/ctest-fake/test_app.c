/*
 * The application's tests, on the fake libhipobj (hipobj_fake.h): its S3
 * client is replaced by one that hands tokens to the fake world's S3
 * server, and the server and the platform are told how to misbehave.
 * One test per run: test_app success|declined|verbs_failure|timeout.
 */
#include "app.h"

#include <hipobj.h>
#include <hipobj_fake.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SIZE = 1 << 20 };

static int failures;
#define EXPECT(cond)                                                            \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                         \
        }                                                                       \
    } while (0)

/* The test's S3 client: tokens go to the fake server; the plain path is
 * the object store itself, as a plain GET or PUT would reach it. */
struct fake_s3 {
    int op;
    int plain_calls;
};

static int fake_send(void *self, int op, const char *key, const char *token, size_t len) {
    struct fake_s3 *s3 = self;
    (void)key;
    s3->op = op;
    return hipobjFakeSendRequest(&s3->op, token, len);
}

static int fake_reply(void *self, char *reply, size_t *len) {
    return hipobjFakeRecvReply(self, reply, len);
}

static int fake_plain(void *self, int op, const char *key, void *buf, size_t len) {
    struct fake_s3 *s3 = self;
    (void)key;
    s3->plain_calls++;
    return op == HIPOBJ_RDMA_OP_GET ? hipobjFakeGetObject(buf, len) : hipobjFakeSetObject(buf, len);
}

static unsigned char *pattern(size_t len, unsigned seed) {
    unsigned char *p = malloc(len);
    for (size_t i = 0; p != NULL && i < len; i++) {
        p[i] = (unsigned char)(i * 31 + seed);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s success|declined|verbs_failure|timeout\n", argv[0]);
        return 2;
    }
    const char *test = argv[1];
    struct fake_s3 fake = {0, 0};
    struct app_s3 s3 = {fake_send, fake_reply, fake_plain, &fake};
    unsigned char *object = pattern(SIZE, 7);
    unsigned char *buf = calloc(SIZE, 1);
    if (object == NULL || buf == NULL) {
        return 2;
    }
    long mrs = hipobjFakeLiveObjects("mr");
    EXPECT(app_start() == 0);
    EXPECT(hipobjFakeSetObject(object, SIZE) == 0);

    if (strcmp(test, "success") == 0) {
        /* GET by RDMA, byte-exact; then a PUT of other bytes. */
        EXPECT(app_get(&s3, "k", buf, SIZE) == APP_RDMA);
        EXPECT(memcmp(buf, object, SIZE) == 0);
        unsigned char *other = pattern(SIZE, 99);
        EXPECT(app_put(&s3, "k", other, SIZE) == APP_RDMA);
        EXPECT(hipobjFakeGetObject(buf, SIZE) == 0 && memcmp(buf, other, SIZE) == 0);
        EXPECT(fake.plain_calls == 0);
        EXPECT(hipobjFakeRequests() == 2);
        free(other);
    } else if (strcmp(test, "declined") == 0) {
        /* A server that declines RDMA: the application falls back. */
        EXPECT(hipobjFakeSetServerBehaviour(HIPOBJ_FAKE_SERVER_DECLINE) == 0);
        EXPECT(app_get(&s3, "k", buf, SIZE) == APP_PLAIN);
        EXPECT(strcmp(app_last_error(), hipObjGetErrorString(hipObjS3Error)) == 0);
        EXPECT(memcmp(buf, object, SIZE) == 0);
        EXPECT(fake.plain_calls == 1);
        EXPECT(hipobjFakeSetServerBehaviour(42) == -1);
    } else if (strcmp(test, "verbs_failure") == 0) {
        /* The NIC refuses to register the buffer: the transfer fails with
         * an RDMA error before any request, and the next one works. */
        EXPECT(hipobjFakeFailCall("ibv_reg_mr", 1) == 0);
        EXPECT(hipobjFakeFailCall("ibv_no_such_call", 1) == -1);
        EXPECT(app_get(&s3, "k", buf, SIZE) == APP_FAILED);
        EXPECT(strcmp(app_last_error(), hipObjGetErrorString(hipObjRdmaError)) == 0);
        EXPECT(hipobjFakeRequests() == 0);
        hipobjFakeClearFaults();
        EXPECT(app_get(&s3, "k", buf, SIZE) == APP_RDMA);
        EXPECT(memcmp(buf, object, SIZE) == 0);
    } else if (strcmp(test, "timeout") == 0) {
        /* A server that never sends its final message: the transfer ends
         * at HIPOBJ_COMPLETION_TIMEOUT_MS (set by CMakeLists.txt). */
        EXPECT(hipobjFakeSetServerBehaviour(HIPOBJ_FAKE_SERVER_NO_FINAL) == 0);
        EXPECT(app_get(&s3, "k", buf, SIZE) == APP_FAILED);
        EXPECT(strcmp(app_last_error(), hipObjGetErrorString(hipObjRdmaError)) == 0);
        EXPECT(hipobjFakeSetServerBehaviour(HIPOBJ_FAKE_SERVER_NORMAL) == 0);
        EXPECT(app_get(&s3, "k", buf, SIZE) == APP_RDMA);
    } else {
        fprintf(stderr, "unknown test %s\n", test);
        return 2;
    }
    app_stop();
    /* Nothing registered is left (the fake server keeps its own store). */
    EXPECT(hipobjFakeLiveObjects("mr") == mrs);
    free(object);
    free(buf);
    if (failures == 0) {
        printf("%s: ok\n", test);
    }
    return failures == 0 ? 0 : 1;
}
