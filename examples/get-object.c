/*
 * get-object: reads an S3 object into a registered buffer with hipObjGet.
 *
 *   get-object [options] BUCKET KEY        (--help lists the options)
 *
 * The library mints a token and calls sendRequest, which sends the signed
 * GET with the token in x-amz-rdma-token; recvReply hands back the
 * response's x-amz-rdma-reply (or its HTTP status). When hipObjGet returns,
 * the server has written the bytes into the buffer. A server that declines
 * RDMA (501) serves the object in that same response, whose body is used
 * instead; without the library (hipObjInit failed, or --no-rdma) every GET
 * is plain HTTP. --pattern checks the bytes, --file writes them out.
 *
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L

#include "s3common.h"

#include <stdio.h>
#include <string.h>

static int get_transfer(struct ex_thread *t, unsigned iteration) {
    (void)iteration;
    const struct ex_options *o = t->opt;
    if (!t->rdma) {
        return ex_plain_get(t, NULL, t->no_rdma_reason);
    }
    char what[1200];
    snprintf(what, sizeof what, "hipObjGet %s/%s", o->bucket, t->key);
    struct ex_request rq;
    struct ex_response rs;
    memset(&rs, 0, sizeof rs);
    ex_get_request(t, &rq);
    struct ex_callback_ctx cx = {t->s3, &rq, &rs, 0};
    hipObjOps_t ops = ex_callbacks;
    hipObjError_t e = hipObjGet(NULL, t->buf, t->size, 0, &ops, &cx);
    if (e.opError == hipObjSuccess) {
        if (ex_check_rdma(t, what, &rs, t->size) != 0) {
            return 1;
        }
        ex_count(t, t->size, 1, NULL);
        return 0;
    }
    if (e.opError == hipObjS3Error && cx.sent && ex_declined(&rs)) {
        return ex_plain_get(t, &rs, "server replied 501");
    }
    ex_report(o->prog, what, &e, cx.sent ? &rs : NULL);
    return 1;
}

int main(int argc, char **argv) {
    struct ex_options o;
    int parsed = ex_parse_args(&o, EX_GET_OBJECT, argc, argv);
    if (parsed <= 0) {
        return parsed == 0 ? 0 : 1;
    }
    const struct ex_program_ops ops = {"GET", NULL, get_transfer, ex_get_finish};
    return ex_run(&o, &ops);
}
