/* src/store/redis_impl.h - what src/store/redis.c shares with
 * src/store/redis_cluster.c: the URL's parts, the scripts and how an op is
 * sent to one and its answer read.
 *
 * redis.c owns the scripts (one Lua function per op kind, run by an op
 * script per kind or by the batch script that runs a whole batch in one
 * call), the record's layout (one string; the hash before it is still
 * read) and the URL grammar;
 * redis_cluster.c adds only what a cluster needs on top (the slot map, a
 * pool per master, one batch call per master, MOVED and ASK), so the
 * decisions the conformance suite proves on redis:// are the very same
 * code on redis+cluster://.  Each op touches one Redis key, so on a
 * cluster every op is atomic on one slot.
 *
 * THREADING: every function here is safe from any thread; a connection is
 * used by one thread at a time.
 */
#ifndef IDEM_STORE_REDIS_IMPL_H
#define IDEM_STORE_REDIS_IMPL_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/tls.h"
#include "core/url.h"
#include "idem/store.h"
#include "store/redis_conn.h"
#include "store/store_impl.h"

#define IDEM__REDIS_HOST_MAX IDEM__URL_HOST_MAX
#define IDEM__REDIS_SEEDS_MAX 16 /* sentinels, or a cluster's seed nodes */
#define IDEM__REDIS_PATH_OPT_MAX 1024
/* A Redis key: the prefix, scope ':' key. */
#define IDEM__REDIS_KEYBUF (IDEM_STORE_OPT_MAX + IDEM_STORE_KEY_MAX + 1)

/* The URL forms parse_url reads. */
enum { IDEM__REDIS_SINGLE = 0, IDEM__REDIS_SENTINEL = 1, IDEM__REDIS_CLUSTER = 2 };

struct endpoint {
    char host[IDEM__REDIS_HOST_MAX + 1]; /* a name or an address, without IPv6 brackets */
    int port;
};

/* What the URL says. */
struct rcfg {
    int sentinel;                               /* redis+sentinel:// */
    int cluster;                                /* redis+cluster:// */
    struct endpoint ep[IDEM__REDIS_SEEDS_MAX];  /* the server, sentinels or seed nodes */
    int nep;
    char master[64 + 1];     /* sentinel: the master's name */
    char user[128 + 1];      /* "" for AUTH with the password alone */
    char pass[512 + 1];
    int has_pass; /* the URL has user:pass@ or :pass@ */
    long long db;
    char prefix[IDEM_STORE_OPT_MAX + 1];
    size_t prefix_len;
    int pool;       /* most connections open at once (per node on a cluster) */
    int timeout_ms; /* connect and command timeout */
    /* wait=N: replicas that must acknowledge an op's writes (0: off).  Read
     * by parse_opts once the replicas' branch (issue 20 item 3) is merged;
     * redis_cluster.c already honours it. */
    int wait;
    /* rediss:// and rediss+sentinel://: TLS to every server, sentinels too */
    int tls;
    char ca[IDEM__REDIS_PATH_OPT_MAX + 1];   /* "": the system's trust store */
    char cert[IDEM__REDIS_PATH_OPT_MAX + 1]; /* "": no client certificate */
    char key[IDEM__REDIS_PATH_OPT_MAX + 1];
    char sni[IDEM__REDIS_HOST_MAX + 1]; /* "": each server's host */
    int no_verify;                      /* verify=false */
};

enum script {
    S_CLAIM,
    S_COMPLETE,
    S_HOLD,
    S_RENEW,
    S_RELEASE,
    S_DELETE,
    S_TOKEN_ISSUE,
    S_TOKEN_USE,
    S_TOKEN_RESTORE,
    S_SWEEP,
    S_BATCH, /* every op of a batch in one call (redis.c, lua_batch) */
    NSCRIPTS
};

/* The SHA1 of every script as one server knows them. */
typedef char idem__redis_shas_t[NSCRIPTS][41];

/** Read a URL rest (after "redis:" ...) of the given form; 0, or -1 with
 * one line in errbuf. */
