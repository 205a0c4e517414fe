/* src/store/redis_list.c - listing and bulk delete on every Redis store
 * (redis://, rediss://, redis+sentinel://, redis+cluster://): the list and
 * delete_if ops of store_impl.h, for the admin's GET and DELETE /keys.
 *
 A record is the key PREFIX SCOPE ":" KEY (redis.c), so a listing is a
 * SCAN with MATCH on the prefix (and the filter's scope and key prefix,
 * glob characters escaped), each step's keys read with one pipelined EVAL
 * of redis.c's read script per key (either layout of a record) and decoded
 * by redis.c's idem__redis_get_answer, then offered to the page (store.c).  A cluster is
 * walked master after master (in slot order), each with its own SCAN; a
 * key that moved meanwhile is read from its slot's master.
 *
 * The cursor.  SCAN's cursor is no key order, so the page's cursor is
 *   "r" NODE "." SCAN-CURSOR                      a step boundary, or
 *   "r" NODE "." SCAN-CURSOR "." KHEX "." HASH    within a step,
 * NODE the position of the server in the walk.  A page that fills (or spends
 * its budget) inside a step keeps that step's START cursor, the last key it
 * offered (K, in hex) and a hash of the step's keys up to K (the step's keys
 * are visited in byte order).  The next page runs the same step again and
 * skips its keys up to K only when they hash the same, that is when it is
 * the very set already offered; otherwise (keys added, removed or moved
 * meanwhile) it skips none, so a key may repeat but is never lost.
 * SCAN itself returns every key present for the whole scan at least once
 * and may return one twice (when its table is resized between steps): a
 * page drops a key it already holds, but across pages a key can repeat,
 * never be skipped (docs/admin.md).  A cluster resharded during a listing
 * gives no such promise.
 *
 * Work per page: at most the page's budget of records read, and that many
 * buckets' worth of SCAN steps (a filter that MATCH rejects costs SCAN
 * steps, not reads).
 *
 * delete_if: one Lua script (EVAL; Redis caches it) that deletes each key
 * only while its state and fence are what was listed and it is no token,
 * so a record claimed again or completed meanwhile stays.  One server: one
 * EVAL for the whole batch, atomic.  A cluster: one EVAL per key on its
 * slot's master (redis_cluster.c's slot command, which follows MOVED/ASK).
 *
 * THREADING: no state of its own; a connection is used by one thread.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/alloc.h"
#include "store/redis_conn.h"
#include "store/redis_impl.h"
#include "store/store_impl.h"

/* Hash buckets one SCAN step is asked to look at: about the page's limit
 * (within these bounds), so a page that stops inside a step and must
 * offer that step again leaves little to repeat. */
#define SCAN_COUNT_MIN 16
#define SCAN_COUNT_MAX 200
#define FETCH_MAX 200  /* reads pipelined at once */
#define PAT_MAX (2 * (IDEM_STORE_OPT_MAX + IDEM_SCOPE_MAX + 1 + IDEM_KEY_MAX) + 4)

/* ---- delete_if -------------------------------------------------------------- */

/* KEYS the records, ARGV st1 fe1 st2 fe2 ...; 1 for each key deleted.
 * Either layout of redis.c: a string (st, fl at bytes 2 and 3, fe '<i8'
 * from byte 4) or the hash before it (fields st, fe, fl). */
static const char lua_delete_if[] =
    "local out = {}\n"
    "for i = 1, #KEYS do\n"
    "  local st, fl, fe\n"
    "  local v = redis.pcall('GET', KEYS[i])\n"
    "  if type(v) == 'string' then\n"
    "    if #v >= 59 and string.byte(v, 1) == 2 then\n"
    "      st, fl, fe = struct.unpack('<BBi8', v, 2)\n"
    "    end\n"
    "  elseif type(v) == 'table' then\n"
    "    local h = redis.pcall('HMGET', KEYS[i], 'st', 'fe', 'fl')\n"
    "    if not h.err then\n"
    "      st, fe, fl = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])\n"
    "    end\n"
    "  end\n"
    "  local ok = 0\n"
    "  if st and fe and fl and st == tonumber(ARGV[2 * i - 1]) and\n"
    "     fe == tonumber(ARGV[2 * i]) and bit.band(fl, 4) == 0 then\n"
    "    redis.call('DEL', KEYS[i])\n"
    "    ok = 1\n"
    "  end\n"
    "  out[i] = ok\n"
    "end\n"
    "return out\n";

