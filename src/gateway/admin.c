/* src/gateway/admin.c - idemd's admin listener (docs/protocol.md section 13).
 *
 * A thread of its own with its own loop, so that a scrape or an operator's
 * lookup never waits behind client traffic and a flood of clients never
 * hides /healthz.  Endpoints:
 *
 *   GET /healthz             200 while the process runs
 *   GET /readyz              200 when the store answers and has room, else 503
 *   GET /metrics             Prometheus text
 *   GET /keys/{key}?scope=S  the record as JSON, 404 when there is none
 *   DELETE /keys/{key}?scope=S  removes it (204), 404 when there is none
 *   GET /keys?scope=&state=&prefix=&older_than=&limit=&cursor=  a page of records
 *   DELETE /keys?scope=&state=&prefix=&older_than=  removes every match
 *
 * The key is percent-encoded in the path; scope defaults to "anonymous".
 * Times are RFC 3339 UTC strings with milliseconds.  Requests are small:
 * a body is read and dropped up to 64 KiB, anything larger is refused.
 *
 * The connections are conn.c's, the same code as the public listener's,
 * run on this thread's loop by a listener whose handler (handler.h) is this
 * file's: it holds a request until its body (read and dropped, at most
 * ADMIN_BODY_MAX) is in, then answers it at once through the connection's
 * output stream.  What a client can hold here is bounded as on the public
 * listener (docs/reliability.md), from a budget of its own so that the
 * admin stays reachable when the public listener is full: at most
 * IDEM_ADMIN_MAX_CONNS connections, of which the one idle longest is closed
 * to make room for a new one (a probe is never refused because idle
 * clients hold every place), header_timeout for a head from its
 * first byte, body_timeout between bytes of a body, idle_timeout between
 * requests, and answers queued to a client that does not read them stop the
 * reading of its requests (conn.c says how much).  Only Host names that
 * mean this listener are answered (loopback names, the admin address,
 * admin_hosts): a page that a browser on this host loads from a name its
 * author points at 127.0.0.1 (DNS rebinding) sends that name, and gets 421.
 *
 * Each endpoint reads the parsed request (method, target, fields) and fills
 * an idem_answer_t (status, Content-Type, body, whether the connection
 * ends), knowing nothing of sockets; admin_answer picks the endpoint after
 * the Host checks, and the answer goes out through the output stream.
 *
 * With admin_token_file (SPEC section 19) every request, /healthz and
 * unknown paths included, needs `Authorization: Bearer <token>`: else 401
 * with `WWW-Authenticate: Bearer`.  The check (admin_authorized) is the
 * first thing admin_answer does after the Host checks, so every endpoint,
 * present or added later, is behind it.  The token itself is never kept:
 * its SHA-256 is (gw->admin_token_sha256), and a request's token is hashed
 * and the two digests compared with CRYPTO_memcmp, so neither the time
 * nor an early exit tells how much of a guess was right, or the length.
 *
 * Its problems carry no Link: rel="describedby" (the public listener's
 * do, SPEC section 18): the policy it would name describes the public
 * API's keys, is not served here (a relative /_idem/policy would be a 404
 * on this listener), and an operator's tool has the docs instead
 * (docs/protocol.md section 10).  So this handler's problem_link is NULL.
 *
 * THREADING: the admin thread only; it reads the store (thread-safe) and
 * the metrics (atomics).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/handler.h"
#include "gateway/log.h"
#include "gateway/problem.h"
#include "gateway/thread.h"
#include "idem/alloc.h"
#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/token.h"
#include "idem/units.h"

#define ADMIN_MAX_HOSTS (IDEM_CONFIG_MAX_LIST + 4)
#define ADMIN_METRICS_MAX (4u << 20) /* the largest /metrics text */
#define ADMIN_BODY_MAX (64 * 1024)   /* an admin request's body, read and dropped */
#define ADMIN_WRITE_HIGH (1u << 20)  /* answers queued to a client that does not read */
#define ADMIN_CLOSE_MS 5000          /* an answer that closes, not taken by then: cut */

/* An answer made at once, without the store's writer or the upstream. */
typedef struct idem_answer {
    int status;               /* 0: none could be made (out of memory): the connection closes */
    const char *content_type; /* NULL: no Content-Type (204); a static string */
    idem_buf_t body;          /* owned by the answer (answer_cleanup) */
    bool close;               /* the request was refused at its head: the connection ends */
    const char *www_authenticate; /* a 401's WWW-Authenticate value (static), else NULL */
} idem_answer_t;

/* An admin request held until its body is in: its head copied (msg points
 * into head), and the stream to answer it on. */
typedef struct admin_req {
    idem_admin_t *admin;
    idem_ostream_t *os;
    idem_http_msg_t msg;
    char head[];
} admin_req_t;

struct idem_admin {
    idem_gw_t *gw;
    uv_loop_t loop;
    idem_handler_t handler;             /* this file's endpoints, for the listener */
    idem_listener_t listener;           /* the admin listener and its connections (conn.c) */
    uv_async_t stop_async;
    pthread_t thread;
    char hosts[ADMIN_MAX_HOSTS][260];   /* Host names answered (without port), as written */
    size_t n_hosts;
};

