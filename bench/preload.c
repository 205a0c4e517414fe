/* bench/preload.c - idem-preload: fill a store with completed records.
 *
 * The benchmark measures idemd against a store that already holds many keys
 * (e.g. 1M), since a B-tree of a million records is not as fast as an empty
 * one.  This tool writes N completed records through the ordinary store API,
 * exactly as idemd would leave them:
 *
 *   scope        "anonymous"
 *   key          "preload-<i>", i = 0 .. N-1
 *   fingerprint  of the request POST /preload with body {"n":<i>}
 *                (raw body mode, no fingerprint headers), so a benchmark can
 *                replay any of them
 *   response     200, Content-Type: application/json, {"ok":true,"n":<i>}
 *   retention    24 hours from now (real time)
 *
 * Keys go in batches of 1000: one exec claims the batch, one exec completes
 * it (two transactions, like two rounds of group commit).  A key that is
 * already there is left alone and counted.  It prints how long it took.
 *
 * Usage: idem-preload STORE_URL N      (exit 0; 1 store error; 2 usage)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/store.h"

#define BATCH 1000
#define MAX_N 100000000ull /* 100M: beyond that, a typo */
#define TTL_MS (24ll * 3600 * 1000)

static idem_op_t claims[BATCH], completes[BATCH];
static idem_response_t responses[BATCH];
static char bodies[BATCH][48];
static const idem_header_t json_header = {"Content-Type", 12, "application/json", 16};

static int usage(void)
{
    fprintf(stderr, "usage: idem-preload STORE_URL N   (N from 1 to %llu)\n", MAX_N);
    return 2;
}

static int store_error(idem_store_t *st, const char *what, idem_err_t err)
{
    fprintf(stderr, "idem-preload: %s: %s (%s)\n", what, idem_strerror(err),
            idem_store_errstr(st));
    return 1;
}

static void fingerprint_of(uint64_t i, uint8_t *fp)
{
    char body[48];
    int len = snprintf(body, sizeof body, "{\"n\":%" PRIu64 "}", i);
    idem_fp_input_t in = {
        .method = "POST", .method_len = 4,
        .target = "/preload", .target_len = 8,
        .body = (const uint8_t *)body, .body_len = (size_t)len,
    };
    idem_fingerprint(&in, fp);
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return usage();
    char *end;
    unsigned long long n = strtoull(argv[2], &end, 10);
    if (*argv[2] == '\0' || *argv[2] == '-' || *end != '\0' || n == 0 || n > MAX_N)
        return usage();

    char err[256];
    idem_store_t *st;
    idem_err_t rc = idem_store_open(argv[1], &st, err, sizeof err);
    if (rc != IDEM_OK) {
        fprintf(stderr, "idem-preload: %s: %s\n", argv[1], err);
        return 1;
    }

    uint64_t t0 = idem_clock_mono_ns();
    int64_t now = idem_clock_now(NULL);
    uint64_t written = 0, present = 0;
    for (uint64_t base = 0; base < n; base += BATCH) {
        size_t m = n - base < BATCH ? (size_t)(n - base) : BATCH;
        for (size_t j = 0; j < m; j++) {
            idem_op_t *op = &claims[j];
            memset(op, 0, sizeof *op);
            op->kind = IDEM_OP_CLAIM;
            snprintf(op->id.scope, sizeof op->id.scope, "anonymous");
            snprintf(op->id.key, sizeof op->id.key, "preload-%" PRIu64, base + j);
            fingerprint_of(base + j, op->fp);
            op->now_ms = now;
            op->lease_until_ms = now + 60000;
            op->expires_at_ms = now + TTL_MS;
        }
        if ((rc = idem_store_exec(st, claims, m)) != IDEM_OK)
            return store_error(st, "claiming a batch", rc);

        size_t k = 0;
        for (size_t j = 0; j < m; j++) {
            idem_op_t *c = &claims[j];
            if (c->err != IDEM_OK || !idem_decision_forwards(c->decision.kind)) {
                idem_record_cleanup(&c->record);
                present++;
                continue;
            }
            int blen = snprintf(bodies[k], sizeof bodies[k], "{\"ok\":true,\"n\":%" PRIu64 "}",
                                base + j);
            responses[k] = (idem_response_t){200, &json_header, 1, (const uint8_t *)bodies[k],
                                             (size_t)blen};
            idem_op_t *op = &completes[k];
            memset(op, 0, sizeof *op);
            op->kind = IDEM_OP_COMPLETE;
            op->id = c->id;
            op->fence = c->decision.fence;
            op->response = &responses[k];
            op->expires_at_ms = now + TTL_MS;
            k++;
        }
        if ((rc = idem_store_exec(st, completes, k)) != IDEM_OK)
            return store_error(st, "completing a batch", rc);
        for (size_t j = 0; j < k; j++)
            written += completes[j].err == IDEM_OK;
    }
    double secs = (double)(idem_clock_mono_ns() - t0) / 1e9;
    idem_store_close(st);

    printf("idem-preload: %" PRIu64 " records written, %" PRIu64
           " already present, into %s in %.3f s (%.0f records/s)\n",
           written, present, argv[1], secs, secs > 0 ? (double)n / secs : 0.0);
    return 0;
}