/* One delete_if call's arguments: EVAL script n keys..., st fe ... */
struct dargs {
    const char **argv;
    size_t *len;
    char *bufs; /* per item: key, state, fence */
};

#define NUMBUF 24

static idem_err_t dargs_make(const struct rcfg *cfg, const idem_store_listed_t *items, size_t n,
                             struct dargs *a, char *nbuf)
{
    size_t argc = 3 + 3 * n;
    a->argv = idem_calloc(argc, sizeof *a->argv);
    a->len = idem_calloc(argc, sizeof *a->len);
    a->bufs = idem_malloc(n * (IDEM__REDIS_KEYBUF + 2 * NUMBUF));
    if (a->argv == NULL || a->len == NULL || a->bufs == NULL)
        return IDEM_E_NOMEM;
    a->argv[0] = "EVAL";
    a->len[0] = 4;
    a->argv[1] = lua_delete_if;
    a->len[1] = sizeof lua_delete_if - 1;
    a->argv[2] = nbuf;
    a->len[2] = (size_t)snprintf(nbuf, NUMBUF, "%zu", n);
    for (size_t i = 0; i < n; i++) {
        char *b = a->bufs + i * (IDEM__REDIS_KEYBUF + 2 * NUMBUF);
        char *st = b + IDEM__REDIS_KEYBUF, *fe = st + NUMBUF;
        a->argv[3 + i] = b;
        a->len[3 + i] = idem__redis_make_key(cfg, &items[i].id, b);
        a->argv[3 + n + 2 * i] = st;
        a->len[3 + n + 2 * i] = (size_t)snprintf(st, NUMBUF, "%d", (int)items[i].rec.state);
        a->argv[4 + n + 2 * i] = fe;
        a->len[4 + n + 2 * i] =
            (size_t)snprintf(fe, NUMBUF, "%llu", (unsigned long long)items[i].rec.fence);
    }
    return IDEM_OK;
}

static void dargs_free(struct dargs *a)
{
    idem_free(a->argv);
    idem_free(a->len);
    idem_free(a->bufs);
}

/* The script's answer for count keys into removed; an error otherwise. */
static idem_err_t take_deleted(idem_store_t *base, const char *where, const redisReply *r,
                               size_t count, bool *removed, int *broken)
{
    if (r->type == REDIS_REPLY_ERROR) {
        idem__store_seterr(base, "redis %s: delete: %.150s", where, r->str);
        return idem__redis_map_error(r->str, broken);
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != count) {
        idem__store_seterr(base, "redis %s: delete: unexpected answer", where);
        return IDEM_E_IO;
    }
    for (size_t i = 0; i < count; i++)
        removed[i] = r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer == 1;
    return IDEM_OK;
}

idem_err_t idem__redis_delete_if(idem_store_t *base, const idem_store_listed_t *items, size_t n,
                                 bool *removed)
{
    idem__redis_nodes_t nd;
    idem_err_t err = base->ops == &idem__store_redis_cluster_ops ||
                             base->ops == &idem__store_rediss_cluster_ops
                         ? idem__redis_cluster_nodes(base, &nd)
                         : idem__redis_single_nodes(base, &nd);
    if (err != IDEM_OK)
        return err;
    for (size_t i = 0; i < n; i++)
        if (items[i].rec.fence >= (uint64_t)1 << 53) /* exact as a Lua number */
            return IDEM_E_INVAL;
    struct dargs a = {0};
    char nbuf[NUMBUF];
    int broken = 0;
    if (nd.slot_command == NULL) { /* one server: one script for the batch */
        err = dargs_make(nd.cfg, items, n, &a, nbuf);
        idem__rconn_t *c;
        void *hold;
        if (err == IDEM_OK)
            err = nd.borrow(base, 0, &c, &hold);
        if (err == IDEM_OK) {
            redisReply *r = NULL;
            if (idem__rconn_append(c, (int)(3 + 3 * n), a.argv, a.len) != 0 ||
                idem__rconn_get_reply(c, &r) != 0) {
                char why[200];
                idem__redis_errtext_io(why, sizeof why, nd.where, c, nd.cfg->timeout_ms);
                idem__store_seterr(base, "redis %s", why);
                broken = 1;
                err = IDEM_E_STORE_DOWN;
            } else {
                err = take_deleted(base, nd.where, r, n, removed, &broken);
            }
            freeReplyObject(r);
            nd.give_back(base, 0, hold, broken);
        }
        dargs_free(&a);
        return err;
    }
    /* a cluster: each key on its slot's master */
    for (size_t i = 0; i < n && err == IDEM_OK; i++) {
        err = dargs_make(nd.cfg, &items[i], 1, &a, nbuf);
        if (err == IDEM_OK) {
            redisReply *r = nd.slot_command(base, idem__redis_keyslot(a.argv[3], a.len[3]), 6,
                                            a.argv, a.len);
            if (r == NULL)
                err = IDEM_E_STORE_DOWN;
            else
                err = take_deleted(base, nd.where, r, 1, &removed[i], &broken);
            freeReplyObject(r);
        }
        dargs_free(&a);
        memset(&a, 0, sizeof a);
    }
    return err;
}

