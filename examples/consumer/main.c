/*
 * A minimal C11 consumer of an installed libhipobj: it compiles against
 * <hipobj.h>, links against libhipobj.so and calls a few functions that need
 * no initialized library. Exits 0 when the library answers as the header
 * says, 1 otherwise.
 *
 * Build it with CMake (find_package(hipobj CONFIG), see CMakeLists.txt) or
 * with pkg-config:
 *   cc -std=c11 main.c $(pkg-config --cflags --libs hipobj) -o consumer
 */
#include <hipobj.h>

#include <stdio.h>
#include <string.h>

#define STR_(x) #x
#define STR(x) STR_(x)

int main(void) {
    int failed = 0;
    const char *version = hipObjGetVersionString();
    const char *busy;
    int major = -1, minor = -1, patch = -1;
    hipObjError_t err;

    printf("hipobj version %s\n", version);

    if (strcmp(version, STR(HIPOBJ_VERSION_MAJOR) "." STR(HIPOBJ_VERSION_MINOR) "." STR(
                            HIPOBJ_VERSION_PATCH)) != 0) {
        fprintf(stderr, "version string %s does not match the header's macros\n", version);
        failed = 1;
    }

    err = hipObjGetVersion(&major, &minor, &patch);
    if (err.opError != hipObjSuccess || err.hipError != 0) {
        fprintf(stderr, "hipObjGetVersion failed: %s\n", hipObjGetErrorString(err.opError));
        failed = 1;
    } else if (major != HIPOBJ_VERSION_MAJOR || minor != HIPOBJ_VERSION_MINOR ||
               patch != HIPOBJ_VERSION_PATCH) {
        fprintf(stderr, "hipObjGetVersion gave %d.%d.%d, the header says %d.%d.%d\n", major,
                minor, patch, HIPOBJ_VERSION_MAJOR, HIPOBJ_VERSION_MINOR, HIPOBJ_VERSION_PATCH);
        failed = 1;
    }

    busy = hipObjGetErrorString(hipObjBusy);
    if (busy == NULL || strcmp(busy, "Busy") != 0) {
        fprintf(stderr, "hipObjGetErrorString(hipObjBusy) gave \"%s\", expected \"Busy\"\n",
                busy ? busy : "(null)");
        failed = 1;
    }

    return failed;
}
