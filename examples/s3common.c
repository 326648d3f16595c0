/*
 * s3common: the parts the example programs share (see s3common.h).
 *
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L

#include "s3common.h"

#include <curl/curl.h>

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* x-amz-content-sha256 of an empty payload: SHA-256 of no bytes. */
static const char EMPTY_SHA256[] =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/* Most threads a run takes: hipobj registers at most 256 buffers. */
#define EX_MAX_THREADS 256u
/* Most parts a multipart upload takes (S3's limit). */
#define EX_MAX_PARTS 10000u

/* ======================================================================= options */

static void usage(FILE *out, const char *prog, enum ex_program program) {
    fprintf(out, "usage: %s [options] BUCKET KEY\n", prog);
    switch (program) {
    case EX_GET_OBJECT:
        fputs("Reads an S3 object into a registered buffer through libhipobj (hipObjGet),\n"
              "over plain HTTP when the library cannot initialize or the server declines.\n",
              out);
        break;
    case EX_PUT_OBJECT:
        fputs("Writes a registered buffer to an S3 object through libhipobj (hipObjPut),\n"
              "over plain HTTP when the library cannot initialize or the server declines.\n",
              out);
        break;
    case EX_TOKEN_GET:
        fputs("Reads an S3 object with a token the application asks for itself\n"
              "(hipObjGetRdmaToken, its own HTTP request, hipObjParseRdmaReply, hipObjBufSync).\n",
              out);
        break;
    }
    fputs("options:\n"
          "  --endpoint URL     S3 endpoint (default $HIPOBJ_S3_ENDPOINT, else http://127.0.0.1:9000)\n"
          "  --access-key AK    default $AWS_ACCESS_KEY_ID\n"
          "  --secret-key SK    default $AWS_SECRET_ACCESS_KEY\n"
          "  --region R         default us-east-1 (requests are signed as aws:amz:R:s3)\n"
          "  --nic NAME         nicHint for hipObjInit (default none)\n"
          "  --gpu N            gpuDevice for hipObjInit (default -1: host memory, no GPU)\n"
          "  --device           buffers in GPU memory (HIP or the CUDA driver; needs a GPU)\n",
          out);
    if (program == EX_PUT_OBJECT) {
        fputs("  --size N           bytes (default: the size of --file)\n"
              "  --file PATH        payload from PATH\n"
              "  --pattern SEED     generate the payload (thread i: SEED + i)\n"
              "  --parts P          multipart upload in P parts\n",
              out);
    } else {
        fputs("  --size N           bytes to read (required)\n"
              "  --offset N         object offset: sends Range: bytes=N-(N+size-1)\n"
              "  --file PATH        write what was read to PATH (PATH.i with several threads)\n"
              "  --pattern SEED     check what was read against the pattern (thread i: SEED + i)\n",
              out);
    }
    fputs("  --threads T        T threads, each with its own buffer; thread i uses KEY.i when T > 1\n"
          "  --iterations I     transfers per thread (default 1)\n"
          "  --stall-seconds S  fail an exchange that sends or receives nothing for S s\n"
          "                     (default 300; an RDMA transfer's response waits for its data)\n"
          "  --no-rdma          plain HTTP only, without libhipobj\n"
          "  --help             this text\n"
          "Prints one line: OP BUCKET/KEY: N bytes in T ms (R MiB/s) via rdma|fallback (REASON).\n"
          "Exit status: 0 success, 1 failure, 2 pattern mismatch.\n",
          out);
}

/* Parses a decimal number with no sign, spaces or suffix. */
static int parse_u64(const char *text, uint64_t *out) {
    if (text == NULL || *text < '0' || *text > '9') {
        return -1;
    }
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == NULL || *end != '\0') {
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int parse_int(const char *text, int *out) {
    const char *digits = text != NULL && text[0] == '-' ? text + 1 : text;
    uint64_t v = 0;
    if (parse_u64(digits, &v) != 0 || v > (uint64_t)INT_MAX) {
        return -1;
    }
    *out = digits != text ? -(int)v : (int)v;
    return 0;
}

static int bad_args(const char *prog, const char *fmt, const char *arg) {
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry '%s --help'.\n", prog);
    return -1;
}

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? v : fallback;
}

