/*
 * token-get: reads an S3 object into a registered buffer, the application
 * driving the transfer itself instead of handing callbacks to hipObjGet:
 *
 *   1. hipObjGetRdmaToken(buffer, size, HIPOBJ_RDMA_OP_GET, &token)
 *   2. its own signed GET with the token in x-amz-rdma-token
 *   3. hipObjParseRdmaReply on the response's x-amz-rdma-reply
 *   4. on 200/206: hipObjBufSync(buffer, size, 0, HIPOBJ_SYNC_TO_DEVICE),
 *      which waits for the server's final message and, for a staged device
 *      buffer, copies the bytes to the device
 *   5. hipObjPutRdmaToken(token)
 *
 *   token-get [options] BUCKET KEY         (--help lists the options)
 *
 * A server that declines (501) served the object in that response, whose
 * body is used; the thread then asks for no more tokens (its later
 * iterations are plain GETs), since a declined token keeps its buffer until
 * the library's token deadline. Options and output are get-object's.
 *
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L

#include "s3common.h"

#include <stdio.h>
#include <string.h>

static int token_transfer(struct ex_thread *t, unsigned iteration) {
    (void)iteration;
    const struct ex_options *o = t->opt;
    if (!t->rdma) {
        return ex_plain_get(t, NULL, t->no_rdma_reason);
    }
    if (t->declined) {
        return ex_plain_get(t, NULL, "server replied 501");
    }
    char what[1200];
    snprintf(what, sizeof what, "hipObjGetRdmaToken %s/%s", o->bucket, t->key);
    char *token = NULL;
    hipObjError_t e = hipObjGetRdmaToken(t->buf, t->size, HIPOBJ_RDMA_OP_GET, &token);
    if (e.opError != hipObjSuccess) {
        ex_report(o->prog, what, &e, NULL);
        return 1;
    }

    struct ex_request rq;
    struct ex_response rs;
    ex_get_request(t, &rq);
    rq.token = token;
    snprintf(what, sizeof what, "GET %s/%s with a token", o->bucket, t->key);
    int status = 0;
    if (ex_s3_perform(t->s3, &rq, &rs) != 0) {
        ex_report(o->prog, what, NULL, &rs);
        status = 1;
    } else {
        char digits[4];
        const char *reply = ex_reply_of(&rs, digits);
        int code = 0;
        e = hipObjParseRdmaReply(reply, strlen(reply), &code);
        if (e.opError != hipObjSuccess) {
            snprintf(what, sizeof what, "hipObjParseRdmaReply(\"%s\") for %s/%s", reply, o->bucket,
                     t->key);
            ex_report(o->prog, what, &e, &rs);
            status = 1;
        } else if (code == 200 || code == 206) {
            snprintf(what, sizeof what, "hipObjBufSync %s/%s", o->bucket, t->key);
            e = hipObjBufSync(t->buf, t->size, 0, HIPOBJ_SYNC_TO_DEVICE);
            if (e.opError != hipObjSuccess) {
                ex_report(o->prog, what, &e, &rs);
                status = 1;
            } else if (ex_check_rdma(t, what, &rs, t->size) != 0) {
                status = 1;
            } else {
                ex_count(t, t->size, 1, NULL);
            }
        } else if (code == HIPOBJ_RDMA_REPLY_NOT_IMPLEMENTED) {
            t->declined = 1;
            status = ex_plain_get(t, &rs, "server replied 501");
        } else {
            fprintf(stderr, "%s: %s: the server replied %d\n", o->prog, what, code);
            ex_report(o->prog, what, NULL, &rs);
            status = 1;
        }
    }
    hipObjPutRdmaToken(token);
    return status;
}

int main(int argc, char **argv) {
    struct ex_options o;
    int parsed = ex_parse_args(&o, EX_TOKEN_GET, argc, argv);
    if (parsed <= 0) {
        return parsed == 0 ? 0 : 1;
    }
    const struct ex_program_ops ops = {"GET", NULL, token_transfer, ex_get_finish};
    return ex_run(&o, &ops);
}
