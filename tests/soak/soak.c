/*
 * soak: the fault soak's client (scripts/vm/soak.sh runs it in the VM, with
 * scripts/vm/soak-guest.sh injecting the faults). One process, as an
 * application is: hipObjInit once, THREADS threads, each with one registered
 * 8 MiB buffer and its own objects, doing mixed transfers for as long as the
 * faults last and then for a calm period after them:
 *
 *   GET of a whole object, GET of a random range of one, PUT of a new
 *   version (1 byte to 8 MiB, sizes spread evenly over their powers of two),
 *   and a two-part multipart upload (5 MiB and the rest, S3's smallest part).
 *
 * Every byte read is checked against the pattern of the version the thread
 * wrote last. A transfer that fails leaves its object either at the old
 * version or at the new one (a PUT is whole or not at all): the thread reads
 * the object back over plain HTTP and must find exactly one of the two.
 *
 * A transfer ends in one of:
 *   ok        the right bytes (GET), or the server stored them (PUT);
 *   fallback  the server declined RDMA (501) and plain HTTP moved them;
 *   an error  hipObjRdmaError, hipObjS3Error or hipObjBusy, with the HTTP
 *             status or "no HTTP response": the codes a transfer may end in
 *             when the server or the fabric fails (README).
 * The soak fails on: a wrong byte, another error code, a transfer that took
 * longer than --deadline-seconds (default 60: curl connects within 10 s and
 * gives up after 10 s without a byte, the library waits 5 s for the final
 * message; a watchdog ends the process at twice that),
 * a thread whose last transfers of the calm period were not all ok, or file
 * descriptors or RDMA resources (`rdma resource show`, this process's) that
 * hipObjShutdown did not bring back to where they were before hipObjInit.
 *
 *   soak --endpoint URL --access-key AK --secret-key SK --nic NIC
 *        --ready-file PATH --calm-file PATH [--threads N] [--calm-seconds S]
 *        [--deadline-seconds S] [--stall-seconds S] [--max-seconds S] BUCKET
 *
 * It creates --ready-file when its threads run; the fault harness creates
 * --calm-file when the last fault is undone. The calm period (default 60 s)
 * starts then, and lasts until every thread also began RECOVERED_RUN + 1
 * transfers in it (at most its length again plus two deadlines). The tally goes to stdout, one `soak:` line per outcome and
 * phase; exit status 0 when nothing failed, 1 otherwise.
 *
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L

#include "s3common.h"

#include <curl/curl.h>
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define MAX_SIZE (8 * MIB)
#define PART_SIZE (5 * MIB)
#define KEYS 4
#define MAX_THREADS 64
#define MAX_CLASSES 128
/* The calm period's last transfers of each thread that must all be ok. */
#define RECOVERED_RUN 3

enum phase { FAULTS, CALM, PHASES };
static const char *const phase_name[PHASES] = {"faults", "calm"};

/* ------------------------------------------------------------------- the tally */

struct tally {
    pthread_mutex_t lock;
    unsigned n;
    char name[MAX_CLASSES][160];
    uint64_t count[MAX_CLASSES][PHASES];
    uint64_t bytes[PHASES];
    double slowest[PHASES];
    char slowest_name[PHASES][160];
    unsigned failures; /* reasons the soak fails */
};

static struct tally tally = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void count(enum phase p, const char *name, uint64_t bytes, double seconds) {
    pthread_mutex_lock(&tally.lock);
    unsigned i = 0;
    while (i < tally.n && strcmp(tally.name[i], name) != 0) {
        i++;
    }
    if (i == tally.n && tally.n < MAX_CLASSES) {
        snprintf(tally.name[i], sizeof tally.name[i], "%s", name);
        tally.n++;
    }
    if (i < tally.n) {
        tally.count[i][p]++;
    }
    tally.bytes[p] += bytes;
    if (seconds > tally.slowest[p]) {
        tally.slowest[p] = seconds;
        snprintf(tally.slowest_name[p], sizeof tally.slowest_name[p], "%s", name);
    }
    pthread_mutex_unlock(&tally.lock);
}

