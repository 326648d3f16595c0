/* The [C] functions (needing no initialized library) called from several
 * threads at once give the answers they give on one thread; the other
 * functions keep returning NotInitialized meanwhile. */
#include "check.h"

#include <pthread.h>
#include <stdlib.h>

#define THREADS 8
#define ROUNDS 2000

static pthread_barrier_t start;

/* Answers computed once on the main thread before any thread starts. */
static const char *error_strings[16];
static char version[32];
static char mapped_token[TOKEN_HEX + 1];
static char plain_token[TOKEN_HEX + 1];
static char bad_token[TOKEN_HEX + 1];
static char token_reply[4 + TOKEN_HEX + 1];

struct reply_case {
    const char *text;
    size_t len;
    int rc;   /* expected opError */
    int code; /* expected httpCode on success */
};

static const struct reply_case replies[] = {
    {"ok", 2, hipObjSuccess, 200},
    {"err\r\n", 5, hipObjSuccess, -1},
    {"206", 3, hipObjSuccess, 206},
    {"501\0", 4, hipObjSuccess, 501},
    {"OK", 2, hipObjInvalidValue, 0},
    {"600", 3, hipObjInvalidValue, 0},
    {"ok\0x", 4, hipObjInvalidValue, 0},
    {"", 0, hipObjInvalidValue, 0},
};

static void *worker(void *arg)
{
    long id = (long)arg;
    pthread_barrier_wait(&start);
    for (int round = 0; round < ROUNDS; round++) {
        int code = (int)((round + id) % 16) - 1; /* -1..14 */
        const char *s = hipObjGetErrorString((hipObjOpError_t)code);
        CHECK_STR(s, error_strings[code + 1]);
        CHECK_STR(hipObjGetVersionString(), version);

        int major = -1, minor = -1, patch = -1;
        CHECK_ERR(hipObjGetVersion(&major, &minor, &patch), hipObjSuccess, 0);
        CHECK(major == HIPOBJ_VERSION_MAJOR && minor == HIPOBJ_VERSION_MINOR &&
              patch == HIPOBJ_VERSION_PATCH);
        CHECK_ERR(hipObjGetVersion(NULL, &minor, &patch), hipObjInvalidValue,
                  0);

        const struct reply_case *c =
            &replies[(size_t)(round + id) % (sizeof replies / sizeof *replies)];
        int http = 0x5eed;
        CHECK_ERR(hipObjParseRdmaReply(c->text, c->len, &http), c->rc, 0);
        CHECK_INT(http, c->rc == hipObjSuccess ? c->code : 0x5eed);
        http = 0x5eed;
        CHECK_ERR(hipObjParseRdmaReply(token_reply, sizeof token_reply - 1,
                                       &http),
                  hipObjSuccess, 0);
        CHECK_INT(http, 200);

        char ip[16];
        memset(ip, 'X', sizeof ip);
        CHECK_ERR(hipObjTokenClientNic(mapped_token, ip, sizeof ip),
                  hipObjSuccess, 0);
        CHECK_STR(ip, "203.0.113.77");
        memset(ip, 'X', sizeof ip);
        CHECK_ERR(hipObjTokenClientNic(plain_token, ip, sizeof ip),
                  hipObjSuccess, 0);
        CHECK_STR(ip, "");
        memset(ip, 'X', sizeof ip);
        CHECK_ERR(hipObjTokenClientNic(bad_token, ip, sizeof ip),
                  hipObjInvalidValue, 0);
        CHECK_INT(ip[0], 0);
        memset(ip, 'X', sizeof ip);
        CHECK_ERR(hipObjTokenClientNic(mapped_token, ip, 12),
                  hipObjInvalidValue, 0);
        CHECK_INT(ip[0], 0);

        char *owned = strdup(mapped_token);
        CHECK(owned != NULL);
        CHECK_ERR(hipObjPutRdmaToken(owned), hipObjSuccess, 0);
        CHECK_ERR(hipObjPutRdmaToken(NULL), hipObjInvalidValue, 0);

        /* Not-[C] functions: still NotInitialized, from any thread. */
        char *token = mapped_token;
        CHECK_ERR(hipObjGetRdmaToken(mapped_token, 16, 0, &token),
                  hipObjNotInitialized, 0);
        CHECK(token == mapped_token);
        CHECK_ERR(hipObjBufDeregister(mapped_token), hipObjNotInitialized, 0);
        if (atomic_load(&check_failures) > 50) {
            break; /* enough noise */
        }
    }
    return NULL;
}

int main(void)
{
    for (int code = -1; code <= 14; code++) {
        error_strings[code + 1] = hipObjGetErrorString((hipObjOpError_t)code);
        CHECK(error_strings[code + 1] != NULL);
    }
    CHECK_STR(error_strings[0], "Unknown error");
    CHECK_STR(error_strings[15], "Unknown error");
    snprintf(version, sizeof version, "%s", hipObjGetVersionString());

    struct test_token t = token_with_ipv4(203, 0, 113, 77);
    token_hex(&t, 0, mapped_token);
    memcpy(token_reply, "200:", 4);
    token_hex(&t, 1, token_reply + 4);
    t.gid[10] = 0;
    token_hex(&t, 0, plain_token);
    t.transport = 0x03; /* unknown: 0x00-0x02 are defined */
    token_hex(&t, 0, bad_token);

    CHECK_INT(pthread_barrier_init(&start, NULL, THREADS), 0);
    pthread_t threads[THREADS];
    for (long i = 0; i < THREADS; i++) {
        CHECK_INT(pthread_create(&threads[i], NULL, worker, (void *)i), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        CHECK_INT(pthread_join(threads[i], NULL), 0);
    }
    pthread_barrier_destroy(&start);

    /* The main thread's answers did not change. */
    for (int code = -1; code <= 14; code++) {
        CHECK_STR(hipObjGetErrorString((hipObjOpError_t)code),
                  error_strings[code + 1]);
    }
    CHECK_STR(hipObjGetVersionString(), version);
    return CHECK_DONE();
}