/* ---- list --------------------------------------------------------------------- */

struct pos {
    int node;                /* position in the walk */
    unsigned long long scan; /* SCAN cursor of the step */
    bool has_k;              /* resume within the step, after k */
    size_t klen;
    char k[IDEM__REDIS_KEYBUF];
    uint64_t hash;
};

/* Read "r" NODE "." SCAN ["." KHEX "." HASH]; "" is the start. */
static int parse_cursor(const char *raw, struct pos *p)
{
    memset(p, 0, sizeof *p);
    if (raw[0] == '\0')
        return 0;
    char *end;
    if (raw[0] != 'r' || raw[1] < '0' || raw[1] > '9')
        return -1;
    errno = 0;
    unsigned long node = strtoul(raw + 1, &end, 10);
    if (errno != 0 || node > 255 || *end != '.' || end[1] < '0' || end[1] > '9')
        return -1;
    p->node = (int)node;
    p->scan = strtoull(end + 1, &end, 10);
    if (errno != 0)
        return -1;
    if (*end == '\0')
        return 0;
    if (*end != '.')
        return -1;
    const char *h = end + 1, *dot = strchr(h, '.');
    if (dot == NULL || (dot - h) % 2 != 0 || dot == h ||
        (size_t)(dot - h) / 2 > sizeof p->k)
        return -1;
    p->klen = (size_t)(dot - h) / 2;
    for (size_t i = 0; i < p->klen; i++) {
        int hi = idem__store_hexval(h[2 * i]), lo = idem__store_hexval(h[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        p->k[i] = (char)(hi << 4 | lo);
    }
    if (strlen(dot + 1) != 16)
        return -1;
    for (int i = 0; i < 16; i++) {
        int v = idem__store_hexval(dot[1 + i]);
        if (v < 0)
            return -1;
        p->hash = p->hash << 4 | (uint64_t)v;
    }
    p->has_k = true;
    return 0;
}

static void cursor_at_step(idem__list_t *l, const idem__redis_nodes_t *nd, int node,
                           unsigned long long next)
{
    if (next == 0) {
        node++;
        if (node >= nd->n) {
            l->page->cursor[0] = '\0'; /* the walk is complete */
            return;
        }
    }
    snprintf(l->page->cursor, sizeof l->page->cursor, "r%d.%llu", node, next);
}

static void cursor_in_step(idem__list_t *l, int node, unsigned long long scan, const char *k,
                           size_t klen, uint64_t hash)
{
    static const char hex[] = "0123456789abcdef";
    char *c = l->page->cursor;
    int n = snprintf(c, IDEM_STORE_CURSOR_MAX, "r%d.%llu.", node, scan);
    c += n;
    for (size_t i = 0; i < klen; i++) {
        *c++ = hex[(unsigned char)k[i] >> 4];
        *c++ = hex[(unsigned char)k[i] & 15];
    }
    snprintf(c, 18, ".%016llx", (unsigned long long)hash);
}

/* FNV-1a over a key's length and bytes, continuing h. */
static uint64_t hash_key(uint64_t h, const char *k, size_t len)
{
    uint64_t n = len;
    for (int i = 0; i < 8; i++) {
        h ^= (n >> (8 * i)) & 0xff;
        h *= 1099511628211ull;
    }
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)k[i];
        h *= 1099511628211ull;
    }
    return h;
}