/* ---- the endpoints ------------------------------------------------------ */

/* An endpoint fills an idem_answer_t; the handler sends it.  A handler
 * sets status 0 when it could not make an answer at all (out of memory):
 * the connection then closes without one. */

static void answer_init(idem_answer_t *a)
{
    memset(a, 0, sizeof *a);
    idem__buf_init(&a->body, 0);
}

static void answer_cleanup(idem_answer_t *a)
{
    idem__buf_cleanup(&a->body);
}

static void answer_json(idem_answer_t *a, int status, const char *type, const char *body)
{
    idem__buf_reset(&a->body);
    if (idem__buf_append_str(&a->body, body) != 0) {
        a->status = 0;
        return;
    }
    a->status = status;
    a->content_type = type;
}

static void answer_problem(idem_answer_t *a, int status, const char *type, const char *detail)
{
    char *body = idem__problem_body(status, type, detail);
    if (body == NULL) {
        a->status = 0;
        return;
    }
    answer_json(a, status, "application/problem+json", body);
    free(body);
}

/* A 200 with obj as compact JSON, keys in order; takes obj (NULL: memory
 * ran out building it), so both /keys answers end the same way. */
static void answer_object(idem_answer_t *a, json_t *obj)
{
    char *body = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    if (!body) {
        answer_problem(a, 500, "internal", "out of memory");
        return;
    }
    answer_json(a, 200, "application/json", body);
    free(body);
}

static void rfc3339(int64_t ms, char *out, size_t n)
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t k = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + k, n - k, ".%03dZ", (int)(ms % 1000));
}

/* A record as JSON (docs/admin.md, "Keys and scopes"); NULL without memory.
 * rec may be a head (no headers or body): only its status is read. */
static json_t *record_json(const idem_key_id_t *id, const idem_record_t *rec)
{
    char fphex[2 * IDEM_FP_LEN + 1], lease[40], expires[40];
    idem_fp_hex(rec->fingerprint, fphex);
    rfc3339(rec->lease_until_ms, lease, sizeof lease);
    rfc3339(rec->expires_at_ms, expires, sizeof expires);
    bool done = rec->state == IDEM_STATE_COMPLETED;
    json_t *obj = json_pack("{s:s, s:s, s:s, s:I, s:s, s:s?, s:s, s:b}", "scope", id->scope, "key",
                            id->key, "state", done ? "completed" : "in_progress", "fence",
                            (json_int_t)rec->fence, "fingerprint", fphex, "lease_expires_at",
                            done ? NULL : lease, "expires_at", expires, "held",
                            (rec->flags & IDEM_REC_HELD) != 0);
    if (obj && done) {
        json_object_set_new(obj, "status", json_integer(rec->response.status));
        json_object_set_new(obj, "body_retained", json_boolean(!(rec->flags & IDEM_REC_NOT_RETAINED)));
    }
    return obj;
}

/* GET or DELETE /keys/{key}?scope=S */
static void handle_keys(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a)
{
    idem_gw_t *gw = admin->gw;
    bool is_get = idem__slice_eq_ci(m->method, "GET");
    bool is_delete = idem__slice_eq_ci(m->method, "DELETE");
    if (!is_get && !is_delete) {
        answer_problem(a, 405, "method-not-allowed", "use GET or DELETE");
        return;
    }
    const char *p = m->target.ptr + 6; /* after "/keys/" */
    size_t plen = m->target.len - 6;
    size_t klen = 0;
    while (klen < plen && p[klen] != '?')
        klen++;
    idem_key_id_t id;
    memset(&id, 0, sizeof id);
    long n = idem__http_pct_decode(p, klen, id.key, sizeof id.key);
    bool key_ok = n > 0;
    for (long i = 0; key_ok && i < n; i++)
        if ((unsigned char)id.key[i] < 0x20 || (unsigned char)id.key[i] > 0x7e)
            key_ok = false;
    if (!key_ok) {
        answer_problem(a, 400, "invalid-key", "the key in the path is not a valid key");
        return;
    }
    memcpy(id.scope, "anonymous", 10);
    if (klen < plen) {
        long sr = idem__http_query_param(p + klen + 1, plen - klen - 1, "scope", id.scope,
                                         sizeof id.scope);
        if (sr == -1 || (sr >= 0 && !idem_scope_valid(id.scope))) {
            answer_problem(a, 400, "invalid-scope",
                           "scope is \"anonymous\" or 64 lowercase hex digits");
            return;
        }
        if (sr == -2)
            memcpy(id.scope, "anonymous", 10);
    }
    int64_t now = idem_clock_now(NULL);
    if (is_delete) {
        idem_record_t rec;
        idem_err_t err = idem__gw_store_get(gw, &id, now, &rec);
        if (err == IDEM_OK)
            idem_record_cleanup(&rec);
        if (err == IDEM_OK || err == IDEM_E_NOTFOUND) {
            idem_err_t derr = idem_store_delete(gw->store, &id);
            idem__cache_remove(gw->cache, &id);
            /* Every other idemd's local_cache forgets it too (invalidate.c). */
            if (derr == IDEM_OK && idem_store_publish_delete(gw->store, &id) != IDEM_OK)
                idem__log(gw, "warn",
                          "DELETE /keys: the invalidation was not published (%s); other "
                          "instances' local_cache may replay the key until it "
                          "expires or is evicted",
                          idem_store_errstr(gw->store));
            if (derr == IDEM_OK && err == IDEM_OK) {
                a->status = 204;
                return;
            }
            if (derr == IDEM_OK || derr == IDEM_E_NOTFOUND) {
                answer_problem(a, 404, "not-found", "no record for this key and scope");
                return;
            }
            err = derr;
        }
        answer_problem(a, 503, "store-unavailable", idem_strerror(err));
        return;
    }
    idem_record_t rec;
    idem_err_t err = idem__gw_store_get(gw, &id, now, &rec);
    if (err == IDEM_E_NOTFOUND) {
        answer_problem(a, 404, "not-found", "no record for this key and scope");
        return;
    }
    if (err != IDEM_OK) {
        answer_problem(a, 503, "store-unavailable", idem_strerror(err));
        return;
    }
    json_t *obj = record_json(&id, &rec);
    idem_record_cleanup(&rec);
    answer_object(a, obj);
}