int ex_parse_args(struct ex_options *o, enum ex_program program, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    const char *slash = argc > 0 ? strrchr(argv[0], '/') : NULL;
    o->prog = argc > 0 ? (slash != NULL ? slash + 1 : argv[0]) : "example";
    o->program = program;
    o->endpoint = env_or("HIPOBJ_S3_ENDPOINT", "http://127.0.0.1:9000");
    o->access_key = env_or("AWS_ACCESS_KEY_ID", NULL);
    o->secret_key = env_or("AWS_SECRET_ACCESS_KEY", NULL);
    o->region = "us-east-1";
    o->gpu = -1;
    o->threads = 1;
    o->iterations = 1;
    o->stall_seconds = 300;

    const char *positional[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout, o->prog, program);
            return 0;
        }
        if (strcmp(arg, "--device") == 0) {
            o->device = 1;
            continue;
        }
        if (strcmp(arg, "--no-rdma") == 0) {
            o->no_rdma = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (npos == 2) {
                return bad_args(o->prog, "unexpected argument '%s'", arg);
            }
            positional[npos++] = arg;
            continue;
        }
        /* --name VALUE or --name=VALUE */
        char name[32];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        size_t nlen = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        if (nlen >= sizeof name) {
            return bad_args(o->prog, "unknown option '%s'", arg);
        }
        memcpy(name, arg, nlen);
        name[nlen] = '\0';
        if (eq != NULL) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            return bad_args(o->prog, "%s needs a value", name);
        }

        uint64_t n = 0;
        if (strcmp(name, "--endpoint") == 0) {
            o->endpoint = value;
        } else if (strcmp(name, "--access-key") == 0) {
            o->access_key = value;
        } else if (strcmp(name, "--secret-key") == 0) {
            o->secret_key = value;
        } else if (strcmp(name, "--region") == 0) {
            o->region = value;
        } else if (strcmp(name, "--nic") == 0) {
            o->nic = value;
        } else if (strcmp(name, "--gpu") == 0) {
            if (parse_int(value, &o->gpu) != 0 || o->gpu < -1) {
                return bad_args(o->prog, "--gpu takes -1 or a device index, not '%s'", value);
            }
        } else if (strcmp(name, "--size") == 0) {
            if (parse_u64(value, &o->size) != 0 || o->size == 0 || o->size > SIZE_MAX) {
                return bad_args(o->prog, "--size takes a positive byte count, not '%s'", value);
            }
            o->have_size = 1;
        } else if (strcmp(name, "--offset") == 0 && program != EX_PUT_OBJECT) {
            if (parse_u64(value, &o->offset) != 0 || o->offset > (uint64_t)INT64_MAX) {
                return bad_args(o->prog, "--offset takes a byte offset, not '%s'", value);
            }
            o->have_offset = 1;
        } else if (strcmp(name, "--file") == 0) {
            o->file = value;
        } else if (strcmp(name, "--pattern") == 0) {
            if (parse_u64(value, &o->seed) != 0) {
                return bad_args(o->prog, "--pattern takes a decimal seed, not '%s'", value);
            }
            o->have_pattern = 1;
        } else if (strcmp(name, "--parts") == 0 && program == EX_PUT_OBJECT) {
            if (parse_u64(value, &n) != 0 || n == 0 || n > EX_MAX_PARTS) {
                return bad_args(o->prog, "--parts takes 1 to 10000, not '%s'", value);
            }
            o->parts = (unsigned)n;
        } else if (strcmp(name, "--threads") == 0) {
            if (parse_u64(value, &n) != 0 || n == 0 || n > EX_MAX_THREADS) {
                return bad_args(o->prog, "--threads takes 1 to 256, not '%s'", value);
            }
            o->threads = (unsigned)n;
        } else if (strcmp(name, "--iterations") == 0) {
            if (parse_u64(value, &n) != 0 || n == 0 || n > UINT_MAX) {
                return bad_args(o->prog, "--iterations takes a positive count, not '%s'", value);
            }
            o->iterations = (unsigned)n;
        } else if (strcmp(name, "--stall-seconds") == 0) {
            if (parse_u64(value, &n) != 0 || n == 0 || n > 86400) {
                return bad_args(o->prog, "--stall-seconds takes 1 to 86400, not '%s'", value);
            }
            o->stall_seconds = (unsigned)n;
        } else {
            return bad_args(o->prog, "unknown option '%s'", name);
        }
    }
    if (npos != 2) {
        return bad_args(o->prog, "%s", "expected BUCKET and KEY");
    }
    o->bucket = positional[0];
    o->key = positional[1];
    if (*o->bucket == '\0' || *o->key == '\0') {
        return bad_args(o->prog, "%s", "BUCKET and KEY must not be empty");
    }
    if (strlen(o->key) > 1000) {
        return bad_args(o->prog, "%s", "KEY is longer than 1000 bytes");
    }
    if (strncmp(o->endpoint, "http://", 7) != 0 && strncmp(o->endpoint, "https://", 8) != 0) {
        return bad_args(o->prog, "--endpoint must be an http:// or https:// URL, not '%s'",
                        o->endpoint);
    }
    if (o->access_key == NULL) {
        return bad_args(o->prog, "%s", "no access key: pass --access-key or set AWS_ACCESS_KEY_ID");
    }
    if (o->secret_key == NULL) {
        return bad_args(o->prog, "%s",
                        "no secret key: pass --secret-key or set AWS_SECRET_ACCESS_KEY");
    }
    if (program == EX_PUT_OBJECT) {
        if (o->file != NULL && o->have_pattern) {
            return bad_args(o->prog, "%s", "--file and --pattern exclude each other");
        }
        if (o->file == NULL && !o->have_pattern) {
            return bad_args(o->prog, "%s", "the payload: pass --file PATH or --pattern SEED");
        }
        if (o->have_pattern && !o->have_size) {
            return bad_args(o->prog, "%s", "--pattern needs --size");
        }
        if (o->file != NULL) {
            FILE *f = fopen(o->file, "rb");
            if (f == NULL) {
                fprintf(stderr, "%s: cannot open %s: %s\n", o->prog, o->file, strerror(errno));
                return -1;
            }
            long end = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
            fclose(f);
            if (end < 0) {
                fprintf(stderr, "%s: cannot tell the size of %s\n", o->prog, o->file);
                return -1;
            }
            if (!o->have_size) {
                if (end == 0) {
                    return bad_args(o->prog, "%s is empty", o->file);
                }
                o->size = (uint64_t)end;
                o->have_size = 1;
            } else if (o->size > (uint64_t)end) {
                return bad_args(o->prog, "--size is larger than %s", o->file);
            }
        }
        if (o->parts > 0 && (uint64_t)o->parts > o->size) {
            return bad_args(o->prog, "%s", "--parts is larger than --size");
        }
    } else {
        if (!o->have_size) {
            return bad_args(o->prog, "%s", "--size is required");
        }
        if (o->have_offset && o->size - 1 > (uint64_t)INT64_MAX - o->offset) {
            return bad_args(o->prog, "%s", "--offset + --size is too large");
        }
    }
    return 1;
}

/* ======================================================================= pattern */

static uint64_t mix64(uint64_t z) {
    z ^= z >> 30;
    z *= UINT64_C(0xBF58476D1CE4E5B9);
    z ^= z >> 27;
    z *= UINT64_C(0x94D049BB133111EB);
    z ^= z >> 31;
    return z;
}

static uint64_t pattern_word(uint64_t seed, uint64_t word) {
    return mix64(word + seed * UINT64_C(0x9E3779B97F4A7C15));
}

unsigned char ex_pattern_byte(uint64_t seed, uint64_t j) {
    return (unsigned char)(pattern_word(seed, j / 8) >> (8 * (j % 8)));
}

void ex_pattern_fill(unsigned char *dst, size_t len, uint64_t seed, uint64_t start) {
    size_t i = 0;
    /* Byte by byte up to a word boundary of the object, then whole words. */
    while (i < len && (start + i) % 8 != 0) {
        dst[i] = ex_pattern_byte(seed, start + i);
        i++;
    }
    while (len - i >= 8) {
        uint64_t w = pattern_word(seed, (start + i) / 8);
        for (unsigned b = 0; b < 8; b++) {
            dst[i + b] = (unsigned char)(w >> (8 * b));
        }
        i += 8;
    }
    while (i < len) {
        dst[i] = ex_pattern_byte(seed, start + i);
        i++;
    }
}

int ex_pattern_check(const unsigned char *buf, size_t len, uint64_t seed, uint64_t start,
                     uint64_t *first_bad) {
    unsigned char expect[4096];
    for (size_t done = 0; done < len;) {
        size_t n = len - done < sizeof expect ? len - done : sizeof expect;
        ex_pattern_fill(expect, n, seed, start + done);
        if (memcmp(expect, buf + done, n) != 0) {
            for (size_t k = 0; k < n; k++) {
                if (expect[k] != buf[done + k]) {
                    *first_bad = start + done + k;
                    return 0;
                }
            }
        }
        done += n;
    }
    return 1;
}