#define HASH_START 14695981039346656037ull

static int cmp_bytes(const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c != 0)
        return c;
    return al < bl ? -1 : al > bl;
}

static int cmp_reply(const void *x, const void *y)
{
    const redisReply *a = *(redisReply *const *)x, *b = *(redisReply *const *)y;
    return cmp_bytes(a->str, a->len, b->str, b->len);
}

/* Append s to the MATCH pattern at *m with glob characters escaped. */
static void pat_add(char *pat, size_t *m, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (strchr("*?[]\\^", s[i]) != NULL)
            pat[(*m)++] = '\\';
        pat[(*m)++] = s[i];
    }
}

/* The MATCH pattern: PREFIX [SCOPE ":" | "*:"] [KEYPREFIX] "*". */
static size_t make_pattern(const struct rcfg *cfg, const idem_store_filter_t *f, char *pat)
{
    size_t m = 0;
    pat_add(pat, &m, cfg->prefix, cfg->prefix_len);
    bool kp = f->prefix != NULL && f->prefix[0] != '\0';
    if (f->scope != NULL) {
        pat_add(pat, &m, f->scope, strlen(f->scope));
        pat[m++] = ':';
    } else if (kp) {
        pat[m++] = '*'; /* the scope holds no ':', so this ends at the key */
        pat[m++] = ':';
    }
    if (kp)
        pat_add(pat, &m, f->prefix, strlen(f->prefix));
    pat[m++] = '*';
    pat[m] = '\0';
    return m;
}

/* Whether the page already holds the record under sk (scope '\0' key). */
static bool in_page(const idem__list_t *l, const char *sk, size_t sl)
{
    for (size_t i = 0; i < l->page->n; i++) {
        const idem_key_id_t *id = &l->page->items[i].id;
        if (strcmp(id->scope, sk) == 0 && strcmp(id->key, sk + sl + 1) == 0)
            return true;
    }
    return false;
}

/* One SCAN step's state. */
struct step {
    redisReply *scan;     /* the SCAN answer */
    redisReply **keys;    /* its string keys, sorted, distinct */
    size_t nkeys;
    unsigned long long next;
};

/* SCAN from p->scan on c into st; an error with errstr set. */
static idem_err_t scan_once(idem_store_t *base, const idem__redis_nodes_t *nd, idem__rconn_t *c,
                            unsigned long long cur, const char *pat, size_t patlen,
                            size_t want, struct step *st, int *broken)
{
    char curbuf[24], count[8];
    const char *argv[] = {"SCAN", curbuf, "MATCH", pat, "COUNT", count};
    size_t len[] = {4, (size_t)snprintf(curbuf, sizeof curbuf, "%llu", cur), 5, patlen, 5,
                    (size_t)snprintf(count, sizeof count, "%zu", want)};
    redisReply *r = NULL;
    if (idem__rconn_append(c, 6, argv, len) != 0 || idem__rconn_get_reply(c, &r) != 0) {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, nd->where, c, nd->cfg->timeout_ms);
        idem__store_seterr(base, "redis %s", why);
        *broken = 1;
        return IDEM_E_STORE_DOWN;
    }
    char buf[24], *end;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len == 0 ||
        r->element[0]->len >= sizeof buf || r->element[1]->type != REDIS_REPLY_ARRAY) {
        idem__store_seterr(base, "redis %s: SCAN: %.150s", nd->where,
                           r->type == REDIS_REPLY_ERROR ? r->str : "unexpected answer");
        idem_err_t err = r->type == REDIS_REPLY_ERROR ? idem__redis_map_error(r->str, broken)
                                                      : IDEM_E_IO;
        freeReplyObject(r);
        return err;
    }
    memcpy(buf, r->element[0]->str, r->element[0]->len);
    buf[r->element[0]->len] = '\0';
    errno = 0;
    st->next = strtoull(buf, &end, 10);
    if (errno != 0 || *end != '\0') {
        idem__store_seterr(base, "redis %s: SCAN gave a bad cursor", nd->where);
        freeReplyObject(r);
        return IDEM_E_IO;
    }
    const redisReply *ks = r->element[1];
    st->scan = r;
    st->keys = idem_calloc(ks->elements ? ks->elements : 1, sizeof *st->keys);
    if (st->keys == NULL)
        return IDEM_E_NOMEM;
    for (size_t i = 0; i < ks->elements; i++)
        if (ks->element[i]->type == REDIS_REPLY_STRING && ks->element[i]->len < IDEM__REDIS_KEYBUF)
            st->keys[st->nkeys++] = ks->element[i];
    qsort(st->keys, st->nkeys, sizeof *st->keys, cmp_reply);
    size_t w = 0;
    for (size_t i = 0; i < st->nkeys; i++)
        if (w == 0 || cmp_reply(&st->keys[w - 1], &st->keys[i]) != 0)
            st->keys[w++] = st->keys[i];
    st->nkeys = w;
    return IDEM_OK;
}

