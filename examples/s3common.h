/*
 * s3common: what the example programs get-object, put-object and token-get
 * share. An application with its own S3 client (here libcurl, which signs
 * each request with CURLOPT_AWS_SIGV4) hands object data to libhipobj:
 *
 *  - the command line (ex_parse_args) and its usage text;
 *  - ex_s3_perform: one signed HTTP request, its status, the headers hipobj
 *    cares about (x-amz-rdma-reply, x-amz-rdma-bytes-transferred, ETag) and
 *    its body;
 *  - the byte pattern (ex_pattern_*);
 *  - device memory through HIP (libamdhip64) or the CUDA driver
 *    (libcuda.so.1), opened with dlopen (ex_gpu_*);
 *  - the run: hipObjInit, one thread per --threads with its own registered
 *    buffer, the timed transfers, the summary line, cleanup (ex_run).
 *
 * The pattern. The byte at object offset j for seed s is byte (j mod 8),
 * least significant first, of
 *
 *     mix64(floor(j / 8) + s * 0x9E3779B97F4A7C15)          (mod 2^64)
 *
 * where mix64 is SplitMix64's finalizer:
 *
 *     z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
 *     z ^= z >> 27; z *= 0x94D049BB133111EB;
 *     z ^= z >> 31;
 *
 * so every aligned 8-byte word of an object differs from its neighbours (no
 * short period), and a range read at any offset is checked against the same
 * function. With --threads T > 1, thread i uses seed s + i and key KEY.i.
 *
 * The summary line, one on stdout per run that moved its data:
 *
 *     OP BUCKET/KEY: N bytes[ in P parts] in T ms (R MiB/s)[ with T threads x I iterations] via HOW
 *
 * OP is GET or PUT; N counts every byte of every transfer; T is wall-clock
 * time from the moment all threads are ready (hipObjInit and registration
 * are done) until the last transfer ended; "in P parts" is for multipart
 * uploads, "with T threads x I iterations" appears when either is above 1.
 * HOW is "rdma", "fallback (REASON)" (every transfer went over plain HTTP),
 * or "both rdma and fallback (K of M transfers fell back: REASON)".
 *
 * Exit status: 0 on success; 1 on any failure (a message on stderr names the
 * hipobj error and the HTTP status); 2 when --pattern finds a byte that
 * differs (stderr names its object offset).
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef HIPOBJ_EXAMPLES_S3COMMON_H
#define HIPOBJ_EXAMPLES_S3COMMON_H

#include <hipobj.h>

#include <stddef.h>
#include <stdint.h>

/* Which program is running: decides the options it takes and its words. */
enum ex_program { EX_GET_OBJECT, EX_PUT_OBJECT, EX_TOKEN_GET };

/* The command line, parsed. */
struct ex_options {
    enum ex_program program;
    const char *prog;       /* program name, for messages */
    const char *endpoint;   /* http://host:port, no trailing slash */
    const char *access_key;
    const char *secret_key;
    const char *region;
    const char *nic;        /* nicHint, or NULL */
    int gpu;                /* gpuDevice for hipObjInit */
    int device;             /* --device: buffers in device memory */
    uint64_t size;
    int have_size;
    uint64_t offset;        /* get: object offset of the range */
    int have_offset;        /* get: send a Range header */
    const char *file;
    uint64_t seed;
    int have_pattern;
    unsigned parts;         /* put: 0 = a single PutObject */
    unsigned threads;
    unsigned iterations;
    unsigned stall_seconds; /* longest silence of an HTTP exchange */
    int no_rdma;
    const char *bucket;
    const char *key;
};

/*
 * Parses argv into *o for `program`. Prints the usage text and returns 0 for
 * --help (the caller exits 0); prints what is wrong to stderr and returns -1
 * on a bad command line (the caller exits 1); returns 1 when the run should
 * go on.
 */
int ex_parse_args(struct ex_options *o, enum ex_program program, int argc, char **argv);

/* ------------------------------------------------------------------ pattern */

/* The pattern's byte at object offset `j` for seed `seed`. */
unsigned char ex_pattern_byte(uint64_t seed, uint64_t j);

/* Fills dst[0..len) with the pattern of `seed` from object offset `start`. */
void ex_pattern_fill(unsigned char *dst, size_t len, uint64_t seed, uint64_t start);

/*
 * Checks buf[0..len) against the pattern of `seed` from object offset
 * `start`. Returns 1 when it matches; else 0, with the object offset of the
 * first differing byte in *first_bad.
 */