/* ======================================================================== timing */

double ex_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ================================================================= device memory */

/*
 * The GPU runtime behind --device, opened with dlopen: HIP (AMD GPUs) when
 * it loads and sees a GPU, else the CUDA driver (NVIDIA GPUs), as
 * libhipobj itself chooses (HIPOBJ_GPU_RUNTIME=auto). Each backend is a
 * table of the five calls the examples make.
 */
struct gpu_backend {
    const char *name;
    int (*count)(int *n);
    int (*set_device)(int device);
    int (*alloc)(void **ptr, size_t size);
    int (*release)(void *ptr);
    int (*copy)(void *dst, const void *src, size_t size, int to_device);
    const char *(*describe)(int err);
};

static struct {
    pthread_once_t once;
    const struct gpu_backend *backend;
    char error[1024];
} gpu = {PTHREAD_ONCE_INIT, NULL, {0}};

/* One function of a runtime: its name, and where its pointer goes. */
struct gpu_sym {
    const char *name;
    void *fn;
    size_t size;
};

/*
 * Opens the first of `names` that loads and resolves every one of `syms`;
 * -1 with why in `why` otherwise. dlsym's object pointer becomes a function
 * pointer by memcpy, which is what ISO C allows.
 */
static int gpu_load(const char *const *names, size_t n, const char *library,
                    const struct gpu_sym *syms, size_t nsyms, char *why, size_t why_len) {
    void *lib = NULL;
    for (size_t i = 0; i < n && lib == NULL; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == NULL) {
        snprintf(why, why_len, "cannot load %s", library);
        return -1;
    }
    for (size_t i = 0; i < nsyms; i++) {
        void *sym = dlsym(lib, syms[i].name);
        if (sym == NULL) {
            snprintf(why, why_len, "%s has no %s", library, syms[i].name);
            return -1;
        }
        memcpy(syms[i].fn, &sym, syms[i].size);
    }
    /* A runtime that loaded stays loaded for the life of the process. */
    return 0;
}

/* ---- HIP */

/* hipMemcpyKind's hipMemcpyDefault: the runtime tells the direction. */
#define EX_HIP_MEMCPY_DEFAULT 4

static struct {
    int (*get_device_count)(int *count);
    int (*set_device)(int device);
    int (*malloc_)(void **ptr, size_t size);
    int (*free_)(void *ptr);
    int (*memcpy_)(void *dst, const void *src, size_t size, int kind);
    const char *(*error_string)(int err);
} hip;

static int hip_copy(void *dst, const void *src, size_t size, int to_device) {
    (void)to_device;
    return hip.memcpy_(dst, src, size, EX_HIP_MEMCPY_DEFAULT);
}

static const char *hip_describe(int err) {
    const char *s = hip.error_string(err);
    return s != NULL ? s : "unknown HIP error";
}

static int hip_count(int *n) {
    return hip.get_device_count(n);
}

static int hip_set_device(int device) {
    return device < 0 ? 0 : hip.set_device(device);
}

static int hip_alloc(void **ptr, size_t size) {
    return hip.malloc_(ptr, size);
}

static int hip_release(void *ptr) {
    return hip.free_(ptr);
}

static const struct gpu_backend hip_backend = {
    "HIP", hip_count, hip_set_device, hip_alloc, hip_release, hip_copy, hip_describe,
};

#define GPU_SYM(name, field) {name, &field, sizeof field}

static int hip_open(char *why, size_t why_len) {
    static const char *const names[] = {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
                                        "libamdhip64.so"};
    const struct gpu_sym syms[] = {
        GPU_SYM("hipGetDeviceCount", hip.get_device_count),
        GPU_SYM("hipSetDevice", hip.set_device),
        GPU_SYM("hipMalloc", hip.malloc_),
        GPU_SYM("hipFree", hip.free_),
        GPU_SYM("hipMemcpy", hip.memcpy_),
        GPU_SYM("hipGetErrorString", hip.error_string),
    };
    if (gpu_load(names, sizeof names / sizeof names[0], "libamdhip64", syms,
                 sizeof syms / sizeof syms[0], why, why_len) != 0) {
        return -1;
    }
    int n = 0;
    int err = hip.get_device_count(&n);
    if (err != 0 || n <= 0) {
        snprintf(why, why_len, "HIP sees no GPU (hipGetDeviceCount: %d, %d devices)", err, n);
        return -1;
    }
    return 0;
}

/* ---- the CUDA driver */

typedef int cu_result;
typedef int cu_device;
typedef void *cu_context;
typedef unsigned long long cu_ptr;

static struct {
    cu_result (*init)(unsigned flags);
    cu_result (*device_get_count)(int *count);
    cu_result (*device_get)(cu_device *device, int ordinal);
    cu_result (*primary_retain)(cu_context *ctx, cu_device device);
    cu_result (*ctx_set_current)(cu_context ctx);
    cu_result (*mem_alloc)(cu_ptr *ptr, size_t size);
    cu_result (*mem_free)(cu_ptr ptr);
    cu_result (*copy_htod)(cu_ptr dst, const void *src, size_t size);
    cu_result (*copy_dtoh)(void *dst, cu_ptr src, size_t size);
    cu_result (*error_string)(cu_result err, const char **text);
    /* The chosen device's primary context, made current on each thread
     * that calls (contexts are current per thread). */
    cu_context ctx;
} cuda;

static int cuda_count(int *n) {
    return cuda.device_get_count(n);
}

static int cuda_set_device(int device) {
    cu_device handle = 0;
    cu_context ctx = NULL;
    cu_result err = cuda.device_get(&handle, device < 0 ? 0 : device);
    if (err == 0) {
        err = cuda.primary_retain(&ctx, handle);
    }
    if (err == 0) {
        cuda.ctx = ctx;
        err = cuda.ctx_set_current(ctx);
    }
    return err;
}

static int cuda_alloc(void **ptr, size_t size) {
    cu_ptr p = 0;
    cu_result err = cuda.ctx_set_current(cuda.ctx);
    if (err == 0) {
        err = cuda.mem_alloc(&p, size);
    }
    *ptr = (void *)(uintptr_t)p;
    return err;
}

static int cuda_release(void *ptr) {
    cu_result err = cuda.ctx_set_current(cuda.ctx);
    return err != 0 ? err : cuda.mem_free((cu_ptr)(uintptr_t)ptr);
}

