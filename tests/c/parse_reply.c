/* hipObjParseRdmaReply: the x-amz-rdma-reply grammar of spec section 6.
 * Every reply is given with an explicit replyLen, so embedded NULs, bytes
 * past replyLen and replyLen 0 are all exercised. *httpCode is written only
 * on success; NULL reply or httpCode is InvalidValue. */
#include "check.h"

#define UNTOUCHED 0x5eed
#define REJECT 0x7fffffff /* "expected: InvalidValue" */

/* Parses `len` bytes at `reply`; `expected` is the httpCode, or REJECT. */
static void expect(int line, const char *reply, size_t len, int expected)
{
    int code = UNTOUCHED;
    hipObjError_t r = hipObjParseRdmaReply(reply, len, &code);
    char shown[160];
    size_t n = 0;
    for (size_t i = 0; i < len && n + 5 < sizeof shown; i++) {
        unsigned char ch = (unsigned char)reply[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
            shown[n++] = (char)ch;
        } else {
            n += (size_t)snprintf(shown + n, sizeof shown - n, "\\x%02x", ch);
        }
    }
    shown[n] = '\0';
    if (expected == REJECT) {
        if (r.opError != hipObjInvalidValue || r.hipError != 0 ||
            code != UNTOUCHED) {
            fprintf(stderr,
                    "line %d: reply \"%s\" (len %zu): got {%d, %d} code %d, "
                    "expected InvalidValue and httpCode untouched\n",
                    line, shown, len, (int)r.opError, r.hipError, code);
            atomic_fetch_add(&check_failures, 1);
        }
    } else if (r.opError != hipObjSuccess || r.hipError != 0 ||
               code != expected) {
        fprintf(stderr,
                "line %d: reply \"%s\" (len %zu): got {%d, %d} code %d, "
                "expected success with httpCode %d\n",
                line, shown, len, (int)r.opError, r.hipError, code, expected);
        atomic_fetch_add(&check_failures, 1);
    }
}

/* A string literal with its exact length (embedded NULs included). */
#define LIT(s) (s), (sizeof(s) - 1)
#define ACCEPT(s, code) expect(__LINE__, LIT(s), (code))
#define REJECTS(s) expect(__LINE__, LIT(s), REJECT)

/* Writes "<prefix><88 digits of t><suffix>" into buf; returns its length. */
static size_t with_token(char *buf, size_t cap, const char *prefix,
                         const struct test_token *t, int upper,
                         const char *suffix, size_t suffix_len)
{
    char hex[TOKEN_HEX + 1];
    token_hex(t, upper, hex);
    size_t p = strlen(prefix);
    CHECK(p + TOKEN_HEX + suffix_len <= cap);
    memcpy(buf, prefix, p);
    memcpy(buf + p, hex, TOKEN_HEX);
    memcpy(buf + p + TOKEN_HEX, suffix, suffix_len);
    return p + TOKEN_HEX + suffix_len;
}

/* expect() on "<prefix><token><suffix>". */
static void expect_token(int line, const char *prefix,
                         const struct test_token *t, int upper,
                         const char *suffix, size_t suffix_len, int expected)
{
    char buf[256];
    size_t len = with_token(buf, sizeof buf, prefix, t, upper, suffix,
                            suffix_len);
    expect(line, buf, len, expected);
}