int ex_pattern_check(const unsigned char *buf, size_t len, uint64_t seed, uint64_t start,
                     uint64_t *first_bad);

/* ------------------------------------------------------------------- timing */

/* Seconds on the monotonic clock. */
double ex_now(void);

/* --------------------------------------------------------------- device memory */

/*
 * Loads the GPU runtime once: HIP when it loads and sees a GPU, else the
 * CUDA driver (as libhipobj chooses with HIPOBJ_GPU_RUNTIME=auto), and
 * checks that GPU `gpu` (or the current device for -1) exists. Returns 0,
 * or -1 after printing why (both runtimes' reasons) to stderr.
 */
int ex_gpu_load(const char *prog, int gpu);

/* "HIP", "CUDA", or "none" before a successful ex_gpu_load. */
const char *ex_gpu_runtime(void);

/* Makes `gpu` the calling thread's device (HIP: nothing for -1; CUDA: the
 * device's primary context, device 0 for -1). */
int ex_gpu_set_device(const char *prog, int gpu);

/* Allocates device memory; NULL after a message on stderr. */
void *ex_gpu_malloc(const char *prog, size_t size);

/* Frees it. */
void ex_gpu_free(void *ptr);

/* Copies `size` bytes, host to device when `to_device`, else device to
 * host; 0, or -1 after a message on stderr. */
int ex_gpu_copy(const char *prog, void *dst, const void *src, size_t size, int to_device);

/* ------------------------------------------------------------------ S3 over HTTP */

/* Per-thread HTTP state: one libcurl easy handle, so connections are reused. */
struct ex_s3;

/* A request. Unset fields are 0/NULL. */
struct ex_request {
    const char *method;      /* "GET", "PUT" or "POST" */
    const char *query;       /* canonical query string (sorted, encoded, "k=v"), or NULL */
    const char *token;       /* x-amz-rdma-token value, or NULL */
    int has_range;           /* Range: bytes=range_first-range_last */
    uint64_t range_first;
    uint64_t range_last;
    const unsigned char *body; /* PUT/POST body, body_len bytes (may be 0 with body != NULL) */
    size_t body_len;
    const char *content_type; /* Content-Type of a POST body */
    unsigned char *sink;     /* where a 2xx response body goes (sink_cap bytes), or NULL */
    size_t sink_cap;
};

/* What came back. */
struct ex_response {
    int completed;            /* the HTTP exchange finished (any status) */
    long status;              /* final HTTP status */
    int has_rdma_reply;
    char rdma_reply[512];     /* x-amz-rdma-reply value, NUL-terminated */
    int has_bytes_transferred;
    uint64_t bytes_transferred; /* x-amz-rdma-bytes-transferred */
    char etag[256];           /* ETag, quotes included */
    size_t body_len;          /* bytes of a 2xx body stored in the sink */
    int body_overflow;        /* the 2xx body did not fit the sink */
    char text[4096];          /* any other body (error XML, or a 2xx body without sink), cut */
    size_t text_len;
    char error[256];          /* libcurl's error when !completed */
};

/*
 * Appends `text` percent-encoded (RFC 3986 unreserved characters kept, and
 * '/' when keep_slash) at out[*len], NUL-terminated, within `cap` bytes.
 * Returns 0, or -1 when it does not fit.
 */
int ex_url_encode(char *out, size_t cap, size_t *len, const char *text, int keep_slash);

/* Copies the text of the first <tag>...</tag> of `xml` into out; 0 if none. */
int ex_xml_value(const char *xml, const char *tag, char *out, size_t cap);

/*
 * Clears *rq and makes it `method` on the object with `query` (or NULL) and,
 * when `xml` is not NULL, that NUL-terminated XML document as its body (the
 * multipart calls).
 */
void ex_xml_request(struct ex_request *rq, const char *method, const char *query, const char *xml);

/* A new handle for `key` (the object this thread works on); NULL on failure. */
struct ex_s3 *ex_s3_new(const struct ex_options *o, const char *key);

/* Releases the handle and its connections. */
void ex_s3_free(struct ex_s3 *s3);

/*
 * Performs the request on this handle's object, signed with SigV4. Returns
 * 0 when an HTTP response arrived (whatever its status), -1 when libcurl
 * failed (the reason in rs->error).
 */
int ex_s3_perform(struct ex_s3 *s3, const struct ex_request *rq, struct ex_response *rs);