#define KEYS_LIMIT_DEFAULT 100 /* GET /keys without limit= */

/* The filter of GET and DELETE /keys from the query (scope, state, prefix,
 * older_than; the strings land in the caller's buffers).  false with a
 * 400 answered when a parameter is bad.  *any says whether one was given. */
static bool keys_filter(idem_gw_t *gw, const char *q, size_t qn, idem_store_filter_t *f,
                        char *scope, char *prefix, bool *any, idem_answer_t *a)
{
    char state[16], age[32];
    memset(f, 0, sizeof *f);
    f->now_ms = idem_clock_now(NULL);
    *any = false;
    long r = idem__http_query_param(q, qn, "scope", scope, IDEM_SCOPE_MAX + 1);
    if (r == -1 || (r >= 0 && !idem_scope_valid(scope))) {
        answer_problem(a, 400, "invalid-scope", "scope is \"anonymous\" or 64 lowercase hex digits");
        return false;
    }
    if (r >= 0) {
        f->scope = scope;
        *any = true;
    }
    r = idem__http_query_param(q, qn, "state", state, sizeof state);
    if (r >= 0 && strcmp(state, "in_progress") == 0)
        f->state = IDEM_LIST_IN_PROGRESS;
    else if (r >= 0 && strcmp(state, "completed") == 0)
        f->state = IDEM_LIST_COMPLETED;
    else if (r >= 0 && strcmp(state, "held") == 0)
        f->state = IDEM_LIST_HELD;
    else if (r != -2) {
        answer_problem(a, 400, "invalid-filter", "state is in_progress, completed or held");
        return false;
    }
    *any = *any || r >= 0;
    r = idem__http_query_param(q, qn, "prefix", prefix, IDEM_KEY_MAX + 1);
    bool prefix_ok = r != -1;
    for (long i = 0; prefix_ok && i < r; i++)
        if ((unsigned char)prefix[i] < 0x20 || (unsigned char)prefix[i] > 0x7e)
            prefix_ok = false;
    if (!prefix_ok) {
        answer_problem(a, 400, "invalid-filter",
                       "prefix is at most 255 printable ASCII characters, percent-encoded");
        return false;
    }
    if (r > 0) {
        f->prefix = prefix;
        *any = true;
    }
    r = idem__http_query_param(q, qn, "older_than", age, sizeof age);
    if (r != -2) {
        int64_t ms;
        if (r < 0 || idem_parse_duration(age, &ms) != IDEM_OK) {
            answer_problem(a, 400, "invalid-filter", "older_than is a duration such as 30s, 10m or 2h");
            return false;
        }
        f->written_before_ms = f->now_ms - ms;
        if (f->written_before_ms == 0)
            f->written_before_ms = -1;
        f->lease_ms = gw->cfg->defaults.lease_ms;
        f->ttl_ms = gw->cfg->defaults.key_ttl_ms;
        *any = true;
    }
    return true;
}

static void answer_store_error(idem_answer_t *a, idem_err_t err)
{
    if (err == IDEM_E_UNSUPPORTED)
        answer_problem(a, 501, "not-supported", "this store cannot list its records");
    else
        answer_problem(a, 503, "store-unavailable", idem_strerror(err));
}


/* A bulk delete removing more keys than this in one page tells the other
 * instances to empty their local_cache once, rather than key by key. */
#define BULK_PUBLISH_KEYS 64

/* Publish the removed items of a bulk delete (or, with clear, one "forget
 * every record") to every idemd watching the store (invalidate.c).  A
 * message that cannot be sent is logged: the deletes stand. */