static void token_forms(void)
{
    char buf[256];
    size_t len = 0;
    struct test_token rc = token_with_ipv4(192, 0, 2, 1);
    struct test_token dc = rc;
    dc.transport = 0x00;
    struct test_token all_ff;
    memset(&all_ff, 0xff, sizeof all_ff);
    all_ff.transport = 0x01;

    /* 200:<token>, any case, either known transport -> 200. */
    for (int upper = 0; upper < 3; upper++) {
        expect_token(__LINE__, "200:", &rc, upper, "", 0, 200);
        expect_token(__LINE__, "200:", &dc, upper, "", 0, 200);
        expect_token(__LINE__, "200:", &all_ff, upper, "", 0, 200);
    }
    /* Trailing NUL/CR/LF after the token are ignored. */
    expect_token(__LINE__, "200:", &rc, 0, "\r\n", 2, 200);
    expect_token(__LINE__, "200:", &rc, 0, "\0\0\0", 3, 200);
    expect_token(__LINE__, "200:", &rc, 1, "\n\r\0\n", 4, 200);
    /* Bytes past replyLen are not read. */
    len = with_token(buf, sizeof buf, "200:", &rc, 0, "garbage", 7);
    expect(__LINE__, buf, len - 7, 200);
    /* One digit short (replyLen cuts it) or one too many. */
    expect(__LINE__, buf, len - 8, REJECT);
    len = with_token(buf, sizeof buf, "200:", &rc, 0, "0", 1);
    expect(__LINE__, buf, len, REJECT);
    len = with_token(buf, sizeof buf, "200:", &rc, 0, "", 0);
    buf[4 + 40] = 'g'; /* a non-hex digit */
    expect(__LINE__, buf, len, REJECT);
    len = with_token(buf, sizeof buf, "200:", &rc, 0, "", 0);
    buf[4 + 40] = '\0'; /* an embedded NUL inside the token */
    expect(__LINE__, buf, len, REJECT);
    len = with_token(buf, sizeof buf, "200:", &rc, 0, " ", 1);
    expect(__LINE__, buf, len, REJECT); /* trailing space */
    len = with_token(buf, sizeof buf, "200:", &rc, 0, "\r\nx", 3);
    expect(__LINE__, buf, len, REJECT); /* bytes after the trailer */

    /* Unknown transport bytes. */
    const uint8_t bad_transports[] = {0x02, 0x03, 0x10, 0x7f, 0x80, 0xff};
    for (size_t i = 0; i < sizeof bad_transports; i++) {
        struct test_token t = rc;
        t.transport = bad_transports[i];
        for (int upper = 0; upper < 2; upper++) {
            expect_token(__LINE__, "200:", &t, upper, "", 0, REJECT);
        }
    }

    /* A token after any status but 200, or in the wrong place. */
    const char *prefixes[] = {"204:", "206:", "201:", "501:", "100:",
                              "599:", "ok:",  "err:", "200",  "200::",
                              "200: ", " 200:", "2000:", "0200:", "OK:",
                              "200;",  ":",    ""};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        expect_token(__LINE__, prefixes[i], &rc, 0, "", 0, REJECT);
    }
}