int idem__redis_parse_url(const char *rest, int form, int tls, struct rcfg *cfg, char *errbuf,
                          size_t errlen);

/** The TLS client context of a rediss URL (its files read now). */
/** Connect to ep as cfg says (its timeout, its sni), plain or under tls:
 * the connection, or NULL with err set to one line that names ep. */
idem__rconn_t *idem__redis_connect(const struct rcfg *cfg, idem_tls_ctx_t *tls,
                                   const struct endpoint *ep, char *err, size_t errlen);
/** What every Redis open begins with: parse the URL of form (sentinel,
 * cluster or single) and, for TLS, load its files into *ctx (NULL for
 * plain).  @return IDEM_OK, IDEM_E_INVAL (the URL; errbuf says why), or the
 * TLS context's error (a file that does not load). */
idem_err_t idem__redis_prepare(const char *rest, int form, int tls, struct rcfg *cfg,
                               idem_tls_ctx_t **ctx, char *errbuf, size_t errlen);
idem_err_t idem__redis_tls_context(const struct rcfg *cfg, idem_tls_ctx_t **out, char *errbuf,
                                   size_t errlen);

/** SCRIPT LOAD every script on c, pipelined, the SHAs into sha; 0, or -1
 * with err set. */
int idem__redis_load_scripts(idem__rconn_t *c, idem__redis_shas_t sha, char *err, size_t errlen,
                             int timeout_ms);

/** The Redis key of an identity (prefix scope ':' key) into buf
 * (IDEM__REDIS_KEYBUF bytes); its length. */
size_t idem__redis_make_key(const struct rcfg *cfg, const idem_key_id_t *id, char *buf);

/** Append op's EVALSHA to c's output buffer. */
idem_err_t idem__redis_append_op(const struct rcfg *cfg, idem__rconn_t *c,
                                 idem__redis_shas_t sha, const idem_op_t *op);
/** Append ONE EVALSHA of the batch script to c's output buffer: the ops
 * of ops[0..n) whose bit is set in pick (bit i%8 of pick[i/8]), in order,
 * their keys in KEYS, or with keys_in_argv (a cluster: keys of several
 * slots) framed in ARGV.  Its answer is an array of each op's answer, each
 * read as an op script's (idem__redis_take_result), or an error element.
 * *sent: how many ops went (0 when none was picked or on an error, when
 * nothing was appended).  IDEM_OK, IDEM_E_NOMEM or IDEM_E_TOOBIG. */
idem_err_t idem__redis_append_batch(const struct rcfg *cfg, idem__rconn_t *c,
                                    idem__redis_shas_t sha, const idem_op_t *ops, size_t n,
                                    const uint8_t *pick, int keys_in_argv, size_t *sent);

/** Set op's outputs from its script's reply (errors named for store). */
void idem__redis_take_result(idem_store_t *store, idem_op_t *op, const redisReply *r);

/** Whether the numbers op sends are exact as Lua doubles. */
int idem__redis_op_in_range(const idem_op_t *op);
int idem__redis_in_range(int64_t v);

/** A record from the reply to HMGET key st fl fp fe lu ex r (layout 1). */
idem_err_t idem__redis_rec_from_fields(redisReply *const *f, idem_record_t *rec);
/** A record from a layout 2 value (v, len bytes); IDEM_E_CORRUPT when it is
 * not one. */
idem_err_t idem__redis_rec_from_value(const char *v, size_t len, idem_record_t *rec);
/** The script that reads one record of either layout: EVAL it with 1 key,
 * the record's. */
extern const char idem__redis_read_script[];
extern const size_t idem__redis_read_script_len;
/** A record from r, the answer to the read script: the record,
 * IDEM_E_NOTFOUND (none, or expired by now_ms), IDEM_E_CORRUPT, or a store
 * error (errstr set on base, *broken set when the connection is not to be
 * reused). */
idem_err_t idem__redis_get_answer(idem_store_t *base, const char *where, const redisReply *r,
                                  int64_t now_ms, idem_record_t *rec, int *broken);