static void publish_bulk(idem_gw_t *gw, const idem_store_listed_t *items, size_t n,
                         const bool *removed, bool clear)
{
    idem_err_t err = IDEM_OK;
    if (clear)
        err = idem_store_publish_clear(gw->store);
    for (size_t i = 0; i < n && err == IDEM_OK; i++)
        if (removed[i])
            err = idem_store_publish_delete(gw->store, &items[i].id);
    if (err != IDEM_OK)
        idem__log(gw, "warn",
                  "DELETE /keys: the invalidation was not published (%s); other instances' "
                  "local_cache may replay deleted keys until they expire or are evicted",
                  idem_store_errstr(gw->store));
}

/* GET /keys?scope=&state=&prefix=&older_than=&limit=&cursor= : one page of
 * records; DELETE /keys?scope=&state=&prefix=&older_than= : removes every
 * match, a page of IDEM_STORE_LIST_MAX at a time, each record only if it is
 * still as listed (idem_store_delete_listed).  Without state, a DELETE
 * spares in-flight records (a live lease, or held): those go only when
 * state names them. */
static void handle_keys_bulk(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a)
{
    idem_gw_t *gw = admin->gw;
    bool is_get = idem__slice_eq_ci(m->method, "GET") || idem__slice_eq_ci(m->method, "HEAD");
    bool is_delete = idem__slice_eq_ci(m->method, "DELETE");
    if (!is_get && !is_delete) {
        answer_problem(a, 405, "method-not-allowed", "use GET or DELETE");
        return;
    }
    const char *q = memchr(m->target.ptr, '?', m->target.len);
    size_t qn = q ? m->target.len - (size_t)(q - m->target.ptr) - 1 : 0;
    q = q ? q + 1 : "";
    char scope[IDEM_SCOPE_MAX + 1], prefix[IDEM_KEY_MAX + 1];
    char cursor[IDEM_STORE_CURSOR_MAX + 1] = "";
    idem_store_filter_t f;
    bool any;
    if (!keys_filter(gw, q, qn, &f, scope, prefix, &any, a))
        return;
    idem_store_page_t page;
    if (is_delete) {
        if (!any) {
            answer_problem(a, 400, "filter-required",
                           "DELETE /keys needs at least one of scope, state, prefix, older_than");
            return;
        }
        f.spare_in_flight = f.state == IDEM_LIST_ANY;
        size_t total = 0;
        bool clear_all = false;
        bool removed[IDEM_STORE_LIST_MAX];
        do {
            idem_err_t err = idem_store_list(gw->store, &f, cursor, IDEM_STORE_LIST_MAX, &page);
            size_t gone = 0;
            if (err == IDEM_OK)
                err = idem_store_delete_listed(gw->store, page.items, page.n, &gone, removed);
            if (err != IDEM_OK) {
                idem_store_page_cleanup(&page);
                publish_bulk(gw, NULL, 0, NULL, clear_all);
                answer_store_error(a, err);
                return;
            }
            for (size_t i = 0; i < page.n; i++)
                if (removed[i])
                    idem__cache_remove(gw->cache, &page.items[i].id);
            /* Every other idemd's local_cache forgets them too: key by key
             * for a few, else one "forget everything" at the end. */
            if (gone > BULK_PUBLISH_KEYS)
                clear_all = true;
            else
                publish_bulk(gw, page.items, page.n, removed, false);
            total += gone;
            memcpy(cursor, page.cursor, sizeof cursor);
            idem_store_page_cleanup(&page);
        } while (cursor[0] != '\0');
        publish_bulk(gw, NULL, 0, NULL, clear_all);
        char body[64];
        snprintf(body, sizeof body, "{\"deleted\":%zu}", total);
        answer_json(a, 200, "application/json", body);
        return;
    }
    char num[16];
    long r = idem__http_query_param(q, qn, "limit", num, sizeof num);
    long limit = KEYS_LIMIT_DEFAULT;
    if (r != -2) {
        char *end;
        limit = r > 0 ? strtol(num, &end, 10) : 0;
        if (r <= 0 || *end != '\0' || limit < 1 || limit > IDEM_STORE_LIST_MAX) {
            answer_problem(a, 400, "invalid-filter", "limit is a number from 1 to 1000");
            return;
        }
    }
    r = idem__http_query_param(q, qn, "cursor", cursor, sizeof cursor);
    if (r == -1) {
        answer_problem(a, 400, "invalid-cursor", "cursor is a next_cursor of an earlier page");
        return;
    }
    if (r == -2)
        cursor[0] = '\0';
    idem_err_t err = idem_store_list(gw->store, &f, cursor, (size_t)limit, &page);
    if (err == IDEM_E_INVAL) {
        answer_problem(a, 400, "invalid-cursor", "cursor is a next_cursor of an earlier page");
        return;
    }
    if (err != IDEM_OK) {
        answer_store_error(a, err);
        return;
    }
    json_t *keys = json_array();
    for (size_t i = 0; keys != NULL && i < page.n; i++)
        if (json_array_append_new(keys, record_json(&page.items[i].id, &page.items[i].rec)) != 0) {
            json_decref(keys);
            keys = NULL;
        }
    json_t *obj = keys ? json_pack("{s:o, s:s?}", "keys", keys, "next_cursor",
                                   page.cursor[0] ? page.cursor : NULL)
                       : NULL;
    idem_store_page_cleanup(&page);
    answer_object(a, obj);
}