int main(void)
{
    /* ---- Accepted forms (spec table) and their codes. */
    ACCEPT("ok", 200);
    ACCEPT("err", -1);
    ACCEPT("100", 100);
    ACCEPT("101", 101);
    ACCEPT("200", 200);
    ACCEPT("204", 204);
    ACCEPT("206", 206);
    ACCEPT("404", 404);
    ACCEPT("500", 500);
    ACCEPT("501", HIPOBJ_RDMA_REPLY_NOT_IMPLEMENTED);
    ACCEPT("599", 599);
    for (int n = 100; n <= 599; n++) {
        char s[8];
        snprintf(s, sizeof s, "%d", n);
        expect(__LINE__, s, 3, n);
        snprintf(s, sizeof s, "%d\r\n", n);
        expect(__LINE__, s, 5, n);
    }

    /* ---- Trailing NUL, CR and LF are ignored, in any mix. */
    ACCEPT("ok\0", 200);
    ACCEPT("ok\r", 200);
    ACCEPT("ok\n", 200);
    ACCEPT("ok\r\n", 200);
    ACCEPT("ok\r\n\0\0\0", 200);
    ACCEPT("ok\n\n\r\r\0\n", 200);
    ACCEPT("err\r\n", -1);
    ACCEPT("err\0", -1);
    ACCEPT("404\n", 404);
    ACCEPT("200\0\0\0\0\0\0\0\0", 200);

    /* ---- Only replyLen bytes are read. */
    expect(__LINE__, "okay", 2, 200);
    expect(__LINE__, "2001", 3, 200);
    expect(__LINE__, "err!", 3, -1);
    expect(__LINE__, "ok\r\nXYZ", 4, 200);
    expect(__LINE__, "404 Not Found", 3, 404);
    expect(__LINE__, "ok", 1, REJECT);   /* "o" */
    expect(__LINE__, "200", 2, REJECT);  /* "20" */
    expect(__LINE__, "ok", 0, REJECT);   /* replyLen 0 is empty */
    expect(__LINE__, "", 0, REJECT);

    /* A full 512-byte receive buffer: "ok" then NULs. */
    char big[512];
    memset(big, 0, sizeof big);
    memcpy(big, "ok", 2);
    expect(__LINE__, big, sizeof big, 200);
    memset(big, '\n', sizeof big);
    memcpy(big, "206", 3);
    expect(__LINE__, big, sizeof big, 206);
    memset(big, 'o', sizeof big);
    expect(__LINE__, big, sizeof big, REJECT);

    /* ---- Rejected forms: the spec's examples and more. */
    REJECTS("");
    REJECTS("\0");
    REJECTS("\r\n");
    REJECTS("\0\r\n");
    REJECTS("OK");
    REJECTS("Ok");
    REJECTS("oK");
    REJECTS("ERR");
    REJECTS("Err");
    REJECTS("okay");
    REJECTS("ok ");
    REJECTS(" ok");
    REJECTS("ok\t");
    REJECTS("err ");
    REJECTS("o");
    REJECTS("k");
    REJECTS("er");
    REJECTS("error");
    REJECTS("0200");
    REJECTS("2000");
    REJECTS("099");
    REJECTS("000");
    REJECTS("001");
    REJECTS("600");
    REJECTS("999");
    REJECTS("20");
    REJECTS("2");
    REJECTS("+200");
    REJECTS("-200");
    REJECTS("-1");
    REJECTS("+1");
    REJECTS("200 ");
    REJECTS(" 200");
    REJECTS("2 0");
    REJECTS("2 00");
    REJECTS("20 0");
    REJECTS("\t200");
    REJECTS("\n200");
    REJECTS("\r\n200");
    REJECTS("\0ok");
    REJECTS("0x1");
    REJECTS("1e2");
    REJECTS("200.");
    REJECTS("2OO");
    REJECTS("ok\0x");    /* embedded NUL inside replyLen */
    REJECTS("o\0k");
    REJECTS("2\0" "00");
    REJECTS("200\0" "1");
    REJECTS("err\r\nx");
    REJECTS("ok\nok");
    REJECTS("okok");
    REJECTS("200:");
    REJECTS("200:\r\n");
    REJECTS("200:ok");

    token_forms();

    /* ---- NULL arguments: InvalidValue, *httpCode untouched. */
    int code = UNTOUCHED;
    CHECK_ERR(hipObjParseRdmaReply(NULL, 2, &code), hipObjInvalidValue, 0);
    CHECK_INT(code, UNTOUCHED);
    CHECK_ERR(hipObjParseRdmaReply(NULL, 0, &code), hipObjInvalidValue, 0);
    CHECK_INT(code, UNTOUCHED);
    CHECK_ERR(hipObjParseRdmaReply("ok", 2, NULL), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjParseRdmaReply("ok", 0, NULL), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjParseRdmaReply(NULL, 0, NULL), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjParseRdmaReply(NULL, 512, NULL), hipObjInvalidValue, 0);

    /* And a success still overwrites a previous value. */
    code = UNTOUCHED;
    CHECK_ERR(hipObjParseRdmaReply("err", 3, &code), hipObjSuccess, 0);
    CHECK_INT(code, -1);
    return CHECK_DONE();
}
