/* hipObjTokenClientNic (spec section 4, row 13, and the token layout of
 * section 5, built here by hand): NULL arguments and nicIpLen 0 leave the
 * buffer alone; otherwise nicIp[0] is cleared first; malformed tokens are
 * InvalidValue; an IPv4-mapped GID (bytes 10 and 11 both 0xff, i.e. token
 * bytes 15 and 16) gives the dotted quad of GID bytes 12..15, which must
 * fit with its NUL; any other GID gives success and an empty string. */
#include "check.h"

#define FILL 'X'
#define BUF 64

static void fill(char *buf)
{
    memset(buf, FILL, BUF);
}

static int untouched(const char *buf)
{
    for (int i = 0; i < BUF; i++) {
        if (buf[i] != FILL) {
            return 0;
        }
    }
    return 1;
}

/* Expects `token` to give `ip` (NUL-terminated) with nicIpLen `len`. */
static void expect_ip(int line, const char *token, size_t len, const char *ip)
{
    char buf[BUF];
    fill(buf);
    hipObjError_t r = hipObjTokenClientNic(token, buf, len);
    if (r.opError != hipObjSuccess || r.hipError != 0 ||
        memchr(buf, '\0', len) == NULL || strcmp(buf, ip) != 0) {
        buf[BUF - 1] = '\0';
        fprintf(stderr,
                "line %d: nicIpLen %zu: got {%d, %d} \"%s\", expected "
                "success and \"%s\"\n",
                line, len, (int)r.opError, r.hipError, buf, ip);
        atomic_fetch_add(&check_failures, 1);
    }
}

/* Expects InvalidValue with nicIp[0] == 0. */
static void expect_invalid(int line, const char *token, size_t len)
{
    char buf[BUF];
    fill(buf);
    hipObjError_t r = hipObjTokenClientNic(token, buf, len);
    if (r.opError != hipObjInvalidValue || r.hipError != 0 || buf[0] != 0) {
        fprintf(stderr,
                "line %d: nicIpLen %zu: got {%d, %d} nicIp[0] = 0x%02x, "
                "expected InvalidValue and an empty string\n",
                line, len, (int)r.opError, r.hipError,
                (unsigned char)buf[0]);
        atomic_fetch_add(&check_failures, 1);
    }
}

static void hex_of(const struct test_token *t, int upper,
                   char out[TOKEN_HEX + 1])
{
    token_hex(t, upper, out);
}