/*
 * The reply the library is handed: the x-amz-rdma-reply header, or the HTTP
 * status as three digits when the header is absent.
 */
const char *ex_reply_of(const struct ex_response *rs, char digits[4]);

/* Whether the response's reply says that the server declined RDMA (501). */
int ex_declined(const struct ex_response *rs);

/*
 * Prints "PROG: WHAT: hipobj ERROR, HTTP STATUS, x-amz-rdma-reply R: CODE: MESSAGE"
 * to stderr; `err` and `rs` may be NULL (no library call, no response).
 */
void ex_report(const char *prog, const char *what, const hipObjError_t *err,
               const struct ex_response *rs);

/* ------------------------------------------------------------------------ the run */

/* One thread's state, as the programs' hooks see it. */
struct ex_thread {
    const struct ex_options *opt;
    unsigned index;
    char key[1024];          /* KEY, or KEY.i with several threads */
    uint64_t seed;           /* seed + i */
    int rdma;                /* hipObjInit succeeded: try the library first */
    const char *no_rdma_reason;
    struct ex_s3 *s3;
    void *buf;               /* the transfer buffer: host memory, or device memory */
    unsigned char *host;     /* host memory: buf itself; device memory: a host mirror */
    size_t size;             /* bytes of buf */
    int registered;
    int keep_registered;     /* deregistration refused (Busy): release after hipObjShutdown */
    int declined;            /* the server declined RDMA (token-get stops asking) */
    uint64_t bytes;          /* moved, all iterations */
    unsigned transfers;      /* counted transfers */
    unsigned via_rdma;       /* of which over RDMA */
    char reason[160];        /* the first fallback reason */
    int status;              /* 0, 1 failure, 2 pattern mismatch */
    double start, end;
};

/* Counts a transfer of `bytes`, over RDMA or by fallback for `reason`. */
void ex_count(struct ex_thread *t, uint64_t bytes, int rdma, const char *reason);

/* The programs' parts of a run. */
struct ex_program_ops {
    const char *op;                                   /* "GET" or "PUT" */
    int (*prepare)(struct ex_thread *t);              /* fill the buffer (before registration) */
    int (*transfer)(struct ex_thread *t, unsigned iteration);
    int (*finish)(struct ex_thread *t);               /* verify, write --file */
};

/*
 * Runs the program: hipObjInit (unless --no-rdma), the threads, the summary
 * line, cleanup. Returns the exit status.
 */
int ex_run(const struct ex_options *o, const struct ex_program_ops *ops);

/* hipObjOps_t callbacks that perform `rq` on `s3` with the library's token. */
struct ex_callback_ctx {
    struct ex_s3 *s3;
    const struct ex_request *rq;
    struct ex_response *rs;
    int sent;                /* sendRequest ran */
};

/* The hipObjOps_t whose callbacks take a struct ex_callback_ctx. */
extern const hipObjOps_t ex_callbacks;

/*
 * Moves the `expected` bytes of a 2xx GET body (in t->host) into the
 * thread's buffer (hipMemcpy for device memory). Returns 0; 1 after a
 * message when the body has another length; -1 for a response that is not
 * a 2xx one (no message).
 */
int ex_land_body(struct ex_thread *t, const struct ex_response *rs, size_t expected);

/* The GET of this thread's object: its Range, its sink (t->host). */
void ex_get_request(const struct ex_thread *t, struct ex_request *rq);

/*
 * The GET over plain HTTP, counted as a fallback for `reason`: uses the body
 * of `declined` (the response in which the server declined RDMA) when it
 * carries the object, else sends the request again without a token.
 * Returns 0, or 1 after a message.
 */
int ex_plain_get(struct ex_thread *t, const struct ex_response *declined, const char *reason);

/*
 * The end of a GET thread: copies a device buffer to its host mirror, writes
 * --file (PATH.i with several threads), checks --pattern. Returns 0, 1 after
 * a message, or 2 after naming the first differing object offset.
 */
int ex_get_finish(struct ex_thread *t);

/*
 * After the library reported success: checks that the HTTP status is 2xx
 * and that x-amz-rdma-bytes-transferred, when present, is `expected`.
 * Returns 0, or 1 after a message.
 */
int ex_check_rdma(struct ex_thread *t, const char *what, const struct ex_response *rs,
                  uint64_t expected);

#endif /* HIPOBJ_EXAMPLES_S3COMMON_H */