static void fail(const char *fmt, const char *a, const char *b) {
    pthread_mutex_lock(&tally.lock);
    tally.failures++;
    fprintf(stderr, "soak: FAILED: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    pthread_mutex_unlock(&tally.lock);
}

/* ------------------------------------------------------------------ the run */

struct version {
    uint64_t seed;
    size_t size;
    int present; /* 0: no object */
};

struct object {
    char key[64];
    struct ex_s3 *s3;
    struct version now;  /* what the server holds, when !unsure */
    struct version maybe; /* when unsure: the server holds `now` or this */
    int unsure;
};

struct worker {
    unsigned index;
    pthread_t id;
    uint64_t rng;
    uint64_t versions;
    unsigned char *buf;
    int registered;
    struct object obj[KEYS];
    unsigned calm_ok_run; /* ok transfers in a row, calm period */
    atomic_uint calm_transfers; /* read by the main thread while it runs */
    _Atomic long long op_started_ms; /* 0 between transfers */
    _Atomic(const char *) op;
};

static struct ex_options opt;
static const char *ready_file, *calm_file;
static unsigned threads = 16, calm_seconds = 60, deadline_seconds = 60, max_seconds = 7200;
static struct worker workers[MAX_THREADS];
static atomic_int calm, stop;
static double calm_since;

static long long now_ms(void) {
    return (long long)(ex_now() * 1000.0);
}

static uint64_t next(struct worker *w) {
    /* xorshift64* */
    w->rng ^= w->rng >> 12;
    w->rng ^= w->rng << 25;
    w->rng ^= w->rng >> 27;
    return w->rng * 0x2545F4914F6CDD1DULL;
}

/* 1 byte to MAX_SIZE, each power of two as likely as the next. */
static size_t pick_size(struct worker *w) {
    unsigned bits = (unsigned)(next(w) % 24); /* 2^0 .. 2^23 */
    size_t low = (size_t)1 << bits;
    size_t size = low + (size_t)(next(w) % low);
    return size > MAX_SIZE ? MAX_SIZE : size;
}

static enum phase phase_now(void) {
    return atomic_load(&calm) ? CALM : FAULTS;
}

/* The class of a failed library call: its code and what HTTP said. */
static void failure_class(char *out, size_t cap, const char *op, hipObjError_t e, int sent,
                          const struct ex_response *rs) {
    char http[64];
    if (!sent) {
        snprintf(http, sizeof http, "no request sent");
    } else if (!rs->completed) {
        snprintf(http, sizeof http, "no HTTP response");
    } else {
        snprintf(http, sizeof http, "HTTP %ld", rs->status);
    }
    snprintf(out, cap, "%s failed: %s, %s", op, hipObjGetErrorString(e.opError), http);
}

static int documented(hipObjOpError_t code) {
    return code == hipObjRdmaError || code == hipObjS3Error || code == hipObjBusy;
}

/* Ends one transfer: counts it, checks its time. `ok`: it ended well. */
static void finish_detail(struct worker *w, const char *class, int ok, uint64_t bytes,
                          double start, const char *detail) {
    double took = ex_now() - start;
    enum phase p = phase_now();
    if (p == CALM && !ok) {
        /* The faults are over: every failure now is worth its line. */
        fprintf(stderr, "soak: calm +%.1f s: thread %u: %s after %.1f s%s%s\n",
                ex_now() - calm_since, w->index, class, took, detail[0] ? ": " : "", detail);
    }
    count(p, class, ok ? bytes : 0, took);
    atomic_store(&w->op_started_ms, 0);
    if (took > deadline_seconds) {
        char secs[32];
        snprintf(secs, sizeof secs, "%.1f", took);
        fail("a transfer took %s s: %s", secs, class);
    }
    if (p == CALM) {
        atomic_fetch_add(&w->calm_transfers, 1);
        w->calm_ok_run = ok ? w->calm_ok_run + 1 : 0;
    }
    if (!ok) {
        /* As an application would: not spinning on a server that is down. */
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void finish(struct worker *w, const char *class, int ok, uint64_t bytes, double start) {
    finish_detail(w, class, ok, bytes, start, "");
}

static void begin(struct worker *w, const char *op) {
    atomic_store(&w->op, op);
    atomic_store(&w->op_started_ms, now_ms());
}

/* Checks len bytes at w->buf against `v` from object offset `start`. */
static int check_bytes(struct worker *w, const struct object *o, const struct version *v,
                       uint64_t start, size_t len, const char *op) {
    uint64_t bad = 0;
    if (ex_pattern_check(w->buf, len, v->seed, start, &bad)) {
        return 1;
    }
    char where[160];
    snprintf(where, sizeof where, "%s at object offset %" PRIu64 " (seed %" PRIu64 ", %zu bytes)",
             o->key, bad, v->seed, v->size);
    fail("%s: a wrong byte in %s", op, where);
    return 0;
}

/* GET of [start, start + len) of o, which holds v, into w->buf by RDMA. */
static void get(struct worker *w, struct object *o, uint64_t start, size_t len, int ranged) {
    const char *op = ranged ? "get-range" : "get";
    struct version v = o->now;
    struct ex_request rq;
    struct ex_response rs;
    memset(&rq, 0, sizeof rq);
    memset(&rs, 0, sizeof rs);
    rq.method = "GET";
    if (ranged) {
        rq.has_range = 1;
        rq.range_first = start;
        rq.range_last = start + len - 1;
    }
    rq.sink = w->buf;
    rq.sink_cap = len;
    /* Stale bytes must not pass for the right ones. */
    memset(w->buf, 0xA5 ^ (int)(w->versions & 0xFF), len);
    struct ex_callback_ctx cx = {o->s3, &rq, &rs, 0};
    hipObjOps_t ops = ex_callbacks;
    double t0 = ex_now();
    begin(w, op);
    hipObjError_t e = hipObjGet(NULL, w->buf, len, 0, &ops, &cx);
    char class[160];
    if (e.opError == hipObjSuccess) {
        int fine = rs.completed && rs.status / 100 == 2 &&
                   (!rs.has_bytes_transferred || rs.bytes_transferred == len);
        if (!fine) {
            snprintf(class, sizeof class, "%s: success but HTTP %ld, %" PRIu64 " bytes moved", op,
                     rs.status, rs.bytes_transferred);
            fail("%s (%s)", class, o->key);
            finish(w, class, 0, 0, t0);
            return;
        }
        int right = check_bytes(w, o, &v, start, len, op);
        snprintf(class, sizeof class, "%s %s", op, right ? "ok" : "WRONG BYTES");
        finish(w, class, right, len, t0);
        return;
    }
    if (e.opError == hipObjS3Error && cx.sent && ex_declined(&rs) && rs.completed &&
        rs.status / 100 == 2) {
        /* Declined: the same response carried the bytes. */
        int right = !rs.body_overflow && rs.body_len == len && check_bytes(w, o, &v, start, len, op);
        snprintf(class, sizeof class, "%s fallback %s", op, right ? "ok" : "WRONG BYTES");
        if (!right) {
            fail("%s: %s", class, o->key);
        }
        finish(w, class, right, len, t0);
        return;
    }
    failure_class(class, sizeof class, op, e, cx.sent, &rs);
    if (!documented(e.opError)) {
        fail("%s (%s): not a code a failed transfer ends in", class, o->key);
    }
    finish_detail(w, class, 0, 0, t0, rs.completed ? rs.text : rs.error);
}

/* PUT of w->buf[off, off + len) to o: the whole object (query NULL) or a part. */
static int put_bytes(struct worker *w, struct object *o, const char *query, size_t off, size_t len,
                     const char *op, char *etag) {
    static const unsigned char no_body[1] = {0};
    struct ex_request rq;
    struct ex_response rs;
    memset(&rq, 0, sizeof rq);
    memset(&rs, 0, sizeof rs);
    rq.method = "PUT";
    rq.query = query;
    rq.body = no_body;
    rq.body_len = 0;
    struct ex_callback_ctx cx = {o->s3, &rq, &rs, 0};
    hipObjOps_t ops = ex_callbacks;
    double t0 = ex_now();
    begin(w, op);
    hipObjError_t e = hipObjPut(NULL, w->buf, len, (off_t)off, &ops, &cx);
    char class[160];
    if (e.opError == hipObjSuccess) {
        int fine = rs.completed && rs.status / 100 == 2 &&
                   (!rs.has_bytes_transferred || rs.bytes_transferred == len);
        snprintf(class, sizeof class, "%s %s", op, fine ? "ok" : "success without a 2xx");
        if (!fine) {
            fail("%s (%s)", class, o->key);
        }
        snprintf(etag, 256, "%s", rs.etag);
        finish(w, class, fine, len, t0);
        return fine ? 0 : -1;
    }
    if (e.opError == hipObjS3Error && cx.sent && ex_declined(&rs)) {
        rq.body = w->buf + off;
        rq.body_len = len;
        int fine = ex_s3_perform(o->s3, &rq, &rs) == 0 && rs.status / 100 == 2;
        snprintf(class, sizeof class, "%s fallback %s", op, fine ? "ok" : "failed");
        snprintf(etag, 256, "%s", rs.etag);
        finish(w, class, fine, len, t0);
        return fine ? 0 : -1;
    }
    failure_class(class, sizeof class, op, e, cx.sent, &rs);
    if (!documented(e.opError)) {
        fail("%s (%s): not a code a failed transfer ends in", class, o->key);
    }
    finish_detail(w, class, 0, 0, t0, rs.completed ? rs.text : rs.error);
    return -1;
}

/* A plain HTTP request on o's object (the multipart calls, the read-back). */
static int plain(struct worker *w, struct object *o, const char *method, const char *query,
                 const char *body, unsigned char *sink, size_t cap, struct ex_response *rs,
                 const char *op) {
    struct ex_request rq;
    ex_xml_request(&rq, method, query, body);
    rq.sink = sink;
    rq.sink_cap = cap;
    double t0 = ex_now();
    begin(w, op);
    int r = ex_s3_perform(o->s3, &rq, rs);
    int fine = r == 0 && rs->status / 100 == 2 && strstr(rs->text, "<Error>") == NULL;
    char class[160];
    if (fine) {
        snprintf(class, sizeof class, "%s ok", op);
    } else if (r != 0) {
        snprintf(class, sizeof class, "%s failed: no HTTP response", op);
    } else {
        snprintf(class, sizeof class, "%s failed: HTTP %ld", op, rs->status);
    }
    finish_detail(w, class, fine, 0, t0, r != 0 ? rs->error : "");
    return fine ? 0 : -1;
}

/* A new version of o in w->buf: its seed and size. */
static struct version new_version(struct worker *w, size_t size) {
    struct version v = {((uint64_t)(w->index + 1) << 40) | ++w->versions, size, 1};
    ex_pattern_fill(w->buf, size, v.seed, 0);
    return v;
}

/* The PUT went wrong somewhere: the server holds the old version or v. */
static void unsure(struct object *o, struct version v) {
    o->maybe = v;
    o->unsure = 1;
}

static void put(struct worker *w, struct object *o) {
    struct version v = new_version(w, pick_size(w));
    char etag[256];
    if (put_bytes(w, o, NULL, 0, v.size, "put", etag) == 0) {
        o->now = v;
    } else {
        unsure(o, v);
    }
}

static void multipart(struct worker *w, struct object *o) {
    size_t size = PART_SIZE + 1 + (size_t)(next(w) % (MAX_SIZE - PART_SIZE));
    struct version v = new_version(w, size);
    struct ex_response rs;
    if (plain(w, o, "POST", "uploads=", NULL, NULL, 0, &rs, "multipart-create") != 0) {
        return; /* nothing changed */
    }
    char id[512], query[1600] = "uploadId=";
    size_t qlen = strlen(query);
    if (!ex_xml_value(rs.text, "UploadId", id, sizeof id) || id[0] == '\0' ||
        ex_url_encode(query, sizeof query, &qlen, id, 0) != 0) {
        fail("multipart-create: %s: %s", o->key, "no usable UploadId");
        return;
    }
    char etags[2][256];
    int status = 0;
    for (unsigned k = 1; k <= 2 && status == 0; k++) {
        char part_query[1700];
        snprintf(part_query, sizeof part_query, "partNumber=%u&%s", k, query);
        size_t off = k == 1 ? 0 : PART_SIZE;
        size_t len = k == 1 ? PART_SIZE : size - PART_SIZE;
        status = put_bytes(w, o, part_query, off, len, "multipart-part", etags[k - 1]);
    }
    if (status == 0) {
        char xml[1024];
        snprintf(xml, sizeof xml,
                 "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                 "<Part><PartNumber>1</PartNumber><ETag>%s</ETag></Part>"
                 "<Part><PartNumber>2</PartNumber><ETag>%s</ETag></Part>"
                 "</CompleteMultipartUpload>",
                 etags[0], etags[1]);
        if (plain(w, o, "POST", query, xml, NULL, 0, &rs, "multipart-complete") == 0) {
            o->now = v;
            return;
        }
        /* A Complete without an answer may have completed. */
        unsure(o, v);
    }
    (void)plain(w, o, "DELETE", query, NULL, NULL, 0, &rs, "multipart-abort");
}

/* Whether w->buf[0, len) is version v whole. */
static int is_version(struct worker *w, const struct version *v, size_t len) {
    uint64_t bad;
    return v->present && v->size == len && ex_pattern_check(w->buf, len, v->seed, 0, &bad);
}

/* Reads an unsure object back over plain HTTP: it must be one version, whole. */
static void resolve(struct worker *w, struct object *o) {
    struct ex_response rs;
    memset(w->buf, 0x5A, MAX_SIZE);
    int r = plain(w, o, "GET", NULL, NULL, w->buf, MAX_SIZE, &rs, "read-back");
    if (r != 0 && !(rs.completed && rs.status == 404)) {
        return; /* try again later */
    }
    struct version absent = {0, 0, 0};
    if (r != 0) {
        if (!o->now.present) {
            o->now = absent;
            o->unsure = 0;
            return;
        }
        fail("read-back: %s: %s", o->key, "gone, though a version of it was stored");
        return;
    }
    if (rs.body_overflow) {
        fail("read-back: %s: %s", o->key, "longer than any version written");
        return;
    }
    if (is_version(w, &o->now, rs.body_len)) {
        o->unsure = 0;
    } else if (is_version(w, &o->maybe, rs.body_len)) {
        o->now = o->maybe;
        o->unsure = 0;
    } else {
        fail("read-back: %s: %s", o->key, "neither the old version nor the new one, whole");
    }
}

static void one_transfer(struct worker *w) {
    struct object *o = &w->obj[next(w) % KEYS];
    if (o->unsure) {
        resolve(w, o);
        return;
    }
    unsigned dice = (unsigned)(next(w) % 100);
    if (!o->now.present || dice < 25) {
        put(w, o);
    } else if (dice < 32) {
        multipart(w, o);
    } else if (dice < 66) {
        get(w, o, 0, o->now.size, 0);
    } else {
        uint64_t start = next(w) % o->now.size;
        size_t len = 1 + (size_t)(next(w) % (o->now.size - start));
        get(w, o, start, len, 1);
    }
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void *worker_body(void *arg) {
    struct worker *w = arg;
    while (!atomic_load(&stop)) {
        one_transfer(w);
    }
    return NULL;
}

/* Ends the process when a transfer outlives twice its deadline. */
static void *watchdog(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        long long now = now_ms();
        for (unsigned i = 0; i < threads; i++) {
            long long t = atomic_load(&workers[i].op_started_ms);
            if (t != 0 && now - t > 2000LL * deadline_seconds) {
                fprintf(stderr, "soak: FAILED: thread %u: %s has not returned in %lld s\n", i,
                        atomic_load(&workers[i].op), (now - t) / 1000);
                fflush(stderr);
                _exit(1);
            }
        }
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* This process's open file descriptors. */
static unsigned open_fds(void) {
    unsigned n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n - 1; /* the directory's own */
}

/* This process's RDMA resources, from `rdma resource show TYPE`: a line each. */
static void rdma_resources(char *out, size_t cap) {
    static const char *const types[] = {"qp", "cq", "mr", "pd", "cm_id", "ctx"};
    /* "... pid N comm NAME", or the line ends at the pid. */
    char pid[32], last[32];
    snprintf(pid, sizeof pid, " pid %ld ", (long)getpid());
    snprintf(last, sizeof last, " pid %ld\n", (long)getpid());
    size_t len = 0;
    out[0] = '\0';
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rdma resource show %s 2>&1", types[t]);
        FILE *p = popen(cmd, "r");
        unsigned n = 0;
        char line[1024];
        while (p != NULL && fgets(line, sizeof line, p) != NULL) {
            n += strstr(line, pid) != NULL || strstr(line, last) != NULL;
        }
        if (p != NULL) {
            pclose(p);
        }
        len += (size_t)snprintf(out + len, cap - len, "%s%s %u", t == 0 ? "" : ", ", types[t], n);
    }
}

static int parse_args(int argc, char **argv) {
    memset(&opt, 0, sizeof opt);
    opt.program = EX_GET_OBJECT;
    opt.prog = "soak";
    opt.region = "us-east-1";
    opt.gpu = -1;
    opt.stall_seconds = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' && opt.bucket == NULL) {
            opt.bucket = a;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "soak: %s needs a value (see the top of tests/soak/soak.c)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        unsigned long n = strtoul(v, NULL, 10);
        if (strcmp(a, "--endpoint") == 0) {
            opt.endpoint = v;
        } else if (strcmp(a, "--access-key") == 0) {
            opt.access_key = v;
        } else if (strcmp(a, "--secret-key") == 0) {
            opt.secret_key = v;
        } else if (strcmp(a, "--nic") == 0) {
            opt.nic = v;
        } else if (strcmp(a, "--ready-file") == 0) {
            ready_file = v;
        } else if (strcmp(a, "--calm-file") == 0) {
            calm_file = v;
        } else if (strcmp(a, "--threads") == 0 && n >= 1 && n <= MAX_THREADS) {
            threads = (unsigned)n;
        } else if (strcmp(a, "--calm-seconds") == 0 && n >= 1) {
            calm_seconds = (unsigned)n;
        } else if (strcmp(a, "--deadline-seconds") == 0 && n >= 1) {
            deadline_seconds = (unsigned)n;
        } else if (strcmp(a, "--stall-seconds") == 0 && n >= 1) {
            opt.stall_seconds = (unsigned)n;
        } else if (strcmp(a, "--max-seconds") == 0 && n >= 1) {
            max_seconds = (unsigned)n;
        } else {
            fprintf(stderr, "soak: bad option %s %s\n", a, v);
            return -1;
        }
    }
    if (opt.endpoint == NULL || opt.access_key == NULL || opt.secret_key == NULL ||
        opt.nic == NULL || ready_file == NULL || calm_file == NULL || opt.bucket == NULL) {
        fprintf(stderr, "soak: --endpoint, --access-key, --secret-key, --nic, --ready-file, "
                        "--calm-file and BUCKET are needed\n");
        return -1;
    }
    return 0;
}

static void print_tally(void) {
    for (enum phase p = FAULTS; p < PHASES; p++) {
        uint64_t total = 0;
        for (unsigned i = 0; i < tally.n; i++) {
            if (tally.count[i][p] > 0) {
                printf("soak: %-6s %8" PRIu64 "  %s\n", phase_name[p], tally.count[i][p],
                       tally.name[i]);
                total += tally.count[i][p];
            }
        }
        printf("soak: %-6s %8" PRIu64
               "  transfers and requests, %.1f MiB moved, slowest %.1f s (%s)\n",
               phase_name[p], total, (double)tally.bytes[p] / (double)MIB, tally.slowest[p],
               tally.slowest_name[p]);
    }
}

int main(int argc, char **argv) {
    if (parse_args(argc, argv) != 0) {
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "soak: curl_global_init failed\n");
        return 1;
    }
    char pristine[256], before[256], held[256], after[256];
    unsigned fds_pristine = open_fds();
    rdma_resources(pristine, sizeof pristine);

    hipObjConfig_t config;
    memset(&config, 0, sizeof config);
    config.endpoint = opt.endpoint;
    config.region = opt.region;
    config.accessKey = opt.access_key;
    config.secretKey = opt.secret_key;
    config.gpuDevice = -1;
    config.nicHint = opt.nic;
    /* A first hipObjInit and hipObjShutdown: librdmacm opens a verbs context
     * for each device an rdma_cm_id binds to and keeps it open (two file
     * descriptors) until the process exits, whoever uses it. The soak's
     * resources are counted from after that. */
    hipObjError_t e = hipObjInit(&config);
    if (e.opError != hipObjSuccess) {
        fprintf(stderr, "soak: hipObjInit: %s\n", hipObjGetErrorString(e.opError));
        return 1;
    }
    hipObjShutdown();
    unsigned fds_before = open_fds();
    rdma_resources(before, sizeof before);
    e = hipObjInit(&config);
    if (e.opError != hipObjSuccess) {
        fprintf(stderr, "soak: hipObjInit: %s\n", hipObjGetErrorString(e.opError));
        return 1;
    }
    int status = 0;
    unsigned started = 0;
    for (unsigned i = 0; i < threads && status == 0; i++) {
        struct worker *w = &workers[i];
        w->index = i;
        w->rng = 0x9E3779B97F4A7C15ULL * (i + 1) ^ (uint64_t)time(NULL);
        w->buf = aligned_alloc(4096, MAX_SIZE);
        if (w->buf == NULL) {
            status = 1;
            break;
        }
        e = hipObjBufRegisterHost(w->buf, MAX_SIZE);
        if (e.opError != hipObjSuccess) {
            fprintf(stderr, "soak: hipObjBufRegisterHost: %s\n", hipObjGetErrorString(e.opError));
            status = 1;
            break;
        }
        w->registered = 1;
        for (unsigned k = 0; k < KEYS; k++) {
            snprintf(w->obj[k].key, sizeof w->obj[k].key, "soak/t%u/k%u", i, k);
            w->obj[k].s3 = ex_s3_new(&opt, w->obj[k].key);
            if (w->obj[k].s3 == NULL) {
                status = 1;
            }
        }
    }
    pthread_t dog;
    int dog_started = 0;
    if (status == 0) {
        dog_started = pthread_create(&dog, NULL, watchdog, NULL) == 0;
        for (; started < threads; started++) {
            if (pthread_create(&workers[started].id, NULL, worker_body, &workers[started]) != 0) {
                fprintf(stderr, "soak: pthread_create failed\n");
                status = 1;
                break;
            }
        }
    }
    if (status == 0) {
        FILE *f = fopen(ready_file, "w");
        if (f != NULL) {
            fclose(f);
        }
        printf("soak: %u threads running; before any hipObjInit: %u file descriptors, RDMA "
               "resources %s; after a first hipObjInit and hipObjShutdown: %u, %s\n",
               threads, fds_pristine, pristine, fds_before, before);
        double begun = ex_now();
        while (!exists(calm_file) && ex_now() - begun < max_seconds) {
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (!exists(calm_file)) {
            fail("%s did not appear in time%s", calm_file, "");
        }
        calm_since = ex_now();
        atomic_store(&calm, 1);
        printf("soak: calm after %.0f s of faults\n", calm_since - begun);
        struct timespec ts = {(time_t)calm_seconds, 0};
        nanosleep(&ts, NULL);
        /* A thread whose first transfer of the calm period was a slow one
         * (begun under the faults, or a connection found dead the slow way)
         * may not have had RECOVERED_RUN since: the calm period goes on
         * until every thread began that many in it, at most its own length
         * again plus two deadlines, and the verdict is on those. */
        double longest = calm_seconds + 2.0 * deadline_seconds;
        for (;;) {
            unsigned behind = 0;
            for (unsigned i = 0; i < started; i++) {
                behind += atomic_load(&workers[i].calm_transfers) < RECOVERED_RUN + 1;
            }
            if (behind == 0) {
                break;
            }
            if (ex_now() - calm_since > longest) {
                printf("soak: %u threads had not begun %d transfers in the calm period after "
                       "%.0f s\n",
                       behind, RECOVERED_RUN, longest);
                break;
            }
            struct timespec step = {0, 100 * 1000 * 1000};
            nanosleep(&step, NULL);
        }
        printf("soak: calm period of %.1f s\n", ex_now() - calm_since);
    }
    atomic_store(&stop, 1);
    for (unsigned i = 0; i < started; i++) {
        pthread_join(workers[i].id, NULL);
    }
    if (dog_started) {
        pthread_join(dog, NULL);
    }
    for (unsigned i = 0; i < started; i++) {
        struct worker *w = &workers[i];
        if (w->calm_ok_run < RECOVERED_RUN) {
            char what[64];
            snprintf(what, sizeof what, "thread %u: %u transfers", i,
                     atomic_load(&w->calm_transfers));
            fail("%s in the calm period, the last %s not all ok", what, "3");
        }
    }
    rdma_resources(held, sizeof held);
    for (unsigned i = 0; i < threads; i++) {
        struct worker *w = &workers[i];
        if (w->registered) {
            e = hipObjBufDeregister(w->buf);
            if (e.opError != hipObjSuccess && e.opError != hipObjBusy) {
                fail("hipObjBufDeregister: %s%s", hipObjGetErrorString(e.opError), "");
            }
        }
        for (unsigned k = 0; k < KEYS; k++) {
            ex_s3_free(w->obj[k].s3);
        }
    }
    hipObjShutdown();
    for (unsigned i = 0; i < threads; i++) {
        free(workers[i].buf);
    }
    unsigned fds_after = open_fds();
    rdma_resources(after, sizeof after);
    print_tally();
    printf("soak: RDMA resources: before the soak's hipObjInit %s; before its hipObjShutdown %s; "
           "after %s\n",
           before, held, after);
    printf("soak: file descriptors: before the soak's hipObjInit %u, after its hipObjShutdown %u\n",
           fds_before, fds_after);
    if (strcmp(before, after) != 0) {
        fail("RDMA resources after shutdown (%s) differ from before init (%s)", after, before);
    }
    if (fds_after != fds_before) {
        fail("file descriptors after shutdown differ from before init%s%s", "", "");
    }
    curl_global_cleanup();
    if (status != 0 || tally.failures > 0) {
        printf("soak: FAILED (%u reasons above)\n", tally.failures);
        return 1;
    }
    printf("soak: passed\n");
    return 0;
}