/** Whether an error answer to a whole script call says it did not start
 * (its own code: NOSCRIPT, OOM, READONLY ...) rather than that it failed
 * while running ("ERR ...": some of its ops may have written). */
int idem__redis_refused(const char *msg);

/** An error reply's code as ours; *broken set when the connection should be
 * dropped (READONLY, MASTERDOWN). */
idem_err_t idem__redis_map_error(const char *msg, int *broken);

/** One line for a failed connection: "who: why", or "who: no answer within
 * N ms". */
void idem__redis_errtext_io(char *err, size_t errlen, const char *who, const idem__rconn_t *c,
                            int timeout_ms);

/* redis_cluster.c: CRC16/XMODEM as the Redis Cluster spec hashes keys
 * ("123456789" -> 0x31C3), and a key's slot (its hash tag's, if any). */
uint16_t idem__redis_crc16(const char *p, size_t n);
unsigned idem__redis_keyslot(const char *key, size_t len);

/* redis_cluster.c: the slots of a slot map (16384 entries, none where no
 * master serves the slot) that no master serves, in words into buf
 * ("slots 5461-10922 are served by no master"); their count, 0 when every
 * slot is served. */
size_t idem__redis_uncovered(const uint8_t *map, uint8_t none, char *buf, size_t len);

/* redis.c: ask cfg's sentinels for the master's address; 0, or -1 with
 * err set. */
int idem__redis_discover(const struct rcfg *cfg, idem_tls_ctx_t *tls, struct endpoint *master,
                         char *err, size_t errlen);

/* redis_sub.c: the invalidation channel, "<prefix>invalidate", into buf
 * (IDEM_STORE_OPT_MAX + 11 bytes, NUL-terminated); its length. */
size_t idem__redis_channel(const struct rcfg *cfg, char *buf);
/* redis_sub.c: one subscriber session (store_impl.h, watch_session) on a
 * connection of its own. */
void idem__redis_watch_session(const struct rcfg *cfg, idem_tls_ctx_t *tls, int stop_fd,
                               idem__watch_sink_t *sink);

/* ---- listing (redis_list.c) ------------------------------------------------
 *
 * What redis_list.c needs of a handle, given by redis.c (one server) and
 * redis_cluster.c (its masters): the servers a listing walks in turn, a
 * connection to one of them, and one command on the master of a slot. */
typedef struct idem__redis_nodes {
    const struct rcfg *cfg;
    const char *where; /* the handle's name for messages */
    int n;             /* servers to walk: 1, or the cluster's masters */
    uint8_t node[256]; /* the handle's number of each (a cluster's, in slot order) */
    /* A connection to server node[i] (errstr set on failure), given back
     * with broken set when it must be dropped. */
    idem_err_t (*borrow)(idem_store_t *base, int node, idem__rconn_t **c, void **hold);
    void (*give_back)(idem_store_t *base, int node, void *hold, int broken);
    /* A cluster: argv on the master of slot, following MOVED and ASK (a
     * command safe to repeat); NULL with errstr set.  NULL for one server. */
    redisReply *(*slot_command)(idem_store_t *base, unsigned slot, int argc, const char **argv,
                                const size_t *len);
} idem__redis_nodes_t;

/* redis.c and redis_cluster.c: fill out for base; a cluster with slots
 * that no master serves is IDEM_E_STORE_DOWN. */
idem_err_t idem__redis_single_nodes(idem_store_t *base, idem__redis_nodes_t *out);
idem_err_t idem__redis_cluster_nodes(idem_store_t *base, idem__redis_nodes_t *out);

/* redis_list.c: the list and delete_if ops of every Redis store. */
idem_err_t idem__redis_list(idem_store_t *base, idem__list_t *l);
idem_err_t idem__redis_delete_if(idem_store_t *base, const idem_store_listed_t *items, size_t n,
                                 bool *removed);

/* snprintf for messages: a long host name or server error is cut, never
 * overflows (redis.c; the single and cluster forms both write with it). */
void idem__redis_say(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* IDEM_STORE_REDIS_IMPL_H */