static int cuda_copy(void *dst, const void *src, size_t size, int to_device) {
    cu_result err = cuda.ctx_set_current(cuda.ctx);
    if (err != 0) {
        return err;
    }
    return to_device ? cuda.copy_htod((cu_ptr)(uintptr_t)dst, src, size)
                     : cuda.copy_dtoh(dst, (cu_ptr)(uintptr_t)src, size);
}

static const char *cuda_describe(int err) {
    const char *text = NULL;
    return cuda.error_string(err, &text) == 0 && text != NULL ? text : "unknown CUDA error";
}

static const struct gpu_backend cuda_backend = {
    "CUDA", cuda_count, cuda_set_device, cuda_alloc, cuda_release, cuda_copy, cuda_describe,
};

static int cuda_open(char *why, size_t why_len) {
    static const char *const names[] = {"libcuda.so.1"};
    const struct gpu_sym syms[] = {
        GPU_SYM("cuInit", cuda.init),
        GPU_SYM("cuDeviceGetCount", cuda.device_get_count),
        GPU_SYM("cuDeviceGet", cuda.device_get),
        GPU_SYM("cuDevicePrimaryCtxRetain", cuda.primary_retain),
        GPU_SYM("cuCtxSetCurrent", cuda.ctx_set_current),
        GPU_SYM("cuMemAlloc_v2", cuda.mem_alloc),
        GPU_SYM("cuMemFree_v2", cuda.mem_free),
        GPU_SYM("cuMemcpyHtoD_v2", cuda.copy_htod),
        GPU_SYM("cuMemcpyDtoH_v2", cuda.copy_dtoh),
        GPU_SYM("cuGetErrorString", cuda.error_string),
    };
    if (gpu_load(names, 1, "libcuda.so.1", syms, sizeof syms / sizeof syms[0], why, why_len) != 0) {
        return -1;
    }
    int n = 0;
    cu_result err = cuda.init(0);
    if (err == 0) {
        err = cuda.device_get_count(&n);
    }
    if (err != 0 || n <= 0) {
        snprintf(why, why_len, "the CUDA driver sees no GPU (%d, %d devices)", err, n);
        return -1;
    }
    return 0;
}

/* ---- the chosen one */

static void gpu_open(void) {
    char hip_why[400], cuda_why[400];
    if (hip_open(hip_why, sizeof hip_why) == 0) {
        gpu.backend = &hip_backend;
        return;
    }
    if (cuda_open(cuda_why, sizeof cuda_why) == 0) {
        gpu.backend = &cuda_backend;
        return;
    }
    snprintf(gpu.error, sizeof gpu.error, "%s; %s", hip_why, cuda_why);
}

int ex_gpu_load(const char *prog, int device) {
    pthread_once(&gpu.once, gpu_open);
    if (gpu.backend == NULL) {
        fprintf(stderr, "%s: --device needs a GPU: %s\n", prog, gpu.error);
        return -1;
    }
    int count = 0;
    int err = gpu.backend->count(&count);
    if (err != 0 || device >= count) {
        fprintf(stderr, "%s: --gpu %d: this machine has %d %s GPUs\n", prog, device, count,
                gpu.backend->name);
        return -1;
    }
    return 0;
}

const char *ex_gpu_runtime(void) {
    return gpu.backend != NULL ? gpu.backend->name : "none";
}

int ex_gpu_set_device(const char *prog, int device) {
    int err = gpu.backend->set_device(device);
    if (err != 0) {
        fprintf(stderr, "%s: %s: setting device %d: %s (%d)\n", prog, gpu.backend->name, device,
                gpu.backend->describe(err), err);
        return -1;
    }
    return 0;
}

void *ex_gpu_malloc(const char *prog, size_t size) {
    void *ptr = NULL;
    int err = gpu.backend->alloc(&ptr, size);
    if (err != 0 || ptr == NULL) {
        fprintf(stderr, "%s: %s: allocating %zu bytes: %s (%d)\n", prog, gpu.backend->name, size,
                gpu.backend->describe(err), err);
        return NULL;
    }
    return ptr;
}

void ex_gpu_free(void *ptr) {
    if (ptr != NULL) {
        gpu.backend->release(ptr);
    }
}

int ex_gpu_copy(const char *prog, void *dst, const void *src, size_t size, int to_device) {
    int err = gpu.backend->copy(dst, src, size, to_device);
    if (err != 0) {
        fprintf(stderr, "%s: %s: copying %zu bytes: %s (%d)\n", prog, gpu.backend->name, size,
                gpu.backend->describe(err), err);
        return -1;
    }
    return 0;
}

/* ========================================================================== S3 */

struct ex_s3 {
    CURL *curl;
    const struct ex_options *opt;
    char *url;       /* endpoint/bucket/key, encoded */
    char sigv4[160]; /* aws:amz:REGION:s3 */
};

int ex_url_encode(char *out, size_t cap, size_t *len, const char *text, int keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++) {
        int plain = isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' ||
                    (keep_slash && *p == '/');
        size_t need = plain ? 1 : 3;
        if (*len + need >= cap) {
            return -1;
        }
        if (plain) {
            out[(*len)++] = (char)*p;
        } else {
            out[(*len)++] = '%';
            out[(*len)++] = hex[*p >> 4];
            out[(*len)++] = hex[*p & 15];
        }
    }
    out[*len] = '\0';
    return 0;
}

void ex_xml_request(struct ex_request *rq, const char *method, const char *query, const char *xml) {
    memset(rq, 0, sizeof *rq);
    rq->method = method;
    rq->query = query;
    if (xml != NULL) {
        rq->body = (const unsigned char *)xml;
        rq->body_len = strlen(xml);
        rq->content_type = "application/xml";
    }
}