#define PROBE_MAX_BYTES (4u << 20) /* the largest response a readiness probe writes */
#define PROBE_TTL_MS 5000          /* a probe record left behind expires this soon */

/* The store refused a write for want of room: is that still so?  Do what a
 * request does, at the size that was refused: claim a fresh key (under a
 * scope no caller can have), complete it with a response of
 * store_full_bytes (at most PROBE_MAX_BYTES), then delete it.  The answer is
 * the store's own, and nothing is left behind (a record the delete could not
 * remove expires within PROBE_TTL_MS).  Runs only while store_full is set:
 * a full store costs /readyz up to three write transactions, a healthy one
 * none.  @return IDEM_OK when both writes fitted, IDEM_E_STORE_FULL, or
 * another store error. */
static idem_err_t probe_room(idem_gw_t *gw)
{
    char token[IDEM_TOKEN_LEN + 1];
    if (idem_token_generate(NULL, token) != IDEM_OK)
        return IDEM_E_IO;
    uint64_t size = atomic_load(&gw->metrics.store_full_bytes);
    if (size > PROBE_MAX_BYTES)
        size = PROBE_MAX_BYTES;
    int64_t now = idem_clock_now(NULL);
    idem_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_CLAIM;
    snprintf(op.id.scope, sizeof op.id.scope, "readyz-probe");
    snprintf(op.id.key, sizeof op.id.key, "%s", token);
    op.now_ms = now;
    op.lease_until_ms = now + PROBE_TTL_MS;
    op.expires_at_ms = now + PROBE_TTL_MS;
    idem_err_t err = idem_store_exec(gw->store, &op, 1);
    idem__writer_store_full_note(&gw->metrics, err, &op, 1);
    idem_record_cleanup(&op.record);
    if (err != IDEM_OK || !idem_decision_forwards(op.decision.kind))
        return err != IDEM_OK ? err : IDEM_E_IO;
    uint64_t fence = op.decision.fence;
    uint8_t *body = size > 0 ? idem_calloc(1, (size_t)size) : NULL;
    idem_response_t resp = {.status = 200, .body = body, .body_len = body ? (size_t)size : 0};
    idem_key_id_t id = op.id;
    memset(&op, 0, sizeof op);
    op.kind = IDEM_OP_COMPLETE;
    op.id = id;
    op.fence = fence;
    op.response = &resp;
    op.expires_at_ms = now + PROBE_TTL_MS;
    err = body != NULL || size == 0 ? idem_store_exec(gw->store, &op, 1) : IDEM_E_NOMEM;
    if (err == IDEM_OK && op.err != IDEM_OK)
        err = IDEM_E_IO; /* the probe's own claim was taken over: no answer */
    idem__writer_store_full_note(&gw->metrics, err, &op, 1);
    idem_free(body);
    (void)idem_store_delete(gw->store, &id);
    return err;
}

/* GET /healthz: the process runs. */
static void handle_healthz(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a)
{
    (void)admin;
    (void)m;
    answer_json(a, 200, "application/json", "{\"status\":\"ok\"}");
}

/* GET /readyz: the store answers and has room.  Room is asked of the
 * store first (idem_store_space: a statvfs and a few reads, no write), so
 * an embedded store that says it has none left is 503 before any request
 * was refused; then, while a write was refused for want of room, the
 * probe asks by writing (probe_room), which every store can answer. */
static void handle_readyz(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a)
{
    idem_gw_t *gw = admin->gw;
    (void)m;
    idem_err_t err = idem_store_ping(gw->store);
    idem_store_space_t sp;
    bool no_room = err == IDEM_OK && idem_store_space(gw->store, &sp) == IDEM_OK &&
                   sp.free_bytes == 0;
    if (no_room) {
        err = IDEM_E_STORE_FULL;
    } else if (err == IDEM_OK && atomic_load(&gw->metrics.store_full)) {
        err = probe_room(gw);
        if (err == IDEM_OK)
            atomic_store(&gw->metrics.store_full, false);
    }
    if (err == IDEM_OK)
        answer_json(a, 200, "application/json", "{\"status\":\"ready\"}");
    else if (no_room)
        answer_problem(a, 503, "store-full",
                       "the store's disk has no room left for new records "
                       "(idem_store_free_bytes is 0): keyed requests and token issues get 503 "
                       "until records expire, keys are deleted or the disk grows");
    else if (err == IDEM_E_STORE_FULL)
        answer_problem(a, 503, "store-full",
                       "the store has no room for new records: keyed requests and token "
                       "issues get 503 until expired records are swept or removed");
    else
        answer_problem(a, 503, "store-unavailable", idem_store_errstr(gw->store));
}

