/*
 * fork() after hipObjInit: the child's calls fail at once with
 * hipObjNotInitialized (the instance, its driver thread and its
 * registrations are the parent's), hipObjInit then gives the child an
 * instance of its own, and the parent's instance works on, untouched.
 * The fake library (libhipobj on its fake world).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "hipobj_fake.h"

#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { SIZE = 16384 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A GET of SIZE bytes into buf, byte-exact against object. */
static int get_exact(unsigned char *buf, const unsigned char *object) {
    int get = HIPOBJ_RDMA_OP_GET;
    hipObjOps_t ops = {hipobjFakeSendRequest, hipobjFakeRecvReply};
    memset(buf, 0, SIZE);
    if (hipobjFakeSetObject(object, SIZE) != 0) {
        return 0;
    }
    return hipObjGet(NULL, buf, SIZE, 0, &ops, &get).opError == hipObjSuccess &&
           memcmp(buf, object, SIZE) == 0;
}

static int child(unsigned char *buf, const unsigned char *object) {
    /* A hang fails the test instead of stalling it. */
    alarm(20);
    int get = HIPOBJ_RDMA_OP_GET;
    hipObjOps_t ops = {hipobjFakeSendRequest, hipobjFakeRecvReply};
    double started = now();
    CHECK_ERR(hipObjGet(NULL, buf, SIZE, 0, &ops, &get), hipObjNotInitialized, 0);
    CHECK(now() - started < 2.0);
    CHECK_ERR(hipObjBufRegisterHost(buf, SIZE), hipObjNotInitialized, 0);
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    /* An instance of its own. */
    hipObjConfig_t config = {0};
    config.gpuDevice = 0;
    CHECK_ERR(hipObjInit(&config), hipObjSuccess, 0);
    CHECK_ERR(hipObjBufRegisterHost(buf, SIZE), hipObjSuccess, 0);
    CHECK(get_exact(buf, object));
    CHECK_ERR(hipObjBufDeregister(buf), hipObjSuccess, 0);
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    return CHECK_DONE();
}

int main(void) {
    if (setenv("HIPOBJ_COMPLETION_TIMEOUT_MS", "1000", 1) != 0) {
        return 2;
    }
    unsigned char *buf = calloc(SIZE, 1);
    unsigned char *object = malloc(SIZE);
    CHECK(buf && object);
    if (!buf || !object) {
        return 2;
    }
    for (size_t i = 0; i < SIZE; i++) {
        object[i] = (unsigned char)(i * 13 + 5);
    }
    hipObjConfig_t config = {0};
    config.gpuDevice = 0;
    CHECK_ERR(hipObjInit(&config), hipObjSuccess, 0);
    CHECK_ERR(hipObjBufRegisterHost(buf, SIZE), hipObjSuccess, 0);
    CHECK(get_exact(buf, object));

    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        _exit(child(buf, object));
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status)) {
        CHECK_INT(WEXITSTATUS(status), 0);
    } else if (WIFSIGNALED(status)) {
        fprintf(stderr, "the child died of signal %d\n", WTERMSIG(status));
    }

    /* The parent's instance is untouched by the child. */
    CHECK(get_exact(buf, object));
    CHECK_ERR(hipObjBufDeregister(buf), hipObjSuccess, 0);
    CHECK_ERR(hipObjShutdown(), hipObjSuccess, 0);
    free(buf);
    free(object);
    return CHECK_DONE();
}