struct ex_s3 *ex_s3_new(const struct ex_options *o, const char *key) {
    struct ex_s3 *s3 = calloc(1, sizeof *s3);
    if (s3 == NULL) {
        fprintf(stderr, "%s: out of memory\n", o->prog);
        return NULL;
    }
    s3->opt = o;
    size_t elen = strlen(o->endpoint);
    while (elen > 0 && o->endpoint[elen - 1] == '/') {
        elen--;
    }
    size_t cap = elen + 3 * (strlen(o->bucket) + strlen(key)) + 3;
    s3->url = malloc(cap);
    size_t len = elen;
    if (s3->url != NULL) {
        memcpy(s3->url, o->endpoint, elen);
        s3->url[len++] = '/';
        s3->url[len] = '\0';
    }
    if (s3->url == NULL || ex_url_encode(s3->url, cap, &len, o->bucket, 0) != 0 || len + 1 >= cap) {
        fprintf(stderr, "%s: cannot build the object's URL\n", o->prog);
        ex_s3_free(s3);
        return NULL;
    }
    s3->url[len++] = '/';
    s3->url[len] = '\0';
    if (ex_url_encode(s3->url, cap, &len, key, 1) != 0) {
        fprintf(stderr, "%s: cannot build the object's URL\n", o->prog);
        ex_s3_free(s3);
        return NULL;
    }
    snprintf(s3->sigv4, sizeof s3->sigv4, "aws:amz:%s:s3", o->region);
    s3->curl = curl_easy_init();
    if (s3->curl == NULL) {
        fprintf(stderr, "%s: curl_easy_init failed\n", o->prog);
        ex_s3_free(s3);
        return NULL;
    }
    return s3;
}

void ex_s3_free(struct ex_s3 *s3) {
    if (s3 == NULL) {
        return;
    }
    if (s3->curl != NULL) {
        curl_easy_cleanup(s3->curl);
    }
    free(s3->url);
    free(s3);
}

/* One exchange's state, the userdata of libcurl's callbacks. */
struct exchange {
    const struct ex_request *rq;
    struct ex_response *rs;
    size_t sent; /* request body bytes handed to libcurl */
};

static int is_2xx(long status) {
    return status >= 200 && status <= 299;
}

static int header_is(const char *line, size_t len, const char *name, const char **value,
                     size_t *vlen) {
    size_t n = strlen(name);
    if (len <= n || line[n] != ':') {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (tolower((unsigned char)line[i]) != name[i]) {
            return 0;
        }
    }
    const char *v = line + n + 1;
    const char *end = line + len;
    while (v < end && (*v == ' ' || *v == '\t')) {
        v++;
    }
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    *value = v;
    *vlen = (size_t)(end - v);
    return 1;
}

static void copy_value(char *dst, size_t cap, const char *v, size_t vlen) {
    size_t n = vlen < cap - 1 ? vlen : cap - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

static size_t on_header(char *line, size_t size, size_t nitems, void *userdata) {
    struct exchange *x = userdata;
    struct ex_response *rs = x->rs;
    size_t len = size * nitems;
    const char *v = NULL;
    size_t vlen = 0;
    if (len > 5 && memcmp(line, "HTTP/", 5) == 0) {
        /* A new status line (after a 100 Continue, the final one): start over. */
        const char *sp = memchr(line, ' ', len);
        rs->status = sp != NULL ? strtol(sp + 1, NULL, 10) : 0;
        rs->has_rdma_reply = 0;
        rs->rdma_reply[0] = '\0';
        rs->has_bytes_transferred = 0;
        rs->etag[0] = '\0';
    } else if (header_is(line, len, "x-amz-rdma-reply", &v, &vlen)) {
        rs->has_rdma_reply = 1;
        copy_value(rs->rdma_reply, sizeof rs->rdma_reply, v, vlen);
    } else if (header_is(line, len, "x-amz-rdma-bytes-transferred", &v, &vlen)) {
        char digits[32];
        copy_value(digits, sizeof digits, v, vlen);
        rs->has_bytes_transferred = parse_u64(digits, &rs->bytes_transferred) == 0;
    } else if (header_is(line, len, "etag", &v, &vlen)) {
        copy_value(rs->etag, sizeof rs->etag, v, vlen);
    }
    return len;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *userdata) {
    struct exchange *x = userdata;
    struct ex_response *rs = x->rs;
    size_t len = size * nmemb;
    if (is_2xx(rs->status) && x->rq->sink != NULL) {
        size_t room = x->rq->sink_cap - rs->body_len;
        if (len > room) {
            rs->body_overflow = 1;
        }
        size_t n = len < room ? len : room;
        memcpy(x->rq->sink + rs->body_len, data, n);
        rs->body_len += n;
    } else {
        size_t room = sizeof rs->text - 1 - rs->text_len;
        size_t n = len < room ? len : room;
        memcpy(rs->text + rs->text_len, data, n);
        rs->text_len += n;
        rs->text[rs->text_len] = '\0';
    }
    return len;
}

static size_t on_upload(char *buffer, size_t size, size_t nitems, void *userdata) {
    struct exchange *x = userdata;
    size_t room = size * nitems;
    size_t left = x->rq->body_len - x->sent;
    size_t n = left < room ? left : room;
    memcpy(buffer, x->rq->body + x->sent, n);
    x->sent += n;
    return n;
}

static struct curl_slist *add_header(struct curl_slist *list, const char *line, int *failed) {
    struct curl_slist *next = curl_slist_append(list, line);
    if (next == NULL) {
        *failed = 1;
        return list;
    }
    return next;
}

int ex_s3_perform(struct ex_s3 *s3, const struct ex_request *rq, struct ex_response *rs) {
    memset(rs, 0, sizeof *rs);
    struct exchange x = {rq, rs, 0};
    CURL *c = s3->curl;
    curl_easy_reset(c); /* keeps the connection cache */

    /* The URL: the object's, with the canonical query (already sorted and encoded,
     * as SigV4 signs it, so that libcurl's signature matches the server's). */
    char *url = NULL;
    size_t qlen = rq->query != NULL ? strlen(rq->query) : 0;
    size_t ulen = strlen(s3->url);
    url = malloc(ulen + qlen + 2);
    if (url == NULL) {
        snprintf(rs->error, sizeof rs->error, "out of memory");
        return -1;
    }
    memcpy(url, s3->url, ulen);
    url[ulen] = '\0';
    if (qlen > 0) {
        url[ulen] = '?';
        memcpy(url + ulen + 1, rq->query, qlen + 1);
    }

    int failed = 0;
    struct curl_slist *headers = NULL;
    char line[700];
    int has_body = rq->body != NULL && rq->body_len > 0;
    snprintf(line, sizeof line, "x-amz-content-sha256: %s", has_body ? "UNSIGNED-PAYLOAD" : EMPTY_SHA256);
    headers = add_header(headers, line, &failed);
    if (rq->token != NULL) {
        snprintf(line, sizeof line, "x-amz-rdma-token: %s", rq->token);
        headers = add_header(headers, line, &failed);
    }
    if (rq->has_range) {
        snprintf(line, sizeof line, "Range: bytes=%" PRIu64 "-%" PRIu64, rq->range_first, rq->range_last);
        headers = add_header(headers, line, &failed);
    }
    if (rq->content_type != NULL) {
        snprintf(line, sizeof line, "Content-Type: %s", rq->content_type);
        headers = add_header(headers, line, &failed);
    }
    if (failed) {
        curl_slist_free_all(headers);
        free(url);
        snprintf(rs->error, sizeof rs->error, "out of memory");
        return -1;
    }

    char errbuf[CURL_ERROR_SIZE];
    errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    /* No overall deadline (objects may be large), but no hang either. */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)s3->opt->stall_seconds);
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s3->sigv4);
    curl_easy_setopt(c, CURLOPT_USERNAME, s3->opt->access_key);
    curl_easy_setopt(c, CURLOPT_PASSWORD, s3->opt->secret_key);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    if (strcmp(rq->method, "PUT") == 0) {
        /* A PUT whose bytes go by RDMA has an empty body: Content-Length: 0. */
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, on_upload);
        curl_easy_setopt(c, CURLOPT_READDATA, &x);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)rq->body_len);
    } else if (strcmp(rq->method, "POST") == 0) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(has_body ? rq->body_len : 0));
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, has_body ? (const char *)rq->body : "");
    } else if (strcmp(rq->method, "GET") == 0) {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
    }

    CURLcode res = curl_easy_perform(c);
    curl_slist_free_all(headers);
    free(url);
    if (res != CURLE_OK) {
        snprintf(rs->error, sizeof rs->error, "%s", errbuf[0] != '\0' ? errbuf : curl_easy_strerror(res));
        return -1;
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    rs->status = status;
    rs->completed = 1;
    return 0;
}

