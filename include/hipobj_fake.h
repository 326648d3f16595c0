/*
 * hipobj_fake.h: the controls of the fake libhipobj, for applications' own
 * tests on machines without RDMA hardware or a GPU.
 *
 * SPDX-License-Identifier: MIT
 *
 * The fake library (installed beside the release one by
 * `scripts/install.sh --fake`: lib/hipobj-fake/libhipobj.so.0, CMake
 * target hipobj::fake, pkg-config name hipobj-fake) exports the 15
 * functions of hipobj.h, behaving as they do on real hardware, plus these.
 * hipObjInit builds its instance on a fake world: a fake RoCE NIC
 * (client0, 192.0.2.1), a fake GPU (device 0), and an RDMA S3 server in
 * the same process (server0, 192.0.2.2) whose object store is
 * hipobjFakeObjectCapacity() bytes. A test's S3 client hands tokens to that
 * server through hipobjFakeSendRequest/hipobjFakeRecvReply (they fit
 * hipObjOps_t; ctx points to an int holding HIPOBJ_RDMA_OP_GET or
 * HIPOBJ_RDMA_OP_PUT), or hipobjFakeServe for application-driven tokens.
 *
 * The world is one per process, made at first use. Never link the fake
 * library into a program that ships.
 *
 * Written by hand; tests/c/fake_world.c and the example CMake project
 * examples/ctest-fake use every function.
 */
#ifndef HIPOBJ_FAKE_H
#define HIPOBJ_FAKE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** How the fake S3 server treats later requests. */
enum {
    /** The protocol as a correct server runs it (the default). */
    HIPOBJ_FAKE_SERVER_NORMAL = 0,
    /** Declines every token: replies 501 and moves nothing (hipObjGet and
     *  hipObjPut return hipObjS3Error; an application falls back to plain
     *  HTTP). */
    HIPOBJ_FAKE_SERVER_DECLINE = 1,
    /** Moves the data but never sends its final message: the transfer
     *  fails once HIPOBJ_COMPLETION_TIMEOUT_MS has passed. */
    HIPOBJ_FAKE_SERVER_NO_FINAL = 2,
    /** Replies 200 without ever connecting (a broken server). */
    HIPOBJ_FAKE_SERVER_NEVER_CONNECT = 3,
    /** Fails every request: replies 500 and moves nothing. */
    HIPOBJ_FAKE_SERVER_FAIL = 4
};

/** sendRequest of hipObjOps_t: the fake server handles the token at once.
 *  Returns 0, or -1 for a NULL or unknown argument. */
int hipobjFakeSendRequest(void *ctx, const char *token, size_t len);

/** recvReply of hipObjOps_t: the reply to this thread's last
 *  hipobjFakeSendRequest. Returns 0, or -1 if it does not fit *len. */
int hipobjFakeRecvReply(void *ctx, char *reply, size_t *len);

/** Writes len bytes of data at the start of the object store (what GETs
 *  read). Returns 0, or -1 for NULL or more than the store holds. */
int hipobjFakeSetObject(const void *data, size_t len);

/** Copies the first len bytes of the object store (what PUTs wrote) to
 *  out. Returns 0, or -1 for NULL or past the store's end. */
int hipobjFakeGetObject(void *out, size_t len);

/** Bytes of the object store. */
size_t hipobjFakeObjectCapacity(void);

/** Hands an application-driven token (hipObjGetRdmaToken's) to the fake
 *  server as the application's own S3 request would. Returns the reply's
 *  status (200 when the transfer was done), or -1. */
int hipobjFakeServe(const char *token, int op);

/** Sets how the fake server treats later requests (HIPOBJ_FAKE_SERVER_*).
 *  Returns 0, or -1 for an unknown value. */
int hipobjFakeSetServerBehaviour(int behaviour);

/** Makes the nth next call (from 1) of the platform function `function`
 *  fail as the real one would: "ibv_reg_mr", "ibv_post_send",
 *  "rdma_listen", "hipHostMalloc", ... (libibverbs, librdmacm and HIP
 *  names). Calls are counted over the whole fake world: the in-process
 *  server's verbs calls (posting its WRITEs and READs, polling) count too,
 *  so a failure of those may land on the server (which then answers 500).
 *  Returns 0, or -1 for NULL, a function the fake platform does not have,
 *  or nth 0. */
int hipobjFakeFailCall(const char *function, unsigned nth);

/** Drops every failure planned with hipobjFakeFailCall. */
void hipobjFakeClearFaults(void);

/** Requests the fake server has handled. */
unsigned long hipobjFakeRequests(void);

/** Live fake platform objects of a kind ("mr", "qp", "cq", "pd",
 *  "cm_id", ...), the fake server's own included, once it has let go of the
 *  connections of clients that are gone: compare before hipObjInit and
 *  after hipObjShutdown to find leaks. -1 for NULL. */
long hipobjFakeLiveObjects(const char *kind);

/** len zeroed bytes of the fake GPU's memory (device 0): what
 *  hipObjBufRegister treats as GPU memory, which the host reaches only
 *  through hipobjFakeDeviceWrite and hipobjFakeDeviceRead (as a GPU
 *  runtime's copies). NULL for 0 bytes. Free with hipobjFakeDeviceFree. */
void *hipobjFakeDeviceAlloc(size_t len);

/** Frees memory from hipobjFakeDeviceAlloc. Returns 0, or -1 for another
 *  address. */
int hipobjFakeDeviceFree(void *ptr);

/** Copies len bytes of host memory src to fake GPU memory dst. Returns 0,
 *  or -1 for NULL or a range outside one fake allocation. */
int hipobjFakeDeviceWrite(void *dst, const void *src, size_t len);

/** Copies len bytes of fake GPU memory src to host memory dst. Returns 0,
 *  or -1 for NULL or a range outside one fake allocation. */
int hipobjFakeDeviceRead(void *dst, const void *src, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* HIPOBJ_FAKE_H */
