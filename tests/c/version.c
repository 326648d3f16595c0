/* hipObjGetVersionString and hipObjGetVersion against the header's
 * HIPOBJ_VERSION_* macros (spec sections 2 and 4), and HIPOBJ_SUCCESS as
 * the original's clients use it. */
#include "check.h"

#define SENTINEL (-12345)

int main(void)
{
    char expected[64];
    snprintf(expected, sizeof expected, "%d.%d.%d", HIPOBJ_VERSION_MAJOR,
             HIPOBJ_VERSION_MINOR, HIPOBJ_VERSION_PATCH);
    CHECK_INT(HIPOBJ_VERSION_MAJOR, 0); /* "major stays 0" */
    CHECK(HIPOBJ_VERSION_MINOR >= 0);
    CHECK(HIPOBJ_VERSION_PATCH >= 0);

    const char *v = hipObjGetVersionString();
    CHECK_STR(v, expected);
    CHECK(hipObjGetVersionString() == v); /* static */
    CHECK_STR(hipObjGetVersionString(), expected);

    int major = SENTINEL, minor = SENTINEL, patch = SENTINEL;
    CHECK_ERR(hipObjGetVersion(&major, &minor, &patch), hipObjSuccess, 0);
    CHECK_INT(major, HIPOBJ_VERSION_MAJOR);
    CHECK_INT(minor, HIPOBJ_VERSION_MINOR);
    CHECK_INT(patch, HIPOBJ_VERSION_PATCH);

    /* HIPOBJ_SUCCESS: the success value, compared field by field (the
     * original's MinIO bridge does so with every result). */
    hipObjError_t ok = HIPOBJ_SUCCESS;
    CHECK(ok.opError == hipObjSuccess && ok.hipError == 0);
    hipObjError_t r = hipObjGetVersion(&major, &minor, &patch);
    CHECK(r.opError == HIPOBJ_SUCCESS.opError && r.hipError == HIPOBJ_SUCCESS.hipError);
    r = hipObjGetVersion(NULL, &minor, &patch);
    CHECK(r.opError != HIPOBJ_SUCCESS.opError);

    /* Every combination with at least one NULL: InvalidValue, and nothing
     * written through the pointers that are not NULL. */
    for (int mask = 0; mask < 7; mask++) {
        int a = SENTINEL, b = SENTINEL, c = SENTINEL;
        int *pa = (mask & 1) ? &a : NULL;
        int *pb = (mask & 2) ? &b : NULL;
        int *pc = (mask & 4) ? &c : NULL;
        hipObjError_t r = hipObjGetVersion(pa, pb, pc);
        if (r.opError != hipObjInvalidValue || r.hipError != 0) {
            CHECK_FAIL_("hipObjGetVersion with NULL mask %d returned {%d, %d}",
                        mask, (int)r.opError, r.hipError);
        }
        if (a != SENTINEL || b != SENTINEL || c != SENTINEL) {
            CHECK_FAIL_("hipObjGetVersion with NULL mask %d wrote %d %d %d",
                        mask, a, b, c);
        }
    }

    /* Still answers correctly after the failures. */
    major = minor = patch = SENTINEL;
    CHECK_ERR(hipObjGetVersion(&major, &minor, &patch), hipObjSuccess, 0);
    char again[64];
    snprintf(again, sizeof again, "%d.%d.%d", major, minor, patch);
    CHECK_STR(again, hipObjGetVersionString());
    return CHECK_DONE();
}