const char *ex_reply_of(const struct ex_response *rs, char digits[4]) {
    if (rs->has_rdma_reply) {
        return rs->rdma_reply;
    }
    long s = rs->status >= 100 && rs->status <= 999 ? rs->status : 0;
    snprintf(digits, 4, "%03ld", s);
    return digits;
}

int ex_declined(const struct ex_response *rs) {
    if (!rs->completed) {
        return 0;
    }
    char digits[4];
    const char *reply = ex_reply_of(rs, digits);
    int code = 0;
    hipObjError_t e = hipObjParseRdmaReply(reply, strlen(reply), &code);
    return e.opError == hipObjSuccess && code == HIPOBJ_RDMA_REPLY_NOT_IMPLEMENTED;
}

int ex_xml_value(const char *xml, const char *tag, char *out, size_t cap) {
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = strstr(xml, open);
    if (a == NULL) {
        return 0;
    }
    a += strlen(open);
    const char *b = strstr(a, close);
    if (b == NULL) {
        return 0;
    }
    copy_value(out, cap, a, (size_t)(b - a));
    return 1;
}

void ex_report(const char *prog, const char *what, const hipObjError_t *err,
               const struct ex_response *rs) {
    fprintf(stderr, "%s: %s: ", prog, what);
    if (err != NULL) {
        fprintf(stderr, "hipobj %s", hipObjGetErrorString(err->opError));
        if (err->hipError != 0) {
            fprintf(stderr, " (hipError %d)", err->hipError);
        }
        fputs(rs != NULL ? ", " : "\n", stderr);
    }
    if (rs == NULL) {
        if (err == NULL) {
            fputs("failed\n", stderr);
        }
        return;
    }
    if (!rs->completed) {
        fprintf(stderr, "no HTTP response: %s\n", rs->error[0] != '\0' ? rs->error : "request not sent");
        return;
    }
    fprintf(stderr, "HTTP %ld", rs->status);
    if (rs->has_rdma_reply) {
        fprintf(stderr, ", x-amz-rdma-reply %s", rs->rdma_reply);
    }
    char code[128], message[512];
    if (ex_xml_value(rs->text, "Code", code, sizeof code)) {
        fprintf(stderr, ": %s", code);
        if (ex_xml_value(rs->text, "Message", message, sizeof message)) {
            fprintf(stderr, ": %s", message);
        }
    }
    fputc('\n', stderr);
}

/* hipObjOps_t callbacks over struct ex_callback_ctx. */
static int cb_send_request(void *ctx, const char *token, size_t token_len) {
    struct ex_callback_ctx *cx = ctx;
    struct ex_request rq = *cx->rq;
    char tok[128];
    if (token == NULL || token_len == 0 || token_len >= sizeof tok) {
        return 1;
    }
    memcpy(tok, token, token_len);
    tok[token_len] = '\0';
    rq.token = tok;
    cx->sent = 1;
    return ex_s3_perform(cx->s3, &rq, cx->rs) == 0 ? 0 : 1;
}

static int cb_recv_reply(void *ctx, char *reply, size_t *reply_len) {
    struct ex_callback_ctx *cx = ctx;
    if (!cx->rs->completed) {
        return 1;
    }
    char digits[4];
    const char *value = ex_reply_of(cx->rs, digits);
    size_t n = strlen(value);
    if (n > *reply_len) {
        return 1;
    }
    memcpy(reply, value, n);
    *reply_len = n;
    return 0;
}

const hipObjOps_t ex_callbacks = {cb_send_request, cb_recv_reply};

/* ========================================================================= the run */

void ex_count(struct ex_thread *t, uint64_t bytes, int rdma, const char *reason) {
    t->bytes += bytes;
    t->transfers++;
    if (rdma) {
        t->via_rdma++;
    } else if (t->reason[0] == '\0') {
        snprintf(t->reason, sizeof t->reason, "%s", reason);
    }
}

int ex_land_body(struct ex_thread *t, const struct ex_response *rs, size_t expected) {
    if (!rs->completed || !is_2xx(rs->status)) {
        return -1;
    }
    if (rs->body_overflow || rs->body_len != expected) {
        fprintf(stderr, "%s: GET %s/%s: expected %zu bytes, the response %s %zu\n", t->opt->prog,
                t->opt->bucket, t->key, expected, rs->body_overflow ? "had more than" : "had",
                rs->body_len);
        return 1;
    }
    if (t->opt->device && ex_gpu_copy(t->opt->prog, t->buf, t->host, expected, 1) != 0) {
        return 1;
    }
    return 0;
}

void ex_get_request(const struct ex_thread *t, struct ex_request *rq) {
    memset(rq, 0, sizeof *rq);
    rq->method = "GET";
    if (t->opt->have_offset) {
        rq->has_range = 1;
        rq->range_first = t->opt->offset;
        rq->range_last = t->opt->offset + t->size - 1;
    }
    /* A plain body lands in host memory: the buffer itself, or the device's mirror. */
    rq->sink = t->host;
    rq->sink_cap = t->size;
}