int main(void)
{
    char hex[TOKEN_HEX + 1];
    char buf[BUF];

    /* The hand-built layout: GID byte 10 is token byte 15, i.e. hex digits
     * 30..31; the address sits in token bytes 17..20. */
    struct test_token t = token_with_ipv4(192, 0, 2, 1);
    hex_of(&t, 0, hex);
    CHECK_INT(strlen(hex), 88);
    CHECK(memcmp(hex, "0145230100", 10) == 0);              /* RC, QP LE */
    CHECK(memcmp(hex + 30, "ffffc0000201", 12) == 0);       /* ::ffff:IP */
    CHECK(memcmp(hex + 42, "d4c3b2a1", 8) == 0);            /* rkey LE */
    CHECK(memcmp(hex + 82, "010000", 6) == 0);              /* port, LID */

    /* ---- NULL arguments and nicIpLen 0: nothing written. */
    fill(buf);
    CHECK_ERR(hipObjTokenClientNic(NULL, buf, sizeof buf), hipObjInvalidValue,
              0);
    CHECK(untouched(buf));
    CHECK_ERR(hipObjTokenClientNic(hex, NULL, 16), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjTokenClientNic(hex, NULL, 0), hipObjInvalidValue, 0);
    CHECK_ERR(hipObjTokenClientNic(NULL, NULL, 0), hipObjInvalidValue, 0);
    fill(buf);
    CHECK_ERR(hipObjTokenClientNic(hex, buf, 0), hipObjInvalidValue, 0);
    CHECK(untouched(buf));
    fill(buf);
    CHECK_ERR(hipObjTokenClientNic(NULL, buf, 0), hipObjInvalidValue, 0);
    CHECK(untouched(buf));
    fill(buf);
    CHECK_ERR(hipObjTokenClientNic("", buf, 0), hipObjInvalidValue, 0);
    CHECK(untouched(buf));

    /* ---- IPv4-mapped GIDs. */
    expect_ip(__LINE__, hex, BUF, "192.0.2.1");
    expect_ip(__LINE__, hex, 16, "192.0.2.1");
    expect_ip(__LINE__, hex, strlen("192.0.2.1") + 1, "192.0.2.1");
    expect_invalid(__LINE__, hex, strlen("192.0.2.1"));
    expect_invalid(__LINE__, hex, 2);
    expect_invalid(__LINE__, hex, 1);
    hex_of(&t, 1, hex); /* upper case */
    expect_ip(__LINE__, hex, BUF, "192.0.2.1");
    hex_of(&t, 2, hex); /* mixed case */
    expect_ip(__LINE__, hex, BUF, "192.0.2.1");
    t.transport = 0x00; /* DC */
    hex_of(&t, 0, hex);
    expect_ip(__LINE__, hex, BUF, "192.0.2.1");
    t.transport = 0x02; /* RC through RDMA CM: the tokens this library mints */
    hex_of(&t, 0, hex);
    expect_ip(__LINE__, hex, BUF, "192.0.2.1");

    t = token_with_ipv4(255, 255, 255, 255);
    hex_of(&t, 0, hex);
    expect_ip(__LINE__, hex, BUF, "255.255.255.255");
    expect_ip(__LINE__, hex, 16, "255.255.255.255");
    expect_invalid(__LINE__, hex, 15);
    expect_invalid(__LINE__, hex, 8);

    t = token_with_ipv4(0, 0, 0, 0);
    hex_of(&t, 0, hex);
    expect_ip(__LINE__, hex, BUF, "0.0.0.0");
    expect_ip(__LINE__, hex, 8, "0.0.0.0");
    expect_invalid(__LINE__, hex, 7);
    expect_invalid(__LINE__, hex, 1);

    t = token_with_ipv4(10, 1, 200, 7);
    hex_of(&t, 1, hex);
    expect_ip(__LINE__, hex, 11, "10.1.200.7");
    expect_invalid(__LINE__, hex, 10);

    /* Only bytes 10 and 11 decide: other GID bytes do not matter. */
    t = token_with_ipv4(172, 16, 0, 9);
    memset(t.gid, 0xfe, 10);
    hex_of(&t, 0, hex);
    expect_ip(__LINE__, hex, BUF, "172.16.0.9");

    /* Other fields do not matter either. */
    t = token_with_ipv4(198, 51, 100, 23);
    t.qp_num = 0xffffffffu;
    t.rkey = 0;
    t.addr = UINT64_MAX;
    t.length = 0;
    t.port = 0xff;
    t.lid = 0xffff;
    hex_of(&t, 0, hex);
    expect_ip(__LINE__, hex, BUF, "198.51.100.23");

    /* ---- GIDs that are not IPv4-mapped: success and an empty string. */
    struct test_token plain = token_with_ipv4(192, 0, 2, 1);
    plain.gid[10] = 0xfe;
    hex_of(&plain, 0, hex);
    expect_ip(__LINE__, hex, BUF, "");
    expect_ip(__LINE__, hex, 1, "");
    plain = token_with_ipv4(192, 0, 2, 1);
    plain.gid[11] = 0x00;
    hex_of(&plain, 0, hex);
    expect_ip(__LINE__, hex, BUF, "");
    memset(plain.gid, 0, 16); /* all-zero GID */
    hex_of(&plain, 0, hex);
    expect_ip(__LINE__, hex, BUF, "");
    static const uint8_t link_local[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0,
                                           0x02, 0x11, 0x22, 0xff,
                                           0xfe, 0x33, 0x44, 0x55};
    memcpy(plain.gid, link_local, 16); /* fe80::211:22ff:fe33:4455 */
    hex_of(&plain, 1, hex);
    expect_ip(__LINE__, hex, 1, "");
    /* The mapped bytes shifted by one (GID bytes 9 and 10, or 11 and 12). */
    memset(plain.gid, 0, 16);
    plain.gid[9] = plain.gid[10] = 0xff;
    hex_of(&plain, 0, hex);
    expect_ip(__LINE__, hex, BUF, "");
    memset(plain.gid, 0, 16);
    plain.gid[11] = plain.gid[12] = 0xff;
    hex_of(&plain, 0, hex);
    expect_ip(__LINE__, hex, BUF, "");

    /* ---- Malformed tokens: InvalidValue and nicIp[0] == 0. */
    t = token_with_ipv4(192, 0, 2, 1);
    hex_of(&t, 0, hex);
    char text[TOKEN_HEX + 8];
    memcpy(text, hex, TOKEN_HEX);
    text[87] = '\0'; /* 87 digits */
    expect_invalid(__LINE__, text, BUF);
    memcpy(text, hex, TOKEN_HEX);
    text[88] = '0'; /* 89 digits */
    text[89] = '\0';
    expect_invalid(__LINE__, text, BUF);
    memcpy(text, hex, TOKEN_HEX);
    memcpy(text + 88, "\r\n", 3); /* trailing CR LF is not a token */
    expect_invalid(__LINE__, text, BUF);
    memcpy(text, hex, TOKEN_HEX + 1);
    text[50] = 'g'; /* non-hex */
    expect_invalid(__LINE__, text, BUF);
    memcpy(text, hex, TOKEN_HEX + 1);
    text[0] = ' ';
    expect_invalid(__LINE__, text, BUF);
    memcpy(text, hex, TOKEN_HEX + 1);
    text[87] = 'G';
    expect_invalid(__LINE__, text, BUF);
    expect_invalid(__LINE__, "", BUF);
    expect_invalid(__LINE__, "0", BUF);
    expect_invalid(__LINE__, "not a token", BUF);
    expect_invalid(__LINE__, hex + 2, BUF); /* 86 digits */
    const uint8_t bad_transports[] = {0x03, 0x04, 0x80, 0xfe, 0xff};
    for (size_t i = 0; i < sizeof bad_transports; i++) {
        struct test_token b = t;
        b.transport = bad_transports[i];
        hex_of(&b, 0, hex);
        expect_invalid(__LINE__, hex, BUF);
        expect_invalid(__LINE__, hex, 1);
    }
    /* Malformed wins over a too-small buffer, and over a plain GID. */
    hex_of(&t, 0, hex);
    memcpy(text, hex, TOKEN_HEX + 1);
    text[20] = 'z';
    expect_invalid(__LINE__, text, 1);
    memcpy(text, hex, TOKEN_HEX + 1);
    text[88] = '0';
    text[89] = '\0';
    expect_invalid(__LINE__, text, 1);

    /* The library keeps working after the failures. */
    hex_of(&t, 0, hex);
    expect_ip(__LINE__, hex, BUF, "192.0.2.1");
    return CHECK_DONE();
}