/* GET /metrics: Prometheus text. */
static void handle_metrics(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a)
{
    (void)m;
    idem_buf_t out;
    idem__buf_init(&out, ADMIN_METRICS_MAX);
    /* The route labels are those of the routes new requests get (a SIGHUP
     * may have renamed them); a route's counts are kept by its index. */
    idem_gw_t *gw = admin->gw;
    pthread_mutex_lock(&gw->live_mu);
    const idem_config_t *live = idem__config_ref(gw->live != NULL ? gw->live : gw->cfg);
    pthread_mutex_unlock(&gw->live_mu);
    int rendered = idem__metrics_render(&gw->metrics, live, &out);
    idem__config_unref(live);
    if (rendered == 0) {
        idem__buf_cleanup(&a->body);
        a->body = out; /* the answer takes the rendering */
        a->status = 200;
        a->content_type = "text/plain; version=0.0.4";
        return;
    }
    idem__buf_cleanup(&out);
    answer_problem(a, 500, "internal", "metrics too large");
}

typedef void (*admin_handler_fn)(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a);

/* The endpoints that answer GET (and HEAD) at a fixed path. */
static const struct {
    const char *path;
    admin_handler_fn handle;
} admin_paths[] = {
    {"/healthz", handle_healthz},
    {"/readyz", handle_readyz},
    {"/metrics", handle_metrics},
};

static bool target_is(const idem_http_msg_t *m, const char *path)
{
    size_t n = strlen(path);
    return m->target.len >= n && memcmp(m->target.ptr, path, n) == 0 &&
           (m->target.len == n || m->target.ptr[n] == '?');
}

/* Whether the Host of m names this listener (any port): a name of
 * a->hosts, compared case-insensitively.  An HTTP/1.0 request may have no
 * Host (scripts; a browser always sends one). */
static bool admin_host_ok(const idem_admin_t *a, const idem_http_msg_t *m)
{
    if (idem__http_count(m, "Host") == 0)
        return m->version_minor == 0;
    const idem_http_field_t *f = idem__http_find(m, "Host");
    const char *v = f->value.ptr;
    size_t len = f->value.len, hl = 0;
    if (len > 0 && v[0] == '[') {
        const char *e = memchr(v, ']', len);
        if (e == NULL)
            return false;
        hl = (size_t)(e - v) + 1;
    } else {
        while (hl < len && v[hl] != ':')
            hl++;
    }
    if (hl == 0)
        return false;
    if (hl < len) {
        if (v[hl] != ':' || len - hl - 1 < 1 || len - hl - 1 > 5)
            return false;
        for (size_t i = hl + 1; i < len; i++)
            if (v[i] < '0' || v[i] > '9')
                return false;
    }
    for (size_t i = 0; i < a->n_hosts; i++)
        if (strlen(a->hosts[i]) == hl && strncasecmp(a->hosts[i], v, hl) == 0)
            return true;
    return false;
}

/* ---- admin_token_file -------------------------------------------------- */

#define ADMIN_TOKEN_MAX 4096 /* bytes of a token */
#define ADMIN_REALM "Bearer realm=\"idemd-admin\""

int idem__admin_token_load(const char *path, uint8_t sha256[32], char *err, size_t errlen)
{
    char buf[ADMIN_TOKEN_MAX + 3];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, errlen, "admin_token_file: cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "admin_token_file: '%s' is not a regular file", path);
        close(fd);
        return -1;
    }
    if ((st.st_mode & (S_IROTH | S_IWOTH)) != 0) {
        snprintf(err, errlen,
                 "admin_token_file: '%s' can be read or written by other users (mode %04o): "
                 "chmod o-rw it",
                 path, (unsigned)(st.st_mode & 07777));
        close(fd);
        return -1;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "admin_token_file: cannot read '%s': %s", path,
                     strerror(errno));
            close(fd);
            return -1;
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf)
            break;
    }
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    const char *why = n == 0 ? "is empty" : n > ADMIN_TOKEN_MAX ? "holds more than 4096 bytes" : NULL;
    for (size_t i = 0; why == NULL && i < n; i++)
        if ((unsigned char)buf[i] < 0x21 || (unsigned char)buf[i] > 0x7e)
            why = "holds a space, a control character or a byte outside ASCII (the token "
                  "goes in an Authorization header)";
    unsigned int mdlen = 0;
    if (why == NULL && (EVP_Digest(buf, n, sha256, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32))
        why = "could not be hashed (OpenSSL)";
    OPENSSL_cleanse(buf, sizeof buf);
    if (why != NULL) {
        snprintf(err, errlen, "admin_token_file: '%s' %s", path, why);
        return -1;
    }
    return 0;
}

/* Whether m carries the admin token: exactly one Authorization field,
 * "Bearer" (any case), spaces, the token.  Without a token configured,
 * every request is.  On false, a is the 401. */