int ex_plain_get(struct ex_thread *t, const struct ex_response *declined, const char *reason) {
    char what[1200];
    snprintf(what, sizeof what, "GET %s/%s", t->opt->bucket, t->key);
    /* A server that declined RDMA served the object in that response: use it. */
    if (declined != NULL && declined->completed && is_2xx(declined->status)) {
        int r = ex_land_body(t, declined, t->size);
        if (r == 0) {
            ex_count(t, t->size, 0, reason);
        }
        return r == 0 ? 0 : 1;
    }
    struct ex_request rq;
    struct ex_response rs;
    ex_get_request(t, &rq);
    if (ex_s3_perform(t->s3, &rq, &rs) != 0 || !is_2xx(rs.status)) {
        ex_report(t->opt->prog, what, NULL, &rs);
        return 1;
    }
    if (ex_land_body(t, &rs, t->size) != 0) {
        return 1;
    }
    ex_count(t, t->size, 0, reason);
    return 0;
}

int ex_check_rdma(struct ex_thread *t, const char *what, const struct ex_response *rs,
                  uint64_t expected) {
    if (!is_2xx(rs->status)) {
        ex_report(t->opt->prog, what, NULL, rs);
        return 1;
    }
    if (rs->has_bytes_transferred && rs->bytes_transferred != expected) {
        fprintf(stderr, "%s: %s: the server moved %" PRIu64 " of %" PRIu64 " bytes\n", t->opt->prog,
                what, rs->bytes_transferred, expected);
        return 1;
    }
    return 0;
}

int ex_get_finish(struct ex_thread *t) {
    const struct ex_options *o = t->opt;
    if (o->device && (o->have_pattern || o->file != NULL) &&
        ex_gpu_copy(o->prog, t->host, t->buf, t->size, 0) != 0) {
        return 1;
    }
    if (o->file != NULL) {
        char path[4096];
        if (o->threads > 1) {
            snprintf(path, sizeof path, "%s.%u", o->file, t->index);
        } else {
            snprintf(path, sizeof path, "%s", o->file);
        }
        FILE *f = fopen(path, "wb");
        int ok = f != NULL && fwrite(t->host, 1, t->size, f) == t->size;
        if (f != NULL && fclose(f) != 0) {
            ok = 0;
        }
        if (!ok) {
            fprintf(stderr, "%s: cannot write %s: %s\n", o->prog, path, strerror(errno));
            return 1;
        }
    }
    if (o->have_pattern) {
        uint64_t bad = 0;
        uint64_t start = o->have_offset ? o->offset : 0;
        if (!ex_pattern_check(t->host, t->size, t->seed, start, &bad)) {
            fprintf(stderr,
                    "%s: %s/%s: pattern mismatch at object offset %" PRIu64
                    ": byte 0x%02x, expected 0x%02x (seed %" PRIu64 ")\n",
                    o->prog, o->bucket, t->key, bad, t->host[bad - start],
                    ex_pattern_byte(t->seed, bad), t->seed);
            return 2;
        }
    }
    return 0;
}

/* What every thread shares. */
struct run {
    const struct ex_options *opt;
    const struct ex_program_ops *ops;
    int rdma;
    const char *reason;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    unsigned ready;   /* threads done with their setup */
    int started;      /* the transfers may begin */
    int setup_failed;
    struct ex_thread *threads;
};

static void *alloc_host(size_t size) {
    /* Page-aligned, as RDMA registrations like it; aligned_alloc wants a multiple. */
    size_t page = 4096;
    size_t rounded = (size + page - 1) / page * page;
    return aligned_alloc(page, rounded);
}

static int thread_setup(struct run *r, struct ex_thread *t) {
    const struct ex_options *o = r->opt;
    if (o->device && ex_gpu_set_device(o->prog, o->gpu) != 0) {
        return 1;
    }
    t->s3 = ex_s3_new(o, t->key);
    if (t->s3 == NULL) {
        return 1;
    }
    t->host = alloc_host(t->size);
    if (t->host == NULL) {
        fprintf(stderr, "%s: cannot allocate %zu bytes\n", o->prog, t->size);
        return 1;
    }
    if (o->device) {
        t->buf = ex_gpu_malloc(o->prog, t->size);
        if (t->buf == NULL) {
            return 1;
        }
    } else {
        t->buf = t->host;
    }
    if (r->ops->prepare != NULL && r->ops->prepare(t) != 0) {
        return 1;
    }
    if (t->rdma) {
        hipObjError_t e = o->device ? hipObjBufRegister(t->buf, t->size)
                                    : hipObjBufRegisterHost(t->buf, t->size);
        if (e.opError != hipObjSuccess) {
            char what[64];
            snprintf(what, sizeof what, "%s(%zu bytes)",
                     o->device ? "hipObjBufRegister" : "hipObjBufRegisterHost", t->size);
            ex_report(o->prog, what, &e, NULL);
            return 1;
        }
        t->registered = 1;
    }
    return 0;
}

static void thread_cleanup(struct ex_thread *t) {
    if (t->registered) {
        hipObjError_t e = hipObjBufDeregister(t->buf);
        if (e.opError == hipObjBusy) {
            /* A token the server declined still holds the buffer until the
             * library's token deadline: hipObjShutdown releases it, and the
             * memory is freed after that. */
            t->keep_registered = 1;
        } else if (e.opError != hipObjSuccess) {
            ex_report(t->opt->prog, "hipObjBufDeregister", &e, NULL);
            t->keep_registered = 1;
            if (t->status == 0) {
                t->status = 1;
            }
        }
        t->registered = 0;
    }
    if (!t->keep_registered) {
        if (t->opt->device) {
            ex_gpu_free(t->buf);
        }
        free(t->host);
        t->buf = NULL;
        t->host = NULL;
    }
    ex_s3_free(t->s3);
    t->s3 = NULL;
}

/* The thread body's argument. */
struct thread_arg {
    struct run *run;
    struct ex_thread *t;
};

