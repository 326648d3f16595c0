/*
 * check.h: the tiny test harness shared by the C programs in tests/c.
 *
 * Include it first (it sets the POSIX feature level). CHECK* macros report
 * a failure on stderr with file, line and the values involved, count it and
 * carry on; main() ends with `return CHECK_DONE();`, which exits non-zero
 * if anything failed. The counter is atomic, so threads may CHECK too.
 *
 * It also builds x-amz-rdma-tokens by hand, field by field, as section 5 of
 * the ABI spec lays them out, so that no test depends on the library's own
 * encoder.
 */
#ifndef HIPOBJ_TEST_CHECK_H
#define HIPOBJ_TEST_CHECK_H

#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <hipobj.h>

static atomic_int check_failures;

#define CHECK_FAIL_(...)                                                  \
    do {                                                                  \
        fprintf(stderr, "%s:%d: CHECK failed: ", __FILE__, __LINE__);     \
        fprintf(stderr, __VA_ARGS__);                                     \
        fputc('\n', stderr);                                              \
        atomic_fetch_add(&check_failures, 1);                             \
    } while (0)

/* A condition that must hold. */
#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            CHECK_FAIL_("%s", #cond);                                     \
        }                                                                 \
    } while (0)

/* Two integers (as long long) that must be equal. */
#define CHECK_INT(actual, expected)                                       \
    do {                                                                  \
        long long check_a_ = (long long)(actual);                         \
        long long check_e_ = (long long)(expected);                       \
        if (check_a_ != check_e_) {                                       \
            CHECK_FAIL_("%s == %lld, expected %s == %lld", #actual,       \
                        check_a_, #expected, check_e_);                   \
        }                                                                 \
    } while (0)

/* Two C strings that must be equal; NULL is reported, never dereferenced. */
#define CHECK_STR(actual, expected)                                       \
    do {                                                                  \
        const char *check_a_ = (actual);                                  \
        const char *check_e_ = (expected);                                \
        if (check_a_ == NULL || strcmp(check_a_, check_e_) != 0) {        \
            CHECK_FAIL_("%s == \"%s\", expected \"%s\"", #actual,         \
                        check_a_ ? check_a_ : "(NULL)", check_e_);        \
        }                                                                 \
    } while (0)

/* A hipObjError_t that must be exactly { op, hip }. */
#define CHECK_ERR(call, op, hip)                                          \
    do {                                                                  \
        hipObjError_t check_r_ = (call);                                  \
        if ((int)check_r_.opError != (int)(op) ||                         \
            check_r_.hipError != (hip)) {                                 \
            CHECK_FAIL_("%s returned {%d (%s), hipError %d}, "            \
                        "expected {%d (%s), hipError %d}",                \
                        #call, (int)check_r_.opError,                     \
                        hipObjGetErrorString(check_r_.opError),           \
                        check_r_.hipError, (int)(op),                     \
                        hipObjGetErrorString(op), (int)(hip));            \
        }                                                                 \
    } while (0)

/* What main() returns: 0 if every CHECK held. */
#define CHECK_DONE()                                                      \
    (atomic_load(&check_failures) == 0                                    \
         ? 0                                                              \
         : (fprintf(stderr, "%s: %d check(s) failed\n", __FILE__,         \
                    atomic_load(&check_failures)),                        \
            1))

/* ---- Tokens (ABI spec section 5) ---- */

#define TOKEN_BYTES 44
#define TOKEN_HEX 88

/* The fields of a token, before serialization. */
struct test_token {
    uint8_t transport;
    uint32_t qp_num;
    uint8_t gid[16];
    uint32_t rkey;
    uint64_t addr;
    uint64_t length;
    uint8_t port;
    uint16_t lid;
};

static inline void put_le_(uint8_t *out, uint64_t value, int bytes)
{
    for (int i = 0; i < bytes; i++) {
        out[i] = (uint8_t)(value >> (8 * i));
    }
}

/* Serializes `t` field by field, little-endian, at the spec's offsets. */
static inline void token_bytes(const struct test_token *t,
                               uint8_t out[TOKEN_BYTES])
{
    out[0] = t->transport;
    put_le_(out + 1, t->qp_num, 4);
    memcpy(out + 5, t->gid, 16);
    put_le_(out + 21, t->rkey, 4);
    put_le_(out + 25, t->addr, 8);
    put_le_(out + 33, t->length, 8);
    out[41] = t->port;
    put_le_(out + 42, t->lid, 2);
}

/* Hex-encodes `t` into `out` (89 bytes: 88 digits and a NUL); `upper`
 * selects the case: 0 lower, 1 upper, 2 alternating. */
static inline void token_hex(const struct test_token *t, int upper,
                             char out[TOKEN_HEX + 1])
{
    static const char lower_digits[] = "0123456789abcdef";
    static const char upper_digits[] = "0123456789ABCDEF";
    uint8_t raw[TOKEN_BYTES];
    token_bytes(t, raw);
    for (int i = 0; i < TOKEN_BYTES; i++) {
        for (int half = 0; half < 2; half++) {
            int pos = 2 * i + half;
            int nibble = half == 0 ? raw[i] >> 4 : raw[i] & 0xf;
            int big = upper == 1 || (upper == 2 && pos % 2 == 1);
            out[pos] = (big ? upper_digits : lower_digits)[nibble];
        }
    }
    out[TOKEN_HEX] = '\0';
}

/* A plausible RoCE v2 token whose GID maps the IPv4 address a.b.c.d. */
static inline struct test_token token_with_ipv4(uint8_t a, uint8_t b,
                                                uint8_t c, uint8_t d)
{
    struct test_token t;
    memset(&t, 0, sizeof t);
    t.transport = 0x01;
    t.qp_num = 0x00012345u;
    t.gid[10] = 0xff;
    t.gid[11] = 0xff;
    t.gid[12] = a;
    t.gid[13] = b;
    t.gid[14] = c;
    t.gid[15] = d;
    t.rkey = 0xa1b2c3d4u;
    t.addr = 0x00007f0012345000ull;
    t.length = 4096;
    t.port = 1;
    t.lid = 0;
    return t;
}

#endif /* HIPOBJ_TEST_CHECK_H */