static bool admin_authorized(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a)
{
    idem_gw_t *gw = admin->gw;
    if (!gw->admin_token_set)
        return true;
    bool ok = false, presented = false;
    if (idem__http_count(m, "Authorization") == 1) {
        const idem_http_field_t *f = idem__http_find(m, "Authorization");
        const char *v = f->value.ptr;
        size_t len = f->value.len, i = 6;
        if (len > 7 && strncasecmp(v, "Bearer", 6) == 0 && v[6] == ' ') {
            while (i < len && v[i] == ' ')
                i++;
            size_t end = len;
            while (end > i && (v[end - 1] == ' ' || v[end - 1] == '\t'))
                end--;
            uint8_t md[32];
            unsigned int mdlen = 0;
            presented = end > i;
            /* Hash whatever was sent, then compare digests of fixed length
             * in constant time: the time says nothing of the token. */
            ok = presented && EVP_Digest(v + i, end - i, md, &mdlen, EVP_sha256(), NULL) == 1 &&
                 mdlen == 32 && CRYPTO_memcmp(md, gw->admin_token_sha256, 32) == 0;
        }
    }
    if (ok)
        return true;
    atomic_fetch_add_explicit(&gw->metrics.admin_unauthorized, 1, memory_order_relaxed);
    answer_problem(a, 401, "unauthorized",
                   presented ? "the bearer token is not the admin token"
                             : "the admin listener needs Authorization: Bearer <token> "
                               "(admin_token_file)");
    a->www_authenticate = presented ? ADMIN_REALM ", error=\"invalid_token\"" : ADMIN_REALM;
    return false;
}

static void admin_answer(idem_admin_t *admin, const idem_http_msg_t *m, idem_answer_t *a)
{
    if (idem__http_count(m, "Host") > 1 ||
        (m->version_minor == 1 && idem__http_count(m, "Host") == 0)) {
        answer_problem(a, 400, "bad-request", "a request needs exactly one Host header");
        a->close = true;
        return;
    }
    if (!admin_host_ok(admin, m)) {
        answer_problem(a, 421, "misdirected-request",
                       "the admin listener answers only its own address, loopback names and "
                       "admin_hosts in Host");
        a->close = true;
        return;
    }
    /* Every endpoint below, and the 404 of none, is behind the token. */
    if (!admin_authorized(admin, m, a))
        return;
    if (target_is(m, "/keys")) {
        handle_keys_bulk(admin, m, a);
        return;
    }
    if (m->target.len > 6 && memcmp(m->target.ptr, "/keys/", 6) == 0) {
        handle_keys(admin, m, a);
        return;
    }
    for (size_t i = 0; i < sizeof admin_paths / sizeof admin_paths[0]; i++) {
        if (!target_is(m, admin_paths[i].path))
            continue;
        if (idem__slice_eq_ci(m->method, "GET") || idem__slice_eq_ci(m->method, "HEAD"))
            admin_paths[i].handle(admin, m, a);
        else
            answer_problem(a, 405, "method-not-allowed", "use GET");
        return;
    }
    answer_problem(a, 404, "not-found", "no such admin endpoint");
}

/* ---- the handler: what the connection calls (handler.h) ---------------------- */

static idem_hreq_t *admin_on_head(idem_handler_t *h, const idem_http_msg_t *m, const char *head,
                                  size_t head_len, idem_ostream_t *os,
                                  const idem_conn_facts_t *facts)
{
    (void)facts;
    if (m->framing == IDEM_HTTP_BODY_CHUNKED ||
        (m->framing == IDEM_HTTP_BODY_LENGTH && m->content_length > ADMIN_BODY_MAX)) {
        (void)idem__ostream_problem(os, 413, "request-too-large", "admin requests carry no body",
                                    0, NULL, IDEM_OS_CLOSE);
        return NULL;
    }
    admin_req_t *r = idem_malloc(sizeof *r + head_len);
    if (r == NULL)
        return NULL;
    memcpy(r->head, head, head_len);
    idem_http_head_state_t hs = {0};
    if (idem__http_parse_request(&hs, r->head, head_len, IDEM_HTTP_MAX_HEAD, &r->msg) <= 0) {
        idem_free(r);
        return NULL;
    }
    r->admin = h->data;
    r->os = os;
    return r;
}

static bool admin_on_expect(idem_hreq_t *r)
{
    (void)r;
    return true; /* a body too large was refused at the head */
}

static bool admin_on_body(idem_hreq_t *r, const char *p, size_t n)
{
    (void)r, (void)p, (void)n;
    return true; /* read and dropped */
}

/* Answer the whole request at once with the endpoints.  One whose answer
 * cannot be written becomes a 500 that closes; one that cannot even be that
 * is cut. */
static void admin_on_body_end(idem_hreq_t *hr)
{
    admin_req_t *r = hr;
    idem_answer_t a;
    answer_init(&a);
    admin_answer(r->admin, &r->msg, &a);
    int rc = -1;
    if (a.status != 0) {
        idem_http_field_t fields[2];
        idem_http_response_t resp = {.status = a.status, .fields = fields};
        if (a.content_type != NULL)
            fields[resp.n_fields++] = (idem_http_field_t){
                {"Content-Type", 12}, {a.content_type, strlen(a.content_type)}};
        if (a.www_authenticate != NULL)
            fields[resp.n_fields++] = (idem_http_field_t){
                {"WWW-Authenticate", 16}, {a.www_authenticate, strlen(a.www_authenticate)}};
        rc = idem__ostream_respond(r->os, &resp, a.close ? IDEM_OS_CLOSE : 0, a.body.data,
                                   a.body.len);
        if (rc != 0)
            rc = idem__ostream_problem(r->os, 500, "internal", "the answer could not be written",
                                       0, NULL, IDEM_OS_CLOSE);
    }
    answer_cleanup(&a);
    if (rc != 0)
        r->os->ops->abort(r->os);
    idem_free(r);
}

