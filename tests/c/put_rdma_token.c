/* hipObjPutRdmaToken [C]: NULL is InvalidValue; any malloc'ed string is
 * released with free() and gives success, without an initialized library
 * (spec section 4, row 11). */
#include "check.h"

#include <stdlib.h>

int main(void)
{
    CHECK_ERR(hipObjPutRdmaToken(NULL), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjPutRdmaToken(NULL), hipObjInvalidValue, 0);

    /* A token-shaped string, as hipObjGetRdmaToken would return. */
    struct test_token t = token_with_ipv4(192, 0, 2, 1);
    char *token = malloc(TOKEN_HEX + 1);
    CHECK(token != NULL);
    token_hex(&t, 0, token);
    CHECK_ERR(hipObjPutRdmaToken(token), hipObjSuccess, 0);

    /* Other malloc'ed strings: empty, short, long; and strdup. */
    char *empty = malloc(1);
    CHECK(empty != NULL);
    empty[0] = '\0';
    CHECK_ERR(hipObjPutRdmaToken(empty), hipObjSuccess, 0);
    char *dup = strdup("not even a token");
    CHECK(dup != NULL);
    CHECK_ERR(hipObjPutRdmaToken(dup), hipObjSuccess, 0);
    char *big = malloc(1 << 20);
    CHECK(big != NULL);
    memset(big, 'a', (1 << 20) - 1);
    big[(1 << 20) - 1] = '\0';
    CHECK_ERR(hipObjPutRdmaToken(big), hipObjSuccess, 0);

    /* Many allocations and releases: the allocator stays consistent (a
     * wrong free would crash or corrupt the heap here). */
    for (int i = 0; i < 10000; i++) {
        char *s = malloc((size_t)(i % 200) + 1);
        CHECK(s != NULL);
        s[0] = '\0';
        CHECK_ERR(hipObjPutRdmaToken(s), hipObjSuccess, 0);
    }
    void *after = malloc(64);
    CHECK(after != NULL);
    free(after);
    return CHECK_DONE();
}
