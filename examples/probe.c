/*
 * probe: tells whether this machine can run libhipobj.
 *
 *   probe [NIC_HINT]
 *
 * Prints the library's version, then initializes it (on the current GPU, or
 * GPU-less on the named RDMA device when NIC_HINT is given) and prints the
 * result: which code, and the HIP error behind it. The library writes the
 * reason for an environmental failure (missing library, no device) to
 * stderr. Exits 0 when init succeeded, 1 otherwise.
 */
#include <hipobj.h>

#include <stdio.h>

int main(int argc, char **argv) {
    int major = 0, minor = 0, patch = 0;
    hipObjGetVersion(&major, &minor, &patch);
    printf("libhipobj %s (%d.%d.%d)\n", hipObjGetVersionString(), major, minor, patch);
    fflush(stdout); /* keep the library's stderr lines after this one */

    hipObjConfig_t config = {0};
    config.gpuDevice = -1;
    config.nicHint = argc > 1 ? argv[1] : NULL;

    hipObjError_t err = hipObjInit(&config);
    printf("hipObjInit(nicHint=%s): %s (opError %d, hipError %d)\n",
           config.nicHint ? config.nicHint : "NULL", hipObjGetErrorString(err.opError),
           (int)err.opError, err.hipError);
    if (err.opError != hipObjSuccess) {
        return 1;
    }
    hipObjShutdown();
    return 0;
}
