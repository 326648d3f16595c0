/* Prints the layout of hipPointerAttribute_t as the installed ROCm header
 * declares it, for tests/hip_loader.rs to compare with the Rust struct of
 * src/platform/gpu/sys.rs. One "name value" pair a line. */
#include <hip/hip_runtime_api.h>

#include <stddef.h>
#include <stdio.h>

#define FIELD(f) printf(#f " %zu %zu\n", offsetof(hipPointerAttribute_t, f), \
                        sizeof(((hipPointerAttribute_t *)0)->f))

int main(void)
{
    printf("sizeof %zu\n", sizeof(hipPointerAttribute_t));
    printf("alignof %zu\n", _Alignof(hipPointerAttribute_t));
    printf("HIP_VERSION_MAJOR %d\n", HIP_VERSION_MAJOR);
    FIELD(memoryType);
    FIELD(device);
    FIELD(devicePointer);
    FIELD(hostPointer);
    FIELD(isManaged);
    FIELD(allocationFlags);
    printf("hipMemoryTypeHost %d\n", (int)hipMemoryTypeHost);
    printf("hipMemoryTypeDevice %d\n", (int)hipMemoryTypeDevice);
    printf("hipMemoryTypeArray %d\n", (int)hipMemoryTypeArray);
    printf("hipMemoryTypeUnified %d\n", (int)hipMemoryTypeUnified);
    printf("hipErrorInvalidValue %d\n", (int)hipErrorInvalidValue);
    printf("hipErrorOutOfMemory %d\n", (int)hipErrorOutOfMemory);
    printf("hipErrorNotReady %d\n", (int)hipErrorNotReady);
    printf("hipMemcpyDefault %d\n", (int)hipMemcpyDefault);
    printf("hipEventDisableTiming %d\n", (int)hipEventDisableTiming);
    printf("hipHostMallocDefault %d\n", (int)hipHostMallocDefault);
    printf("hipStreamPerThread %zu\n", (size_t)hipStreamPerThread);
    printf("sizeof_hipMemoryType %zu\n", sizeof(hipMemoryType));
    printf("sizeof_hipError_t %zu\n", sizeof(hipError_t));
    return 0;
}