static void admin_on_body_error(idem_hreq_t *hr, int rc)
{
    admin_req_t *r = hr;
    if (rc == IDEM_CONN_E_BODY_TIMEOUT)
        rc = idem__ostream_problem(r->os, 408, "request-timeout",
                                   "the request body paused for longer than body_timeout", 0,
                                   NULL, IDEM_OS_CLOSE);
    else
        rc = idem__ostream_problem(r->os, 400, "bad-request", "malformed admin request body", 0,
                                   NULL, IDEM_OS_CLOSE);
    if (rc != 0)
        r->os->ops->abort(r->os);
    idem_free(r);
}

static void admin_on_proceed(idem_hreq_t *r) { (void)r; }

static void admin_on_gone(idem_hreq_t *r) { idem_free(r); }

static const idem_handler_ops_t admin_ops = {
    .on_head = admin_on_head,
    .on_expect = admin_on_expect,
    .on_body = admin_on_body,
    .on_body_end = admin_on_body_end,
    .on_body_error = admin_on_body_error,
    .on_proceed = admin_on_proceed,
    .on_gone = admin_on_gone,
    .on_refused = NULL, /* admin requests are not counted among idemd's */
};

/* ---- the listener and its thread ------------------------------------------- */

static void on_admin_stop(uv_async_t *as)
{
    idem_admin_t *a = as->data;
    idem__listener_close_handles(&a->listener);
    uv_close((uv_handle_t *)&a->stop_async, NULL);
    idem__conns_close_all(&a->listener);
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void *admin_main(void *arg)
{
    idem_admin_t *a = arg;
    pthread_setname_np(pthread_self(), "idem-admin");
    uv_run(&a->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* The Host names the admin answers: loopback's, its own address, admin_hosts. */
static void admin_hosts_init(idem_admin_t *a, const char *listen_host)
{
    const idem_config_t *cfg = a->gw->cfg;
    const char *fixed[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < 3; i++)
        snprintf(a->hosts[a->n_hosts++], sizeof a->hosts[0], "%s", fixed[i]);
    snprintf(a->hosts[a->n_hosts++], sizeof a->hosts[0], strchr(listen_host, ':') ? "[%s]" : "%s",
             listen_host);
    for (size_t i = 0; i < cfg->n_admin_hosts && a->n_hosts < ADMIN_MAX_HOSTS; i++)
        snprintf(a->hosts[a->n_hosts++], sizeof a->hosts[0], "%s", cfg->admin_hosts[i]);
}

int idem__admin_start(idem_gw_t *gw, int listen_fd, idem_admin_t **out, char *err, size_t errlen)
{
    *out = NULL;
    idem_admin_t *a = calloc(1, sizeof *a);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    a->gw = gw;
    /* The admin address was checked by the config's validation and bound by
     * main; its host is one of the names the Host check accepts. */
    char host[256] = "";
    int port;
    if (idem__config_parse_addr(gw->cfg->admin, host, sizeof host, &port) != 0)
        host[0] = '\0';
    admin_hosts_init(a, host);
    uv_loop_init(&a->loop);
    a->handler = (idem_handler_t){.ops = &admin_ops, .data = a, .body_max = ADMIN_BODY_MAX};
    const idem_listen_limits_t limits = {
        .max_conns = IDEM_ADMIN_MAX_CONNS,
        .write_high = ADMIN_WRITE_HIGH,
        .close_linger_ms = ADMIN_CLOSE_MS,
        .reuse_idle = true, /* room for probes, whatever idle clients hold */
    };
    idem__listener_init(&a->listener, gw, &a->loop, &a->handler, &limits);
    a->listener.data = a;
    if (idem__tcp_open_listener(&a->loop, &a->listener.tcp, &a->listener, listen_fd,
                                IDEM_ADMIN_BACKLOG, idem__conn_on_connection, "--admin", err,
                                errlen) != 0) {
        uv_walk(&a->loop, close_any, NULL);
        uv_run(&a->loop, UV_RUN_DEFAULT);
        uv_loop_close(&a->loop);
        free(a);
        return -1;
    }
    uv_async_init(&a->loop, &a->stop_async, on_admin_stop);
    a->stop_async.data = a;
    int prc = idem__thread_create(&a->thread, "admin", admin_main, a);
    if (prc != 0) {
        /* Never started, so never joined: its loop is closed here. */
        snprintf(err, errlen, "cannot start the admin thread: %s", strerror(prc));
        uv_walk(&a->loop, close_any, NULL);
        uv_run(&a->loop, UV_RUN_DEFAULT);
        uv_loop_close(&a->loop);
        free(a);
        return -1;
    }
    *out = a;
    return 0;
}

void idem__admin_stop(idem_admin_t *a)
{
    if (!a)
        return;
    uv_async_send(&a->stop_async);
    pthread_join(a->thread, NULL);
    uv_run(&a->loop, UV_RUN_DEFAULT);
    uv_loop_close(&a->loop);
    free(a);
}