static void *thread_body(void *arg) {
    struct thread_arg *a = arg;
    struct run *r = a->run;
    struct ex_thread *t = a->t;
    if (thread_setup(r, t) != 0) {
        t->status = 1;
        pthread_mutex_lock(&r->lock);
        r->setup_failed = 1;
        pthread_mutex_unlock(&r->lock);
    }
    /* Every thread reports, ready or not, then waits for the start. */
    pthread_mutex_lock(&r->lock);
    r->ready++;
    pthread_cond_broadcast(&r->changed);
    while (!r->started) {
        pthread_cond_wait(&r->changed, &r->lock);
    }
    int go = !r->setup_failed;
    pthread_mutex_unlock(&r->lock);
    if (go) {
        t->start = ex_now();
        for (unsigned i = 0; i < r->opt->iterations && t->status == 0; i++) {
            t->status = r->ops->transfer(t, i);
        }
        t->end = ex_now();
        if (t->status == 0 && r->ops->finish != NULL) {
            t->status = r->ops->finish(t);
        }
    }
    thread_cleanup(t);
    return NULL;
}

static void print_summary(const struct run *r) {
    const struct ex_options *o = r->opt;
    uint64_t bytes = 0;
    unsigned transfers = 0, via_rdma = 0;
    const char *reason = NULL;
    double start = 0, end = 0;
    for (unsigned i = 0; i < o->threads; i++) {
        const struct ex_thread *t = &r->threads[i];
        bytes += t->bytes;
        transfers += t->transfers;
        via_rdma += t->via_rdma;
        if (reason == NULL && t->reason[0] != '\0') {
            reason = t->reason;
        }
        if (i == 0 || t->start < start) {
            start = t->start;
        }
        if (i == 0 || t->end > end) {
            end = t->end;
        }
    }
    double secs = end - start;
    double mibs = secs > 0 ? (double)bytes / (1024.0 * 1024.0) / secs : 0.0;
    printf("%s %s/%s: %" PRIu64 " bytes", r->ops->op, o->bucket, o->key, bytes);
    if (o->parts > 0) {
        printf(" in %u parts", o->parts);
    }
    printf(" in %.3f ms (%.1f MiB/s)", secs * 1000.0, mibs);
    if (o->threads > 1 || o->iterations > 1) {
        printf(" with %u threads x %u iterations", o->threads, o->iterations);
    }
    if (via_rdma == transfers) {
        printf(" via rdma\n");
    } else if (via_rdma == 0) {
        printf(" via fallback (%s)\n", reason != NULL ? reason : "?");
    } else {
        printf(" via both rdma and fallback (%u of %u transfers fell back: %s)\n",
               transfers - via_rdma, transfers, reason != NULL ? reason : "?");
    }
    fflush(stdout);
}

int ex_run(const struct ex_options *o, const struct ex_program_ops *ops) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "%s: curl_global_init failed\n", o->prog);
        return 1;
    }
    if (o->device && ex_gpu_load(o->prog, o->gpu) != 0) {
        curl_global_cleanup();
        return 1;
    }

    struct run r;
    memset(&r, 0, sizeof r);
    r.opt = o;
    r.ops = ops;
    static char init_reason[160];
    if (o->no_rdma) {
        r.reason = "--no-rdma";
    } else {
        hipObjConfig_t config;
        memset(&config, 0, sizeof config);
        config.endpoint = o->endpoint;
        config.region = o->region;
        config.accessKey = o->access_key;
        config.secretKey = o->secret_key;
        config.flags = 0;
        config.gpuDevice = o->gpu;
        config.nicHint = o->nic;
        /* The library says on stderr why an environmental failure happened. */
        fflush(stdout);
        hipObjError_t e = hipObjInit(&config);
        if (e.opError == hipObjSuccess) {
            r.rdma = 1;
        } else {
            if (e.hipError != 0) {
                snprintf(init_reason, sizeof init_reason, "hipObjInit: %s, hipError %d",
                         hipObjGetErrorString(e.opError), e.hipError);
            } else {
                snprintf(init_reason, sizeof init_reason, "hipObjInit: %s",
                         hipObjGetErrorString(e.opError));
            }
            r.reason = init_reason;
        }
    }

    r.threads = calloc(o->threads, sizeof *r.threads);
    struct thread_arg *args = calloc(o->threads, sizeof *args);
    pthread_t *ids = calloc(o->threads, sizeof *ids);
    int status = 0;
    if (r.threads == NULL || args == NULL || ids == NULL) {
        fprintf(stderr, "%s: out of memory\n", o->prog);
        status = 1;
        goto out;
    }
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.changed, NULL);
    for (unsigned i = 0; i < o->threads; i++) {
        struct ex_thread *t = &r.threads[i];
        t->opt = o;
        t->index = i;
        t->seed = o->seed + i;
        t->rdma = r.rdma;
        t->no_rdma_reason = r.reason;
        t->size = (size_t)o->size;
        if (o->threads > 1) {
            snprintf(t->key, sizeof t->key, "%s.%u", o->key, i);
        } else {
            snprintf(t->key, sizeof t->key, "%s", o->key);
        }
        args[i].run = &r;
        args[i].t = t;
    }
    unsigned started = 0;
    for (; started < o->threads; started++) {
        int err = pthread_create(&ids[started], NULL, thread_body, &args[started]);
        if (err != 0) {
            fprintf(stderr, "%s: pthread_create: %s\n", o->prog, strerror(err));
            break;
        }
    }
    /* The clock starts when every thread is set up (or one failed). */
    pthread_mutex_lock(&r.lock);
    if (started < o->threads) {
        r.setup_failed = 1;
        for (unsigned i = started; i < o->threads; i++) {
            r.threads[i].status = 1;
        }
    }
    while (r.ready < started) {
        pthread_cond_wait(&r.changed, &r.lock);
    }
    r.started = 1;
    pthread_cond_broadcast(&r.changed);
    pthread_mutex_unlock(&r.lock);
    for (unsigned i = 0; i < started; i++) {
        pthread_join(ids[i], NULL);
    }
    pthread_cond_destroy(&r.changed);
    pthread_mutex_destroy(&r.lock);

    int mismatch = 0;
    for (unsigned i = 0; i < o->threads; i++) {
        if (r.threads[i].status == 1) {
            status = 1;
        } else if (r.threads[i].status == 2) {
            mismatch = 1;
        }
    }
    if (status == 0) {
        print_summary(&r);
        status = mismatch ? 2 : 0;
    }

out:
    if (r.rdma) {
        hipObjShutdown();
    }
    if (r.threads != NULL) {
        /* Buffers a declined token kept registered: released by the shutdown above. */
        for (unsigned i = 0; i < o->threads; i++) {
            struct ex_thread *t = &r.threads[i];
            if (t->keep_registered) {
                if (o->device) {
                    ex_gpu_free(t->buf);
                }
                free(t->host);
            }
        }
    }
    free(ids);
    free(args);
    free(r.threads);
    curl_global_cleanup();
    return status;
}
