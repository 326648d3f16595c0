/* hipObjGetErrorString: the exact string of every code (spec section 3),
 * "Unknown error" for every other value, and the same static string on
 * every call. */
#include "check.h"

#include <limits.h>

int main(void)
{
    static const struct {
        hipObjOpError_t code;
        int value;
        const char *text;
    } table[] = {
        {hipObjSuccess, 0, "Success"},
        {hipObjInvalidValue, 1, "Invalid value"},
        {hipObjNotInitialized, 2, "Not initialized"},
        {hipObjAlreadyInitialized, 3, "Already initialized"},
        {hipObjRdmaError, 4, "RDMA error"},
        {hipObjS3Error, 5, "S3 error"},
        {hipObjBufNotRegistered, 6, "Buffer not registered"},
        {hipObjBufAlreadyRegistered, 7, "Buffer already registered"},
        {hipObjNicNotFound, 8, "NIC not found"},
        {hipObjDmabufNotSupported, 9, "dmabuf not supported"},
        {hipObjSizeTooLarge, 10, "Size too large"},
        {hipObjInternalError, 11, "Internal error"},
        {hipObjNotSupported, 12, "Not supported"},
        {hipObjBusy, 13, "Busy"},
    };
    const size_t n = sizeof table / sizeof table[0];
    CHECK_INT(n, 14);

    for (size_t i = 0; i < n; i++) {
        CHECK_INT(table[i].code, table[i].value);
        CHECK_INT(table[i].value, i);
        const char *s = hipObjGetErrorString(table[i].code);
        CHECK_STR(s, table[i].text);
        /* The same value converted from a plain int. */
        CHECK_STR(hipObjGetErrorString((hipObjOpError_t)table[i].value),
                  table[i].text);
        /* Static: a second call gives the same, still valid, string. */
        CHECK(hipObjGetErrorString(table[i].code) == s);
    }

    const int unknown[] = {-1, 14, 15, 100, 255, 256, 5999, HIPOBJ_BASE_ERR,
                           HIPOBJ_BASE_ERR + 1, 65536, INT_MAX, INT_MIN,
                           INT_MIN + 1, INT_MAX - 1};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *s = hipObjGetErrorString((hipObjOpError_t)unknown[i]);
        if (s == NULL || strcmp(s, "Unknown error") != 0) {
            CHECK_FAIL_("hipObjGetErrorString(%d) == \"%s\", expected "
                        "\"Unknown error\"",
                        unknown[i], s ? s : "(NULL)");
        }
    }

    /* The table still reads the same after the unknown values. */
    CHECK_STR(hipObjGetErrorString(hipObjSuccess), "Success");
    CHECK_STR(hipObjGetErrorString(hipObjBusy), "Busy");
    return CHECK_DONE();
}