/* Read every key of keys[0..n) on c, pipelined, into out[0..n) (a
 * cluster's key that moved is read from its slot's master). */
static idem_err_t fetch(idem_store_t *base, const idem__redis_nodes_t *nd, idem__rconn_t *c,
                        redisReply **keys, size_t n, redisReply **out, int *broken)
{
    for (size_t i = 0; i < n; i++) {
        const char *argv[] = {"EVAL", idem__redis_read_script, "1", keys[i]->str};
        size_t len[] = {4, idem__redis_read_script_len, 1, keys[i]->len};
        if (idem__rconn_append(c, 4, argv, len) != 0)
            return IDEM_E_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        if (idem__rconn_get_reply(c, &out[i]) != 0) {
            char why[200];
            idem__redis_errtext_io(why, sizeof why, nd->where, c, nd->cfg->timeout_ms);
            idem__store_seterr(base, "redis %s", why);
            *broken = 1;
            return IDEM_E_STORE_DOWN;
        }
        if (nd->slot_command != NULL && out[i]->type == REDIS_REPLY_ERROR &&
            (strncmp(out[i]->str, "MOVED ", 6) == 0 || strncmp(out[i]->str, "ASK ", 4) == 0 ||
             strncmp(out[i]->str, "TRYAGAIN", 8) == 0)) {
            const char *argv[] = {"EVAL", idem__redis_read_script, "1", keys[i]->str};
            size_t len[] = {4, idem__redis_read_script_len, 1, keys[i]->len};
            freeReplyObject(out[i]);
            out[i] = nd->slot_command(base, idem__redis_keyslot(keys[i]->str, keys[i]->len), 4,
                                      argv, len);
            if (out[i] == NULL)
                return IDEM_E_STORE_DOWN;
        }
    }
    return IDEM_OK;
}

/* Offer one fetched key; 1 when the page must stop after it, -1 on a store
 * error (returned in *err). */
static int offer(idem_store_t *base, const idem__redis_nodes_t *nd, idem__list_t *l,
                 const redisReply *key, const redisReply *ans, idem_err_t *err, int *broken)
{
    char sk[IDEM_STORE_KEY_MAX];
    size_t pl = nd->cfg->prefix_len;
    const char *colon = key->len > pl ? memchr(key->str + pl, ':', key->len - pl) : NULL;
    if (colon == NULL || memcmp(key->str, nd->cfg->prefix, pl) != 0 ||
        key->len - pl > sizeof sk)
        return idem__store_list_offer_head(l, "", 0, NULL);
    size_t sl = (size_t)(colon - key->str) - pl, skl = key->len - pl;
    memcpy(sk, key->str + pl, skl);
    sk[sl] = '\0';
    idem_record_t rec;
    idem_err_t e = idem__redis_get_answer(base, nd->where, ans, l->f->now_ms, &rec, broken);
    if (e == IDEM_E_NOTFOUND || e == IDEM_E_CORRUPT)
        return idem__store_list_offer_head(l, sk, skl, NULL);
    if (e != IDEM_OK) {
        *err = e;
        return -1;
    }
    int stop;
    if (sl <= IDEM_SCOPE_MAX && skl - sl - 1 <= IDEM_KEY_MAX && memchr(sk, '\0', sl) == NULL &&
        memchr(sk + sl + 1, '\0', skl - sl - 1) == NULL && in_page(l, sk, sl)) {
        l->visited++; /* already on this page (SCAN gave it twice) */
        stop = l->visited >= l->budget;
    } else {
        stop = idem__store_list_offer_head(l, sk, skl, &rec);
    }
    idem_record_cleanup(&rec);
    return stop;
}

/* Visit one step's keys from index `from`; 1 when the page stopped (its
 * cursor set), 0 when the step is done, -1 on an error (*err). */
static int visit(idem_store_t *base, const idem__redis_nodes_t *nd, idem__list_t *l,
                 idem__rconn_t *c, struct step *st, size_t from, int node,
                 unsigned long long scan, uint64_t hash, idem_err_t *err, int *broken)
{
    redisReply *ans[FETCH_MAX];
    for (size_t i = from; i < st->nkeys;) {
        size_t n = st->nkeys - i < FETCH_MAX ? st->nkeys - i : FETCH_MAX;
        memset(ans, 0, sizeof ans);
        *err = fetch(base, nd, c, st->keys + i, n, ans, broken);
        int stop = 0;
        size_t j = 0;
        for (; j < n && *err == IDEM_OK && !stop; j++) {
            hash = hash_key(hash, st->keys[i + j]->str, st->keys[i + j]->len);
            stop = offer(base, nd, l, st->keys[i + j], ans[j], err, broken);
        }
        for (size_t q = 0; q < n; q++)
            freeReplyObject(ans[q]);
        if (*err != IDEM_OK || stop < 0)
            return -1;
        if (stop) {
            size_t last = i + j - 1;
            if (last + 1 == st->nkeys)
                cursor_at_step(l, nd, node, st->next);
            else
                cursor_in_step(l, node, scan, st->keys[last]->str, st->keys[last]->len, hash);
            return 1;
        }
        i += n;
    }
    return 0;
}

idem_err_t idem__redis_list(idem_store_t *base, idem__list_t *l)
{
    idem__redis_nodes_t nd;
    struct pos p;
    if (l->has_after || parse_cursor(l->raw, &p) != 0)
        return IDEM_E_INVAL; /* a cursor of another store */
    idem_err_t err = base->ops == &idem__store_redis_cluster_ops ||
                             base->ops == &idem__store_rediss_cluster_ops
                         ? idem__redis_cluster_nodes(base, &nd)
                         : idem__redis_single_nodes(base, &nd);
    if (err != IDEM_OK)
        return err;
    char *pat = idem_malloc(PAT_MAX);
    if (pat == NULL)
        return IDEM_E_NOMEM;
    size_t patlen = make_pattern(nd.cfg, l->f, pat);
    size_t want = l->limit < SCAN_COUNT_MIN   ? SCAN_COUNT_MIN
                  : l->limit > SCAN_COUNT_MAX ? SCAN_COUNT_MAX
                                              : l->limit;
    size_t steps_max = l->budget / want + 1;

    l->page->cursor[0] = '\0';
    int node = p.node;
    unsigned long long scan = p.scan;
    bool resume = p.has_k;
    for (size_t steps = 0; node < nd.n; steps++) {
        if (steps == steps_max) {
            snprintf(l->page->cursor, sizeof l->page->cursor, "r%d.%llu", node, scan);
            break;
        }
        idem__rconn_t *c;
        void *hold;
        int broken = 0;
        err = nd.borrow(base, nd.slot_command ? nd.node[node] : 0, &c, &hold);
        if (err != IDEM_OK)
            break;
        struct step st = {0};
        err = scan_once(base, &nd, c, scan, pat, patlen, want, &st, &broken);
        int done = 0;
        if (err == IDEM_OK) {
            size_t from = 0;
            uint64_t hash = HASH_START;
            if (resume) { /* skip what the last page offered, if it is the same set */
                size_t upto = 0;
                uint64_t h = HASH_START;
                while (upto < st.nkeys &&
                       cmp_bytes(st.keys[upto]->str, st.keys[upto]->len, p.k, p.klen) <= 0) {
                    h = hash_key(h, st.keys[upto]->str, st.keys[upto]->len);
                    upto++;
                }
                if (h == p.hash) {
                    from = upto;
                    hash = h;
                }
                resume = false;
            }
            done = visit(base, &nd, l, c, &st, from, node, scan, hash, &err, &broken);
        }
        nd.give_back(base, nd.slot_command ? nd.node[node] : 0, hold, broken);
        unsigned long long next = st.next;
        freeReplyObject(st.scan);
        idem_free(st.keys);
        if (err != IDEM_OK || done != 0)
            break;
        if (next == 0) {
            node++;
            scan = 0;
        } else {
            scan = next;
        }
    }
    idem_free(pat);
    return err;
}
