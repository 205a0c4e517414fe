/* src/store/redis.c - the networked store on Redis ("redis://", "redis+sentinel://",
 * and over TLS "rediss://", "rediss+sentinel://").
 *
 * Many idemd instances share one Redis.  Every op kind's decision is one
 * Lua function that reads the key's record, decides and writes in one
 * atomic step, written once and loaded in two forms: an op script per kind
 * (one op per EVALSHA) and the batch script, which runs every op of a batch
 * in order under pcall and answers an array of their answers.  A batch is
 * ONE EVALSHA of the batch script, in ONE round trip (its keys in KEYS, in
 * ARGV a frame and each op's arguments: idem__redis_append_batch), so its
 * ops run in order and nothing else runs between them; Redis parses and
 * dispatches one command a batch, not MULTI, N EVALSHA and EXEC as before
 * issue 20.  The scripts decide exactly as idem_decide (rule order of
 * include/idem/engine.h), idem_token_decide and idem__store_apply do; the
 * store conformance suite runs the same cases here as on memory: and lmdb:,
 * and a differential test compares the two on random op sequences.  Time is
 * always the caller's (op->now_ms ...), passed as a decimal string, never
 * Redis's TIME, so every backend decides alike.
 *
 * Layout.  A record is one string at PREFIX SCOPE ":" KEY (scope is
 * "anonymous" or 64 hex digits, so the split is unambiguous; a token's key
 * starts with "\x01tok:", which Redis keys, being binary-safe, take as they
 * are).  Its value, layout 2: a header of 27 bytes, struct.pack('<BBBi8i8i8')
 * of 2 (the layout's version), st (1 in_progress, 2 completed), fl
 * (IDEM_REC_* flags), fe (fence), lu (lease end, ms) and ex (retention end,
 * ms); the 32 raw fingerprint bytes; and for a completed record with a
 * response, the whole record as idem_record_encode writes it.  The header
 * is what the scripts decide on and is authoritative; the record is the
 * only thing a replay and get decode (decoding stays in C).  Every write is
 * one SET key value PXAT ex and every read one GET, so a claim of a new key
 * is two redis.call and a completion two (layout 1 took five and three).
 * A completion's record is encoded here with the caller's fence and a zero
 * fingerprint and sent cut around the fingerprint; the script builds the
 * value in one concatenation with the stored fingerprint in both places, so
 * the record is always exact; its checksum (record.h, version 2) was
 * computed with the zero fingerprint, so it is decoded with
 * idem__record_decode_spliced, which checks every other byte, and its
 * fingerprint is compared with the header's.  Records without a response
 * (in_progress, tokens) end after the fingerprint: C rebuilds them from the
 * header.  A get or replay whose record does not agree with the header is
 * IDEM_E_CORRUPT, and so is a string of another version (a newer idemd's).
 *
 * Layout 1 (idemd before issue 20's layout 2) was a hash with fields st,
 * fl, fp, fe, lu, ex (decimal strings but fp) and r (the encoded record).
 * Every reader still takes it: load() falls back to HGETALL when GET
 * answers WRONGTYPE, the read script (get, listing) to HMGET, the sweep and
 * redis_list.c's delete_if to the fields; a write turns it into layout 2
 * (SET replaces a value of any type).  docs/stores.md says what an upgrade
 * of several idemd sharing one Redis must mind.
 *
 * Numbers.  Lua numbers are doubles, exact for integers below 2^53 (in ms,
 * some 285,000 years after 1970), so an op whose times or fence lie outside +-(2^53 - 1) is
 * refused alone with IDEM_E_INVAL; struct's '<i8' packs and unpacks them
 * exactly.  The one decimal a script writes, PXAT's, is the caller's string
 * or string.format("%.0f") (never Lua's tostring, which gives "%.14g").
 *
 * Retention is native: every write sets PXAT expires_at, so Redis
 * deletes a record when its retention ends (Redis's clock is the wall clock,
 * as the callers' is).  A record still present past expires_at at the
 * caller's now counts as absent, as in every store.  Unlike LMDB, a fenced op
 * cannot finish a record past its retention once Redis has removed it.
 * Redis's active expiry keeps pace by itself: ten times a second it samples
 * keys with a TTL and deletes the expired, repeating while more than 10% of
 * a sample had expired (up to a quarter of its CPU), so the expired keys
 * stay a small fraction of memory at any arrival rate Redis can take.
 * sweep therefore asks Redis's clock (TIME) first and does nothing while
 * the caller's now is at most SWEEP_NATIVE_SLACK_MS ahead of it: idemd's
 * sweeper costs one round trip a second and never visits a live record.
 * Only a caller whose clock runs further ahead (tests, a skewed host) gets
 * the scan that honours the contract word for word: SCAN PREFIX* from a
 * cursor kept in the handle, deleting by script the keys whose ex <= now,
 * visiting at most max keys per call.
 *
 * Connections.  The store API is blocking and called from several threads
 * (idemd's writer doing exec, workers and the admin thread doing get and
 * ping), so the handle keeps a pool (src/store/pool.c, shared with
 * postgres.c) of at most pool= blocking connections of our own
 * (src/store/redis_conn.c: a socket, hiredis's command formatter and reply
 * reader, and under TLS a session of core/tls.h), each with connect and
 * command timeouts (timeout=).  A new connection authenticates
 * (AUTH pass, or AUTH user pass), selects the db, and loads every script
 * (SCRIPT LOAD, pipelined); an idle connection the server has closed (or
 * sent something unasked: the pool's healthy callback) is dropped before
 * use.  A
 * connection that fails mid-call is dropped, and so are the idle ones
 * opened before it: the server probably restarted.  If opening a
 * connection fails, the store is "down": the next attempt is allowed only
 * after the pool's backoff (100 ms doubling to 5 s, jittered, reset on
 * success), and meanwhile every call fails at once with IDEM_E_STORE_DOWN,
 * so an outage costs microseconds per request, not a connect timeout.  The
 * URL is cut into its parts, hosts and percent-escapes by src/core/url.c;
 * the words of its errors are this file's.
 *
 * Failures.  A connection error or timeout after a batch was sent leaves its
 * outcome unknown: exec returns IDEM_E_STORE_DOWN for the whole batch and the
 * caller must treat its keys as in-progress/unknown (idemd answers 503 and
 * the lease covers a claim that did land).  NOSCRIPT (after SCRIPT FLUSH or a
 * failover to a server that never saw our scripts): nothing ran; the
 * scripts are loaded again and the batch sent again, once.  OOM -> the op
 * gets IDEM_E_STORE_FULL (the scripts decide before they write, and the
 * batch script has no "#!lua" line, so Redis refuses a script's first
 * write, not the whole call: an op refused for memory wrote nothing);
 * READONLY -> IDEM_E_STORE_DOWN and the pool is renewed.  When no op of a
 * batch ran, the error is the batch's.  An "ERR" answer to the whole batch
 * call is the script failing while it ran (its ops run under pcall, so
 * only a fault of the script itself): some ops may have been applied, so
 * it is IDEM_E_STORE_DOWN for the batch, an outcome unknown, as a lost
 * connection is.
 *
 * Replicas: wait=N (0..16, 0 the default: off) sends WAIT N timeout on the
 * same connection after every batch in which a script ran (any op: a claim
 * that only replays wrote nothing, and its WAIT answers at once unless the
 * connection's earlier writes are still unacknowledged), and after ping.
 * Fewer than N acknowledgements is IDEM_E_STORE_DOWN for the whole batch,
 * "WAIT: 0 of 1 replicas acknowledged within 500 ms" in errstr: the writes
 * are on the master, but the caller acts on none of them (a claim is not
 * forwarded, a completion not answered), so a failover cannot lose a key
 * idemd acted on.  docs/stores.md says what each deployment can lose.
 *
 * Sentinel: redis+sentinel://host:port[,host:port...]/master-name[/db][?...]
 * asks each sentinel in turn SENTINEL get-master-addr-by-name, connects to
 * the answer and checks that ROLE says master.  Every new connection asks
 * again, so a failover is followed as soon as the old connections break or
 * answer READONLY.  The URL's user and password are the master's; the
 * sentinels are asked without AUTH.
 *
 * TLS: rediss:// (and rediss+sentinel://, sentinels included) makes one
 * client context at open from ca=, cert=, key= and verify= (core/tls.h;
 * its file errors are turned into ones that name the URL's parameter), and
 * every connection a session under it, checked against sni= or the host
 * it connects to.  A certificate that fails is a connect that fails: the
 * open fails, or the store is down, with "TLS: certificate verify failed:
 * ..." in the reason.
 *
 * SIGPIPE: redis_conn.c writes with MSG_NOSIGNAL, so a server that closed
 * the socket cannot kill the caller.
 *
 * THREADING: every op except open and close may be called from any number
 * of threads at once.  The pool's lock guards the connections and the
 * backoff state; a connection is used by one thread at a time (taken out of
 * the pool); the sweep position has its own lock, held by one sweep call
 * across its round trips; no other lock is held across a round trip.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/tls.h"
#include "core/url.h"
#include "idem/alloc.h"
#include "idem/units.h"
#include "core/record_splice.h"
#include "store/pool.h"
#include "store/redis_conn.h"
#include "store/redis_impl.h"
#include "store/store_impl.h"

#define DEFAULT_PORT 6379
#define DEFAULT_SENTINEL_PORT 26379
#define DEFAULT_PREFIX "idem:"
#define DEFAULT_POOL 4
#define POOL_MAX 64
#define DEFAULT_TIMEOUT_MS 2000
#define TIMEOUT_MAX_MS 60000
#define WAIT_MAX 16 /* wait=N: at most this many replicas */
#define HOST_MAX IDEM__REDIS_HOST_MAX
#define USER_MAX 128
#define PASS_MAX 512
#define MASTER_MAX 64
#define SENTINELS_MAX IDEM__REDIS_SEEDS_MAX
#define PATH_OPT_MAX IDEM__REDIS_PATH_OPT_MAX /* ca=, cert=, key=: a path, decoded */
#define DB_MAX 2147483647ll
#define EXACT_MAX ((int64_t)1 << 53) /* Lua numbers are doubles */
#define KEYBUF IDEM__REDIS_KEYBUF
#define SWEEP_SCAN_COUNT "1000"    /* hash slots one SCAN step looks at */
#define SWEEP_STEPS_MAX 16         /* SCAN steps in one sweep call: a bounded stall */
#define SWEEP_KEYS_PER_CALL 500    /* keys in one sweep script call */
#define SWEEP_NATIVE_SLACK_MS 1000 /* a caller's clock this far ahead of Redis's: no scan */

/* The numbers the scripts use, tied to the C definitions. */
_Static_assert(IDEM_STATE_IN_PROGRESS == 1 && IDEM_STATE_COMPLETED == 2, "Lua: st");
_Static_assert(IDEM_REC_HELD == 1 && IDEM_REC_NOT_RETAINED == 2 && IDEM_REC_TOKEN == 4,
               "Lua: fl");
_Static_assert(IDEM_DECIDE_CLAIM == 1 && IDEM_DECIDE_TAKEOVER == 2 && IDEM_DECIDE_REPLAY == 3 &&
                   IDEM_DECIDE_IN_FLIGHT == 4 && IDEM_DECIDE_MISMATCH == 5 &&
                   IDEM_DECIDE_IN_FLIGHT_UNKNOWN == 6 && IDEM_DECIDE_NOT_RETAINED == 7 &&
                   IDEM_DECIDE_RECONCILE == 8,
               "Lua: decision kinds");
_Static_assert(IDEM_TOKEN_FIRST_USE == 1 && IDEM_TOKEN_USED == 2 && IDEM_TOKEN_INVALID == 3,
               "Lua: token verdicts");
_Static_assert(IDEM_FP_LEN == 32, "Lua: fp is 32 bytes");

/* ---- the scripts ---------------------------------------------------------- */

/* Layout 2 of a record (a string value; see the file's head): its version
 * byte, the header's size (version, st, fl, then fe, lu, ex as '<i8'), and
 * the size of a value without a response (the header and fp). */
#define V2_VERSION 2
#define V2_HDR 27
#define V2_MIN (V2_HDR + IDEM_FP_LEN)

/* What a script returns first: the op's status. */
enum { ST_OK = 0, ST_FENCE = 1, ST_EXISTS = 2, ST_CORRUPT = 3, ST_NOTFOUND = 4 };

/* The batch script finds each op's function as fn[script index + 1]. */
_Static_assert(S_CLAIM == 0 && S_COMPLETE == 1 && S_HOLD == 2 && S_RENEW == 3 &&
                   S_RELEASE == 4 && S_DELETE == 5 && S_TOKEN_ISSUE == 6 && S_TOKEN_USE == 7 &&
                   S_TOKEN_RESTORE == 8,
               "Lua: the batch's fn table");

/* Every op's decision is written once, as a Lua function op_KIND(k, a, j)
 * of the record's key k and its arguments a[j + 1] ...: the op script
 * (EVALSHA of one op, on a cluster the path of an op that was redirected)
 * is the prelude, that function and "return op_KIND(KEYS[1], ARGV, 0)";
 * the batch script is the prelude, every function and a loop over the
 * batch's ops (lua_batch).  Nothing but the calling differs.
 *
 * Shared by every op script.  load(k) is the record: its header's numbers
 * (st, fl, fe, lu, ex), fp and the whole value v (a layout 1 hash's, by
 * load1, made into the layout 2 value it would be); nil when there is
 * none, false when what is there is not a record of ours (parse says so of
 * a string).  Any other error of the read (on a cluster: a key this node
 * does not serve, the cluster down) is raised before the op wrote
 * anything; the batch script answers it as that op's error.  put(k, ...)
 * writes a record: one SET ... PXAT ex (ex < 1, which SET refuses, is a
 * DEL: a retention already over), the encoded record's two parts rh and rt
 * around its fingerprint for a completion. */
#define LUA_PRELUDE                                                                   \
    "local function hdr(st, fl, fe, lu, ex)\n"                                        \
    "  return struct.pack('<BBBi8i8i8', 2, st, fl, fe, lu, ex)\n"                     \
    "end\n"                                                                           \
    "local function int(x) return string.format('%.0f', x) end\n"                     \
    "local function whole(x) return x and x == math.floor(x) end\n"                   \
    "local function load1(k)\n"                                                       \
    "  local v = redis.pcall('HGETALL', k)\n"                                         \
    "  if v.err then\n"                                                               \
    "    if string.sub(v.err, 1, 9) == 'WRONGTYPE' then return false end\n"           \
    "    error(v)\n"                                                                  \
    "  end\n"                                                                         \
    "  local h = {}\n"                                                                \
    "  for i = 1, #v, 2 do h[v[i]] = v[i + 1] end\n"                                  \
    "  local st, fl, fe = tonumber(h.st), tonumber(h.fl), tonumber(h.fe)\n"           \
    "  local lu, ex = tonumber(h.lu), tonumber(h.ex)\n"                               \
    "  if (st ~= 1 and st ~= 2) or not whole(fl) or fl < 0 or fl > 7 or\n"            \
    "     not whole(fe) or fe < 0 or not whole(lu) or not whole(ex) or\n"             \
    "     not h.fp or #h.fp ~= 32 then\n"                                             \
    "    return false\n"                                                              \
    "  end\n"                                                                         \
    "  return {st = st, fl = fl, fe = fe, lu = lu, ex = ex, fp = h.fp,\n"             \
    "    v = hdr(st, fl, fe, lu, ex) .. h.fp .. (h.r or '')}\n"                       \
    "end\n"                                                                           \
    "local function parse(v)\n"                                                       \
    "  if #v < 59 then return false end\n"                                            \
    "  local ver, st, fl, fe, lu, ex = struct.unpack('<BBBi8i8i8', v)\n"              \
    "  if ver ~= 2 or (st ~= 1 and st ~= 2) or fl > 7 or fe < 0 then\n"               \
    "    return false\n"                                                              \
    "  end\n"                                                                         \
    "  return {st = st, fl = fl, fe = fe, lu = lu, ex = ex,\n"                        \
    "    fp = string.sub(v, 28, 59), v = v}\n"                                        \
    "end\n"                                                                           \
    "local function load(k)\n"                                                        \
    "  local v = redis.pcall('GET', k)\n"                                             \
    "  if not v then return nil end\n"                                                \
    "  if type(v) == 'table' then\n"                                                  \
    "    if string.sub(v.err, 1, 9) == 'WRONGTYPE' then return load1(k) end\n"        \
    "    error(v)\n"                                                                  \
    "  end\n"                                                                         \
    "  return parse(v)\n"                                                             \
    "end\n"                                                                           \
    "local function put(k, st, fl, fe, lu, ex, exs, fp, rh, rt)\n"                    \
    "  if ex < 1 then\n"                                                              \
    "    redis.call('DEL', k)\n"                                                      \
    "  elseif rh then\n"                                                              \
    "    redis.call('SET', k, hdr(st, fl, fe, lu, ex) .. fp .. rh .. fp .. rt,\n"     \
    "      'PXAT', exs)\n"                                                            \
    "  else\n"                                                                        \
    "    redis.call('SET', k, hdr(st, fl, fe, lu, ex) .. fp, 'PXAT', exs)\n"          \
    "  end\n"                                                                         \
    "end\n"                                                                           \
    "local function owns(k, fence)\n"                                                 \
    "  local r = load(k)\n"                                                           \
    "  if r == false then return nil, 3 end\n"                                        \
    "  if r == nil or r.st ~= 1 or r.fe ~= tonumber(fence) then return nil, 1 end\n"  \
    "  return r, 0\n"                                                                 \
    "end\n"                                                                           \
    "local function tokdecide(r, now)\n"                                              \
    "  if r == nil or now >= r.ex or bit.band(r.fl, 4) == 0 then return 3 end\n"      \
    "  if r.st == 2 then return 2 end\n"                                              \
    "  return 1\n"                                                                    \
    "end\n"

/* CLAIM: a now, fp, lease_until, expires_at.  idem_decide, rule by rule;
 * {0, kind, fence, retry_after} or, for a replay, the record's value too.
 * A new key is the common case, so the claim first writes the record of a
 * new key (fence 1) with SET NX ... GET: one redis.call when the key
 * was absent (rule 1); else nothing was written and the old value is what
 * the rules decide on, as load() would have read it.  When that SET is
 * refused (a layout 1 hash: WRONGTYPE; OOM; a read-only replica) the claim
 * reads as any op does, so a replay is still answered by a full or
 * read-only server. */
#define LUA_OP_CLAIM                                                                  \
    "local function secs(u, now)\n"                                                   \
    "  local d = u - now\n"                                                           \
    "  if d <= 0 then return 1 end\n"                                                 \
    "  local s = math.floor(d / 1000)\n"                                              \
    "  if d - s * 1000 > 0 then s = s + 1 end\n"                                      \
    "  return s\n"                                                                    \
    "end\n"                                                                           \
    "local function op_claim(k, a, j)\n"                                              \
    "  local now, fp, ex = tonumber(a[j + 1]), a[j + 2], tonumber(a[j + 4])\n"        \
    "  local r\n"                                                                     \
    "  if ex >= 1 then\n"                                                             \
    "    local v = hdr(1, 0, 1, tonumber(a[j + 3]), ex) .. fp\n"                      \
    "    v = redis.pcall('SET', k, v, 'NX', 'PXAT', a[j + 4], 'GET')\n"               \
    "    if not v then return {0, 1, 1, 0} end\n"                                     \
    "    if type(v) == 'string' then r = parse(v) else r = load(k) end\n"             \
    "  else\n"                                                                        \
    "    r = load(k)\n"                                                               \
    "  end\n"                                                                         \
    "  if r == false then return {3} end\n"                                           \
    "  local kind, fence, retry = 0, 0, 0\n"                                          \
    "  if r == nil then kind, fence = 1, 1\n"                                         \
    "  elseif now >= r.ex then kind, fence = 1, r.fe + 1\n"                           \
    "  else\n"                                                                        \
    "    fence = r.fe\n"                                                              \
    "    if r.fp ~= fp then kind = 5\n"                                               \
    "    elseif r.st == 1 then\n"                                                     \
    "      if bit.band(r.fl, 1) ~= 0 and now >= r.lu then\n"                          \
    "        kind, fence, retry = 8, r.fe + 1, secs(r.ex, now)\n"                     \
    "      elseif bit.band(r.fl, 1) ~= 0 then kind, retry = 6, secs(r.ex, now)\n"     \
    "      elseif now < r.lu then kind, retry = 4, secs(r.lu, now)\n"                 \
    "      else kind, fence = 2, r.fe + 1 end\n"                                      \
    "    elseif bit.band(r.fl, 2) ~= 0 then kind = 7\n"                               \
    "    else kind = 3 end\n"                                                         \
    "  end\n"                                                                         \
    "  if kind == 1 or kind == 2 then\n"                                              \
    "    put(k, 1, 0, fence, tonumber(a[j + 3]), tonumber(a[j + 4]), a[j + 4], fp)\n" \
    "  elseif kind == 8 then\n"                                                       \
    "    put(k, 1, r.fl, fence, tonumber(a[j + 3]), r.ex, int(r.ex), r.fp)\n"         \
    "  elseif kind == 3 then\n"                                                       \
    "    return {0, kind, fence, 0, r.v}\n"                                           \
    "  end\n"                                                                         \
    "  return {0, kind, fence, retry}\n"                                              \
    "end\n"

/* COMPLETE: a fence, flags, expires_at, and the record C encoded with a
 * zero fingerprint cut around it: its bytes 1..9 and 42.. (Lua's
 * counting), so that the value is built in one concatenation with the
 * stored fingerprint in both places. */
#define LUA_OP_COMPLETE                                                               \
    "local function op_complete(k, a, j)\n"                                           \
    "  local r, e = owns(k, a[j + 1])\n"                                              \
    "  if not r then return {e} end\n"                                                \
    "  put(k, 2, tonumber(a[j + 2]), r.fe, 0, tonumber(a[j + 3]), a[j + 3], r.fp,\n"  \
    "    a[j + 4], a[j + 5])\n"                                                       \
    "  return {0}\n"                                                                  \
    "end\n"

/* HOLD: a fence, lease_until, expires_at. */
#define LUA_OP_HOLD                                                                   \
    "local function op_hold(k, a, j)\n"                                               \
    "  local r, e = owns(k, a[j + 1])\n"                                              \
    "  if not r then return {e} end\n"                                                \
    "  put(k, 1, bit.bor(r.fl, 1), r.fe, tonumber(a[j + 2]), tonumber(a[j + 3]),\n"   \
    "    a[j + 3], r.fp)\n"                                                           \
    "  return {0}\n"                                                                  \
    "end\n"

/* RENEW: a fence, lease_until; retention raised to the lease end. */
#define LUA_OP_RENEW                                                                  \
    "local function op_renew(k, a, j)\n"                                              \
    "  local r, e = owns(k, a[j + 1])\n"                                              \
    "  if not r then return {e} end\n"                                                \
    "  local lu = tonumber(a[j + 2])\n"                                               \
    "  if r.ex < lu then put(k, 1, r.fl, r.fe, lu, lu, a[j + 2], r.fp)\n"             \
    "  else put(k, 1, r.fl, r.fe, lu, r.ex, int(r.ex), r.fp) end\n"                   \
    "  return {0}\n"                                                                  \
    "end\n"

/* RELEASE: a fence. */
#define LUA_OP_RELEASE                                                                \
    "local function op_release(k, a, j)\n"                                            \
    "  local r, e = owns(k, a[j + 1])\n"                                              \
    "  if not r then return {e} end\n"                                                \
    "  redis.call('DEL', k)\n"                                                        \
    "  return {0}\n"                                                                  \
    "end\n"

/* DELETE: unconditional; a script too, so that every op of a batch is one
 * and NOSCRIPT hits all of them or none. */
#define LUA_OP_DELETE                                                                 \
    "local function op_delete(k, a, j)\n"                                             \
    "  if redis.call('DEL', k) == 1 then return {0} end\n"                            \
    "  return {4}\n"                                                                  \
    "end\n"

/* TOKEN_ISSUE: a now, expires_at. */
#define LUA_OP_TOKEN_ISSUE                                                            \
    "local function op_token_issue(k, a, j)\n"                                        \
    "  local r = load(k)\n"                                                           \
    "  if r and tonumber(a[j + 1]) < r.ex then return {2} end\n"                      \
    "  local ex = tonumber(a[j + 2])\n"                                               \
    "  put(k, 1, 4, 1, ex, ex, a[j + 2], string.rep(string.char(0), 32))\n"           \
    "  return {0}\n"                                                                  \
    "end\n"

/* TOKEN_USE: a now; {0, verdict}. */
#define LUA_OP_TOKEN_USE                                                              \
    "local function op_token_use(k, a, j)\n"                                          \
    "  local r = load(k)\n"                                                           \
    "  if r == false then return {3} end\n"                                           \
    "  local v = tokdecide(r, tonumber(a[j + 1]))\n"                                  \
    "  if v == 1 then put(k, 2, r.fl, r.fe, r.lu, r.ex, int(r.ex), r.fp) end\n"       \
    "  return {0, v}\n"                                                               \
    "end\n"

/* TOKEN_RESTORE: a now. */
#define LUA_OP_TOKEN_RESTORE                                                          \
    "local function op_token_restore(k, a, j)\n"                                      \
    "  local r = load(k)\n"                                                           \
    "  if r == false then return {3} end\n"                                           \
    "  if tokdecide(r, tonumber(a[j + 1])) ~= 2 then return {1} end\n"                \
    "  put(k, 1, r.fl, r.fe, r.lu, r.ex, int(r.ex), r.fp)\n"                          \
    "  return {0}\n"                                                                  \
    "end\n"

#define LUA_ONE(fn) "return " fn "(KEYS[1], ARGV, 0)\n"

/* BATCH: every op of a batch in ONE call, in order (a script is atomic:
 * nothing else runs between its ops).  ARGV[1] is the frame: two bytes an
 * op, '0' + its script index (S_CLAIM ...) and '0' + how many arguments
 * it has.  Each op's key is KEYS[i] (one server), or on a cluster, where
 * Redis refuses declared keys of several slots (CROSSSLOT), the ARGV
 * element before its arguments (no KEYS).  The frame is checked before
 * any op runs.  Each op runs under pcall, so an op that raises (a key
 * this cluster node does not serve: "Script attempted to access a non
 * local key", before it wrote anything) gets its error as its answer and
 * the others go on; the answer is an array of each op's, read exactly as
 * the op scripts' are.  No shebang: in Redis 7's compatibility mode the
 * script may touch keys of several slots of its node (a "#!lua" script
 * would need flags=allow-cross-slot-keys, and would be refused as a
 * whole at maxmemory, deletes included, where this one's first write is
 * refused with OOM, as an op script's is). */
static const char lua_batch_loop[] =
    "local fn = {op_claim, op_complete, op_hold, op_renew, op_release, op_delete,\n"
    "  op_token_issue, op_token_use, op_token_restore}\n"
    "local h, inkeys = ARGV[1], #KEYS > 0\n"
    "local n = #h / 2\n"
    "local bad = {err = 'ERR idem batch: bad frame'}\n"
    "if n ~= math.floor(n) or (inkeys and #KEYS ~= n) then return bad end\n"
    "local need = 1\n"
    "for i = 1, n do\n"
    "  local na = string.byte(h, 2 * i) - 48\n"
    "  if not fn[string.byte(h, 2 * i - 1) - 47] or na < 0 or na > 5 then\n"
    "    return bad\n"
    "  end\n"
    "  need = need + na\n"
    "  if not inkeys then need = need + 1 end\n"
    "end\n"
    "if need ~= #ARGV then return bad end\n"
    "local out, j = {}, 1\n"
    "for i = 1, n do\n"
    "  local f, na = fn[string.byte(h, 2 * i - 1) - 47], string.byte(h, 2 * i) - 48\n"
    "  local k\n"
    "  if inkeys then k = KEYS[i] else j = j + 1; k = ARGV[j] end\n"
    "  local ok, res = pcall(f, k, ARGV, j)\n"
    "  if not ok then\n"
    "    if type(res) == 'table' and res.err then res = {err = res.err}\n"
    "    else res = {err = 'ERR ' .. tostring(res)} end\n"
    "  end\n"
    "  out[i] = res\n"
    "  j = j + na\n"
    "end\n"
    "return out\n";

/* SWEEP: KEYS the keys to visit, ARGV now; deletes those whose ex <= now
 * (what does not look like a record is left alone) and says how many.
 * Either layout: ex is bytes 20..27 of a layout 2 value, or a layout 1
 * hash's field ex. */
static const char lua_sweep[] =
    "local now, n = tonumber(ARGV[1]), 0\n"
    "for i = 1, #KEYS do\n"
    "  local k, ex = KEYS[i], nil\n"
    "  local v = redis.pcall('GET', k)\n"
    "  if type(v) == 'string' then\n"
    "    if #v >= 59 and string.byte(v, 1) == 2 then\n"
    "      ex = struct.unpack('<i8', v, 20)\n"
    "    end\n"
    "  elseif type(v) == 'table' then\n"
    "    local h = redis.pcall('HGET', k, 'ex')\n"
    "    if type(h) == 'string' then ex = tonumber(h) end\n"
    "  end\n"
    "  if ex and ex <= now then\n"
    "    redis.call('DEL', k)\n"
    "    n = n + 1\n"
    "  end\n"
    "end\n"
    "return n\n";

/* READ: KEYS[1] a record's key: the value of a layout 2 record (a string),
 * nil, or a layout 1 record's fields st fl fp fe lu ex r; a key of another
 * type, an error.  Run with EVAL by get and the listing (redis_list.c), on
 * every form, so that both layouts are read in one command. */
const char idem__redis_read_script[] =
    "local v = redis.pcall('GET', KEYS[1])\n"
    "if type(v) == 'table' and string.sub(v.err, 1, 9) == 'WRONGTYPE' then\n"
    "  return redis.pcall('HMGET', KEYS[1], 'st', 'fl', 'fp', 'fe', 'lu', 'ex', 'r')\n"
    "end\n"
    "return v\n";
const size_t idem__redis_read_script_len = sizeof idem__redis_read_script - 1;

/* Each script as its parts, joined when it is loaded (a C string literal
 * stays within the 4095 bytes ISO C promises; the batch script is longer). */
#define PARTS_MAX 12
static const char *const script_parts[NSCRIPTS][PARTS_MAX] = {
    [S_CLAIM] = {LUA_PRELUDE, LUA_OP_CLAIM, LUA_ONE("op_claim")},
    [S_COMPLETE] = {LUA_PRELUDE, LUA_OP_COMPLETE, LUA_ONE("op_complete")},
    [S_HOLD] = {LUA_PRELUDE, LUA_OP_HOLD, LUA_ONE("op_hold")},
    [S_RENEW] = {LUA_PRELUDE, LUA_OP_RENEW, LUA_ONE("op_renew")},
    [S_RELEASE] = {LUA_PRELUDE, LUA_OP_RELEASE, LUA_ONE("op_release")},
    [S_DELETE] = {LUA_OP_DELETE, LUA_ONE("op_delete")},
    [S_TOKEN_ISSUE] = {LUA_PRELUDE, LUA_OP_TOKEN_ISSUE, LUA_ONE("op_token_issue")},
    [S_TOKEN_USE] = {LUA_PRELUDE, LUA_OP_TOKEN_USE, LUA_ONE("op_token_use")},
    [S_TOKEN_RESTORE] = {LUA_PRELUDE, LUA_OP_TOKEN_RESTORE, LUA_ONE("op_token_restore")},
    [S_SWEEP] = {lua_sweep},
    [S_BATCH] = {LUA_PRELUDE, LUA_OP_CLAIM, LUA_OP_COMPLETE, LUA_OP_HOLD, LUA_OP_RENEW,
                 LUA_OP_RELEASE, LUA_OP_DELETE, LUA_OP_TOKEN_ISSUE, LUA_OP_TOKEN_USE,
                 LUA_OP_TOKEN_RESTORE, lua_batch_loop},
};


/* ---- the handle ----------------------------------------------------------- */

/* One pooled connection. */
struct conn {
    struct idem__pool_conn pc; /* first: the pool lends out a conn as this */
    idem__rconn_t *c;
    char sha[NSCRIPTS][41];    /* the scripts as this server knows them */
};

struct redis_store {
    struct idem_store base; /* first: a redis_store is an idem_store */
    struct rcfg cfg;
    idem_tls_ctx_t *tls; /* rediss: the client context every connection uses; or NULL */
    char where[HOST_MAX + MASTER_MAX + 32]; /* "host:port" or "master NAME", for messages */
    idem__pool_t pool;   /* the connections and the outage state (pool.c) */
    /* sweep position */
    pthread_mutex_t sweep_lock;
    unsigned long long sweep_cursor;
    int sweep_started;     /* a SCAN pass is under way (cursor 0 is its end) */
    redisReply *sweep_keys; /* the last SCAN's keys, visited up to sweep_next */
    size_t sweep_next;
    char match[2 * IDEM_STORE_OPT_MAX + 2]; /* SCAN pattern: the escaped prefix, '*' */
};

void idem__redis_say(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* ---- the URL ---------------------------------------------------------------- */

/* Percent-decode the URL's user or password (core/url.c) into out (cap
 * bytes with the NUL). */
static int decode_cred(const char *s, size_t len, char *out, size_t cap, const char *what,
                       char *errbuf, size_t errlen)
{
    idem__url_status_t st = idem__url_decode(s, len, out, cap, NULL);
    if (st == IDEM__URL_E_ESCAPE || st == IDEM__URL_E_NUL)
        idem__store_errbuf(errbuf, errlen, "redis store URL: the %s has a bad percent-escape%s",
                           what, st == IDEM__URL_E_NUL ? " (%00)" : "");
    else if (st != IDEM__URL_OK)
        idem__store_errbuf(errbuf, errlen, "redis store URL: the %s is longer than %zu bytes",
                           what, cap - 1);
    return st == IDEM__URL_OK ? 0 : -1;
}

/* "host[:port]" or "[v6][:port]" in s[0..len) (core/url.c reads it). */
static int parse_endpoint(const char *s, size_t len, int defport, struct endpoint *ep,
                          char *errbuf, size_t errlen)
{
    idem__url_host_t h;
    idem__url_status_t st = idem__url_host_port(s, len, &h);
    int n = (int)(len > 80 ? 80 : len), hn = (int)(h.host_len > 80 ? 80 : h.host_len);

    switch (st) {
    case IDEM__URL_OK:
        break;
    case IDEM__URL_E_BRACKET:
        idem__store_errbuf(errbuf, errlen, "redis store URL: \"%.*s\" has no closing ']'", n, s);
        return -1;
    case IDEM__URL_E_AFTER_BRACKET:
        idem__store_errbuf(errbuf, errlen, "redis store URL: expected ':' after \"%.*s\"", n, s);
        return -1;
    case IDEM__URL_E_IPV6:
        idem__store_errbuf(errbuf, errlen, "redis store URL: \"%.*s\" is not an IPv6 address",
                           hn, h.host);
        return -1;
    case IDEM__URL_E_HOST_CHAR:
        idem__store_errbuf(errbuf, errlen, "redis store URL: bad character '%c' in host \"%.*s\"",
                           h.bad, hn, h.host);
        return -1;
    case IDEM__URL_E_NO_HOST:
        idem__store_errbuf(errbuf, errlen, "redis store URL: a host is missing");
        return -1;
    case IDEM__URL_E_HOST_LONG:
        idem__store_errbuf(errbuf, errlen, "redis store URL: a host is longer than %d bytes",
                           HOST_MAX);
        return -1;
    default:
        idem__store_errbuf(errbuf, errlen,
                           "redis store URL: port \"%.*s\" of host %.*s is not a number from "
                           "1 to 65535",
                           (int)(h.port_len > 20 ? 20 : h.port_len), h.port_text, (int)h.host_len,
                           h.host);
        return -1;
    }
    memcpy(ep->host, h.host, h.host_len);
    ep->host[h.host_len] = '\0';
    ep->port = h.has_port ? h.port : defport;
    return 0;
}

static int parse_db(const char *s, size_t len, struct rcfg *cfg, char *errbuf, size_t errlen)
{
    if (len == 0)
        return 0;
    uint64_t db;
    if (!idem__url_number(s, len, 10, &db) || db > (uint64_t)DB_MAX) {
        idem__store_errbuf(errbuf, errlen,
                           "redis store URL: database \"%.*s\" is not a number from 0 to %lld",
                           (int)(len > 20 ? 20 : len), s, DB_MAX);
        return -1;
    }
    cfg->db = (long long)db;
    return 0;
}

/* A TLS parameter (ca, cert, key, sni, verify) of p into cfg.  1 when p
 * is one, 0 when it is another, -1 on an error (said). */
static int parse_tls_opt(const idem__url_param_t *p, struct rcfg *cfg, char *errbuf,
                         size_t errlen)
{
    static const char *const names[] = {"ca", "cert", "key", "sni", "verify"};
    int which = -1;
    for (int i = 0; i < 5; i++)
        if (p->name_len == strlen(names[i]) && memcmp(p->name, names[i], p->name_len) == 0)
            which = i;
    if (which < 0)
        return 0;
    const char *name = names[which];
    if (!cfg->tls) {
        idem__store_errbuf(errbuf, errlen,
                           "redis store option %s= is for TLS: the URL must be rediss:// (or "
                           "rediss+sentinel://, rediss+cluster://)",
                           name);
        return -1;
    }
    if (!p->has_value || p->value_len == 0) {
        idem__store_errbuf(errbuf, errlen, "redis store option %s= is empty", name);
        return -1;
    }
    char *out = which == 0 ? cfg->ca : which == 1 ? cfg->cert : which == 2 ? cfg->key : NULL;
    size_t cap = PATH_OPT_MAX + 1;
    char vbuf[16];
    if (which == 3) {
        out = cfg->sni;
        cap = sizeof cfg->sni;
    } else if (which == 4) {
        out = vbuf;
        cap = sizeof vbuf;
    }
    size_t n;
    idem__url_status_t st = idem__url_decode(p->value, p->value_len, out, cap, &n);
    if (st == IDEM__URL_E_ESCAPE || st == IDEM__URL_E_NUL) {
        idem__store_errbuf(errbuf, errlen, "redis store option %s=: a bad percent-escape%s",
                           name, st == IDEM__URL_E_NUL ? " (%00)" : "");
        return -1;
    }
    if (st != IDEM__URL_OK && which == 4) {
        idem__store_errbuf(errbuf, errlen,
                           "redis store option verify=%.20s: expected true or false",
                           p->value);
        return -1;
    }
    if (st != IDEM__URL_OK) {
        idem__store_errbuf(errbuf, errlen, "redis store option %s= is longer than %zu bytes",
                           name, cap - 1);
        return -1;
    }
    if (which == 3) {
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)out[i];
            if (ch <= ' ' || ch > '~' || ch == '/' || ch == '@') {
                idem__store_errbuf(errbuf, errlen,
                                   "redis store option sni=%s: not a host name or address", out);
                return -1;
            }
        }
    } else if (which == 4) {
        if (strcmp(vbuf, "true") == 0 || strcmp(vbuf, "1") == 0 || strcmp(vbuf, "yes") == 0) {
            cfg->no_verify = 0;
        } else if (strcmp(vbuf, "false") == 0 || strcmp(vbuf, "0") == 0 ||
                   strcmp(vbuf, "no") == 0) {
            cfg->no_verify = 1;
        } else {
            idem__store_errbuf(errbuf, errlen,
                               "redis store option verify=%s: expected true or false", vbuf);
            return -1;
        }
    }
    return 1;
}

/* wait=N: 0 (off, the default) to WAIT_MAX replicas. */
static int parse_wait(const char *value, struct rcfg *cfg, char *errbuf, size_t errlen)
{
    uint64_t n;
    if (!idem__url_number(value, strlen(value), 2, &n) || n > WAIT_MAX) {
        idem__store_errbuf(errbuf, errlen,
                           "redis store option wait=%s: expected a number of replicas from 0 "
                           "(off) to %d",
                           value, WAIT_MAX);
        return -1;
    }
    cfg->wait = (int)n;
    return 0;
}

static int parse_opts(const char *query, struct rcfg *cfg, char *errbuf, size_t errlen)
{
    char name[IDEM_STORE_OPT_MAX + 1], value[IDEM_STORE_OPT_MAX + 1];
    int r;

    for (;;) {
        /* The TLS parameters hold paths: longer than the others, and
         * percent-decoded. */
        const char *at = query;
        idem__url_param_t tp;
        if (query != NULL && idem__url_next_param(&query, NULL, &tp)) {
            int t = parse_tls_opt(&tp, cfg, errbuf, errlen);
            if (t < 0)
                return -1;
            if (t > 0)
                continue;
        }
        query = at;
        if ((r = idem__store_next_opt(&query, name, value, errbuf, errlen)) <= 0)
            break;
        if (strcmp(name, "prefix") == 0) {
            size_t len = strlen(value);
            for (size_t i = 0; i < len; i++) {
                if (value[i] <= ' ' || value[i] > '~') {
                    idem__store_errbuf(errbuf, errlen,
                                       "redis store option prefix=%s: only printable ASCII "
                                       "without spaces",
                                       value);
                    return -1;
                }
            }
            if (len == 0) {
                idem__store_errbuf(errbuf, errlen, "redis store option prefix= is empty");
                return -1;
            }
            memcpy(cfg->prefix, value, len + 1);
            cfg->prefix_len = len;
        } else if (strcmp(name, "pool") == 0) {
            uint64_t n;
            if (!idem__url_number(value, strlen(value), 3, &n) || n < 1 || n > POOL_MAX) {
                idem__store_errbuf(errbuf, errlen,
                                   "redis store option pool=%s: expected a number of "
                                   "connections from 1 to %d",
                                   value, POOL_MAX);
                return -1;
            }
            cfg->pool = (int)n;
        } else if (strcmp(name, "timeout") == 0) {
            int64_t ms;
            if (idem_parse_duration(value, &ms) != IDEM_OK || ms < 1 || ms > TIMEOUT_MAX_MS) {
                idem__store_errbuf(errbuf, errlen,
                                   "redis store option timeout=%s: expected a duration from "
                                   "1ms to 60s, e.g. 2s or 500ms",
                                   value);
                return -1;
            }
            cfg->timeout_ms = (int)ms;
        } else if (strcmp(name, "wait") == 0) {
            if (parse_wait(value, cfg, errbuf, errlen) != 0)
                return -1;
        } else {
            idem__store_errbuf(errbuf, errlen,
                               "unknown option \"%s\" for store redis (known: prefix, pool, "
                               "timeout, wait%s)",
                               name, cfg->tls ? ", ca, cert, key, sni, verify" : "");
            return -1;
        }
    }
    if (r < 0)
        return -1;
    if (!cfg->cert[0] != !cfg->key[0]) {
        idem__store_errbuf(errbuf, errlen,
                           "redis store option %s= needs %s= too (a client certificate and its "
                           "key go together)",
                           cfg->cert[0] ? "cert" : "key", cfg->cert[0] ? "key" : "cert");
        return -1;
    }
    return 0;
}

/* rest: what follows "redis:", "redis+sentinel:", "rediss:" or
 * "rediss+sentinel:". */
int idem__redis_parse_url(const char *rest, int form, int tls, struct rcfg *cfg, char *errbuf,
                          size_t errlen)
{
    int sentinel = form == IDEM__REDIS_SENTINEL, cluster = form == IDEM__REDIS_CLUSTER;
    const char *scheme = tls ? (sentinel ? "rediss+sentinel" : cluster ? "rediss+cluster" : "rediss")
                             : (sentinel ? "redis+sentinel" : cluster ? "redis+cluster" : "redis");
    idem__url_t u;

    memset(cfg, 0, sizeof *cfg);
    cfg->sentinel = sentinel;
    cfg->cluster = cluster;
    cfg->tls = tls;
    memcpy(cfg->prefix, DEFAULT_PREFIX, sizeof DEFAULT_PREFIX);
    cfg->prefix_len = sizeof DEFAULT_PREFIX - 1;
    cfg->pool = DEFAULT_POOL;
    cfg->timeout_ms = DEFAULT_TIMEOUT_MS;

    /* The parts (core/url.c); rest has no scheme of its own. */
    if (idem__url_parse(rest, strlen(rest), &u) != IDEM__URL_OK || u.scheme_len != 0) {
        idem__store_errbuf(errbuf, errlen,
                           sentinel  ? "store URL %s: must be %s://host:port[,host:port...]"
                                       "/master-name[/db]"
                           : cluster ? "store URL %s: must be %s://[user:password@]host:port"
                                       "[,host:port...]"
                                     : "store URL %s: must be %s://[user:password@]host:port[/db]",
                           scheme, scheme);
        return -1;
    }
    const char *path = u.path; /* "" or "/..." */
    size_t pathlen = u.path_len;

    /* user:password@ */
    if (u.has_userinfo) {
        if (!u.has_password) {
            idem__store_errbuf(errbuf, errlen,
                               "store URL %s: credentials must be user:password@ or :password@",
                               scheme);
            return -1;
        }
        if (decode_cred(u.user, u.user_len, cfg->user, sizeof cfg->user, "user", errbuf,
                        errlen) != 0 ||
            decode_cred(u.password, u.password_len, cfg->pass, sizeof cfg->pass, "password",
                        errbuf, errlen) != 0)
            return -1;
        cfg->has_pass = 1;
    }
    const char *hosts = u.hosts;
    size_t hlen = u.hosts_len;

    /* host:port[,host:port...] */
    if (hlen == 0) {
        idem__store_errbuf(errbuf, errlen, "store URL %s: no host", scheme);
        return -1;
    }
    const char *h = hosts, *end = hosts + hlen;
    while (h <= end) {
        const char *comma = memchr(h, ',', (size_t)(end - h));
        const char *stop = comma ? comma : end;
        if (cfg->nep == (sentinel || cluster ? SENTINELS_MAX : 1)) {
            if (sentinel || cluster)
                idem__store_errbuf(errbuf, errlen, "store URL %s: more than %d %s", scheme,
                                   SENTINELS_MAX, sentinel ? "sentinels" : "seed nodes");
            else
                idem__store_errbuf(errbuf, errlen,
                                   "store URL %s: one host only; use %s+sentinel:// for several",
                                   scheme, scheme);
            return -1;
        }
        if (parse_endpoint(h, (size_t)(stop - h), sentinel ? DEFAULT_SENTINEL_PORT : DEFAULT_PORT,
                           &cfg->ep[cfg->nep], errbuf, errlen) != 0)
            return -1;
        cfg->nep++;
        if (comma == NULL)
            break;
        h = comma + 1;
    }

    /* /db or /master-name[/db] */
    if (pathlen > 0) {
        path++;
        pathlen--;
    }
    if (sentinel) {
        const char *s2 = memchr(path, '/', pathlen);
        size_t ml = s2 ? (size_t)(s2 - path) : pathlen;
        if (ml == 0) {
            idem__store_errbuf(errbuf, errlen,
                               "store URL %s: the master's name is missing "
                               "(%s://host:port/master-name)",
                               scheme, scheme);
            return -1;
        }
        if (ml > MASTER_MAX) {
            idem__store_errbuf(errbuf, errlen,
                               "store URL %s: the master's name is longer than %d bytes", scheme,
                               MASTER_MAX);
            return -1;
        }
        for (size_t i = 0; i < ml; i++) {
            char c = path[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '-' || c == '_')) {
                idem__store_errbuf(errbuf, errlen,
                                   "store URL %s: bad character '%c' in the master's name",
                                   scheme, c);
                return -1;
            }
        }
        memcpy(cfg->master, path, ml);
        cfg->master[ml] = '\0';
        if (s2 != NULL) {
            path = s2 + 1;
            pathlen -= ml + 1;
        } else {
            pathlen = 0;
        }
    }
    if (cluster && pathlen > 0) {
        idem__store_errbuf(errbuf, errlen,
                           "store URL %s: a cluster has no databases; nothing may follow the "
                           "hosts but ?options",
                           scheme);
        return -1;
    }
    if (parse_db(path, pathlen, cfg, errbuf, errlen) != 0)
        return -1;
    if (parse_opts(u.query, cfg, errbuf, errlen) != 0)
        return -1;
    if (cluster && strpbrk(cfg->prefix, "{}") != NULL) {
        /* A brace in the prefix would make it every key's hash tag: one slot. */
        idem__store_errbuf(errbuf, errlen,
                           "redis store option prefix=%s: no '{' or '}' on a cluster (the "
                           "prefix would be every key's hash tag)",
                           cfg->prefix);
        return -1;
    }
    return 0;
}

/* ---- connections ------------------------------------------------------------ */

void idem__redis_errtext_io(char *err, size_t errlen, const char *who, const idem__rconn_t *c,
                       int timeout_ms)
{
    const char *why = idem__rconn_errstr(c);
    if (idem__rconn_err(c) == IDEM__RCONN_E_TIMEOUT)
        idem__redis_say(err, errlen, "%s: no answer within %d ms", who, timeout_ms);
    else
        idem__redis_say(err, errlen, "%s: %s", who, why[0] ? why : "connection lost");
}

idem_err_t idem__redis_get_answer(idem_store_t *base, const char *where, const redisReply *r,
                                  int64_t now_ms, idem_record_t *rec, int *broken)
{
    idem_err_t err;

    if (r->type == REDIS_REPLY_ERROR) {
        idem__store_seterr(base, "redis %s: %.150s", where, r->str);
        return strncmp(r->str, "WRONGTYPE", 9) == 0 ? IDEM_E_CORRUPT
                                                   : idem__redis_map_error(r->str, broken);
    }
    if (r->type == REDIS_REPLY_NIL)
        return IDEM_E_NOTFOUND;
    if (r->type == REDIS_REPLY_STRING) {
        err = idem__redis_rec_from_value(r->str, r->len, rec);
        if (err == IDEM_E_CORRUPT)
            idem__store_seterr(base, "redis %s: a value that is no idem record (layout %u, "
                               "%zu bytes; this idemd reads layout %d and the hashes "
                               "before it)", where, r->len > 0 ? (unsigned char)r->str[0] : 0u,
                               r->len, V2_VERSION);
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 7) {
        int present = 0;
        for (size_t i = 0; i < 7; i++)
            present |= r->element[i]->type != REDIS_REPLY_NIL;
        if (!present)
            return IDEM_E_NOTFOUND;
        err = idem__redis_rec_from_fields(r->element, rec);
    } else {
        idem__store_seterr(base, "redis %s: unexpected answer to the read script", where);
        *broken = 1;
        return IDEM_E_STORE_DOWN;
    }
    if (err == IDEM_OK && rec->expires_at_ms <= now_ms) {
        idem_record_cleanup(rec);
        err = IDEM_E_NOTFOUND;
    }
    return err;
}

idem__rconn_t *idem__redis_connect(const struct rcfg *cfg, idem_tls_ctx_t *tls,
                                   const struct endpoint *ep, char *err, size_t errlen)
{
    char who[HOST_MAX + 16];
    idem__redis_say(who, sizeof who, "%s:%d", ep->host, ep->port);
    idem__rconn_cfg_t rc = {
        .host = ep->host,
        .port = ep->port,
        .timeout_ms = cfg->timeout_ms,
        .tls = tls,
        .server_name = cfg->sni,
    };
    idem__rconn_t *c = idem__rconn_connect(&rc);
    if (c == NULL) {
        idem__redis_say(err, errlen, "%s: out of memory", who);
        return NULL;
    }
    if (idem__rconn_err(c)) {
        idem__redis_errtext_io(err, errlen, who, c, cfg->timeout_ms);
        idem__rconn_free(c);
        return NULL;
    }
    return c;
}

/* Connect to ep (plain, or TLS under s's context): the connection, or NULL
 * with err set to one line that names ep. */
static idem__rconn_t *connect_to(const struct redis_store *s, const struct endpoint *ep,
                                 char *err, size_t errlen)
{
    return idem__redis_connect(&s->cfg, s->tls, ep, err, errlen);
}

/* The next reply (redis_conn.c counts it as a store I/O for fault
 * injection).  0, or -1 with the connection failed. */
static int get_reply(idem__rconn_t *c, redisReply **out)
{
    return idem__rconn_get_reply(c, out);
}

/* One command, its reply; NULL on a connection error (idem__rconn_errstr
 * says why). */
static redisReply *command(idem__rconn_t *c, int argc, const char **argv, const size_t *len)
{
    redisReply *r = NULL;
    if (idem__rconn_append(c, argc, argv, len) != 0 || get_reply(c, &r) != 0)
        return NULL;
    return r;
}

static int reply_is(const redisReply *r, int type)
{
    return r != NULL && r->type == type;
}

/* Ask the sentinels for the master's address (redis_impl.h). */
int idem__redis_discover(const struct rcfg *cfg, idem_tls_ctx_t *tls, struct endpoint *master,
                         char *err, size_t errlen)
{
    char last[200] = "no sentinel answered";

    for (int i = 0; i < cfg->nep; i++) {
        idem__rconn_t *c = idem__redis_connect(cfg, tls, &cfg->ep[i], last, sizeof last);
        if (c == NULL)
            continue;
        const char *argv[] = {"SENTINEL", "get-master-addr-by-name", cfg->master};
        size_t len[] = {8, 23, strlen(cfg->master)};
        redisReply *r = command(c, 3, argv, len);
        if (r == NULL) {
            char who[HOST_MAX + 24];
            idem__redis_say(who, sizeof who, "sentinel %s:%d", cfg->ep[i].host, cfg->ep[i].port);
            idem__redis_errtext_io(last, sizeof last, who, c, cfg->timeout_ms);
        } else if (reply_is(r, REDIS_REPLY_ARRAY) && r->elements == 2 &&
                   reply_is(r->element[0], REDIS_REPLY_STRING) &&
                   reply_is(r->element[1], REDIS_REPLY_STRING) &&
                   r->element[0]->len > 0 && r->element[0]->len <= HOST_MAX) {
            int port;
            if (idem__url_port(r->element[1]->str, r->element[1]->len, &port)) {
                memcpy(master->host, r->element[0]->str, r->element[0]->len);
                master->host[r->element[0]->len] = '\0';
                master->port = port;
                freeReplyObject(r);
                idem__rconn_free(c);
                return 0;
            }
            idem__redis_say(last, sizeof last, "sentinel %s:%d gave a bad port", cfg->ep[i].host,
                     cfg->ep[i].port);
        } else if (reply_is(r, REDIS_REPLY_NIL)) {
            idem__redis_say(last, sizeof last, "sentinel %s:%d does not know master %s",
                     cfg->ep[i].host, cfg->ep[i].port, cfg->master);
        } else if (reply_is(r, REDIS_REPLY_ERROR)) {
            idem__redis_say(last, sizeof last, "sentinel %s:%d: %.120s", cfg->ep[i].host,
                     cfg->ep[i].port, r->str);
        } else {
            idem__redis_say(last, sizeof last, "sentinel %s:%d gave an unexpected answer",
                     cfg->ep[i].host, cfg->ep[i].port);
        }
        freeReplyObject(r);
        idem__rconn_free(c);
    }
    idem__redis_say(err, errlen, "no sentinel gave the address of master %s (%s)", cfg->master, last);
    return -1;
}

/* Load every script on c, pipelined; the SHAs go to k. */
int idem__redis_load_scripts(idem__rconn_t *c, idem__redis_shas_t sha, char *err, size_t errlen,
                             int timeout_ms)
{
    for (int i = 0; i < NSCRIPTS; i++) {
        size_t total = 0;
        for (int p = 0; p < PARTS_MAX && script_parts[i][p] != NULL; p++)
            total += strlen(script_parts[i][p]);
        char *text = idem_malloc(total);
        if (text == NULL) {
            /* The loads already appended go with the connection. */
            idem__redis_say(err, errlen, "SCRIPT LOAD: out of memory");
            return -1;
        }
        size_t at = 0;
        for (int p = 0; p < PARTS_MAX && script_parts[i][p] != NULL; p++) {
            size_t l = strlen(script_parts[i][p]);
            memcpy(text + at, script_parts[i][p], l);
            at += l;
        }
        const char *argv[] = {"SCRIPT", "LOAD", text};
        size_t len[] = {6, 4, total};
        int rc = idem__rconn_append(c, 3, argv, len);
        idem_free(text);
        if (rc != 0) {
            idem__redis_say(err, errlen, "SCRIPT LOAD: out of memory");
            return -1;
        }
    }
    int failed = 0;
    for (int i = 0; i < NSCRIPTS; i++) {
        redisReply *r = NULL;
        if (get_reply(c, &r) != 0) {
            idem__redis_errtext_io(err, errlen, "SCRIPT LOAD", c, timeout_ms);
            return -1;
        }
        if (reply_is(r, REDIS_REPLY_STRING) && r->len == 40) {
            memcpy(sha[i], r->str, 41);
        } else if (!failed) {
            failed = 1;
            idem__redis_say(err, errlen, "SCRIPT LOAD: %.150s",
                     reply_is(r, REDIS_REPLY_ERROR) ? r->str : "unexpected answer");
        }
        freeReplyObject(r);
    }
    return failed ? -1 : 0;
}

/* Open one connection: discover (sentinel), connect, AUTH, SELECT, ROLE
 * (sentinel), load the scripts; all commands after the connect in one
 * round trip. */
static idem_err_t conn_open(struct redis_store *s, struct conn **out, char *err, size_t errlen)
{
    const struct rcfg *cfg = &s->cfg;
    struct endpoint master;
    const struct endpoint *ep = &cfg->ep[0];
    char who[HOST_MAX + 16];

    *out = NULL;
    if (cfg->sentinel) {
        if (idem__redis_discover(cfg, s->tls, &master, err, errlen) != 0)
            return IDEM_E_STORE_DOWN;
        ep = &master;
    }
    struct conn *k = idem_calloc(1, sizeof *k);
    if (k == NULL) {
        idem__redis_say(err, errlen, "out of memory");
        return IDEM_E_NOMEM;
    }
    k->c = connect_to(s, ep, err, errlen);
    if (k->c == NULL) {
        idem_free(k);
        return IDEM_E_STORE_DOWN;
    }
    idem__redis_say(who, sizeof who, "%s:%d", ep->host, ep->port);

    /* The setup commands; their replies are read in this order. */
    enum { C_AUTH, C_SELECT, C_ROLE };
    int sent[3], nsent = 0;
    if (cfg->has_pass) {
        const char *argv[] = {"AUTH", cfg->user, cfg->pass};
        size_t len[] = {4, strlen(cfg->user), strlen(cfg->pass)};
        if (cfg->user[0] == '\0')
            idem__rconn_append(k->c, 2, (const char *[]){"AUTH", cfg->pass},
                                   (const size_t[]){4, len[2]});
        else
            idem__rconn_append(k->c, 3, argv, len);
        sent[nsent++] = C_AUTH;
    }
    if (cfg->db != 0) {
        char db[24];
        int dl = snprintf(db, sizeof db, "%lld", cfg->db);
        idem__rconn_append(k->c, 2, (const char *[]){"SELECT", db},
                               (const size_t[]){6, (size_t)dl});
        sent[nsent++] = C_SELECT;
    }
    if (cfg->sentinel) {
        idem__rconn_append(k->c, 1, (const char *[]){"ROLE"}, (const size_t[]){4});
        sent[nsent++] = C_ROLE;
    }
    int bad = 0;
    for (int i = 0; i < nsent; i++) {
        redisReply *r = NULL;
        if (get_reply(k->c, &r) != 0) {
            idem__redis_errtext_io(err, errlen, who, k->c, cfg->timeout_ms);
            bad = 2;
            break;
        }
        if (!bad && reply_is(r, REDIS_REPLY_ERROR)) {
            idem__redis_say(err, errlen, "%s: %s failed: %.150s", who,
                     sent[i] == C_AUTH ? "AUTH" : sent[i] == C_SELECT ? "SELECT" : "ROLE", r->str);
            bad = 1;
        } else if (!bad && sent[i] == C_ROLE &&
                   !(reply_is(r, REDIS_REPLY_ARRAY) && r->elements > 0 &&
                     reply_is(r->element[0], REDIS_REPLY_STRING) &&
                     strcmp(r->element[0]->str, "master") == 0)) {
            idem__redis_say(err, errlen, "%s (master %s by the sentinels) is not a master", who,
                     cfg->master);
            bad = 1;
        }
        freeReplyObject(r);
    }
    if (!bad && idem__redis_load_scripts(k->c, k->sha, err, errlen, cfg->timeout_ms) != 0) {
        /* Prefix the server so the message says where. */
        char tmp[256];
        idem__redis_say(tmp, sizeof tmp, "%s: %s", who, err);
        idem__redis_say(err, errlen, "%s", tmp);
        bad = 1;
    }
    if (bad) {
        idem__rconn_free(k->c);
        idem_free(k);
        return IDEM_E_STORE_DOWN;
    }
    *out = k;
    return IDEM_OK;
}

static void conn_free(struct conn *k)
{
    if (k != NULL) {
        idem__rconn_free(k->c);
        idem_free(k);
    }
}

/* Whether an idle connection is unusable: the server closed it, or sent
 * something nobody asked for. */
static int conn_dead(const struct conn *k)
{
    return !idem__rconn_idle_ok(k->c);
}

/* The pool's callbacks (pool.h). */
static idem_err_t pool_connect(void *ctx, struct idem__pool_conn **out, char *why, size_t whylen)
{
    struct conn *k;
    idem_err_t err = conn_open(ctx, &k, why, whylen);
    *out = err == IDEM_OK ? &k->pc : NULL;
    return err;
}

static void pool_close(void *ctx, struct idem__pool_conn *c)
{
    (void)ctx;
    conn_free((struct conn *)c);
}

static bool pool_healthy(void *ctx, struct idem__pool_conn *c)
{
    (void)ctx;
    return !conn_dead((struct conn *)c);
}

static const struct idem__pool_ops pool_ops = {
    .connect = pool_connect,
    .close = pool_close,
    .healthy = pool_healthy,
};

/* Take a connection from the pool, or open one (see the opening comment
 * for the backoff).  On failure the detail is set for idem_store_errstr,
 * and *fail (may be NULL) says why. */
static idem_err_t acquire(struct redis_store *s, struct conn **out, idem__pool_fail_t *fail)
{
    struct idem__pool_conn *c;
    idem__pool_fail_t f;
    idem_err_t err = idem__pool_borrow(&s->pool, &c, NULL, &f);

    *out = (struct conn *)c;
    if (fail != NULL)
        *fail = f;
    if (err == IDEM_OK)
        return IDEM_OK;
    switch (f.kind) {
    case IDEM__POOL_DOWN:
        idem__store_seterr(&s->base, "redis %s is unreachable (%s); next attempt in %lld ms",
                           s->where, f.why, (long long)f.retry_in_ms);
        break;
    case IDEM__POOL_CONNECT:
        idem__store_seterr(&s->base, "redis %s: %s", s->where, f.why);
        break;
    case IDEM__POOL_BUSY:
        idem__store_seterr(&s->base, "redis %s: all %d connections busy for %d ms", s->where,
                           s->cfg.pool, s->cfg.timeout_ms);
        break;
    }
    return err;
}

/* Give a connection back.  broken: drop it and every idle one older than
 * now (the server probably restarted or failed over). */
static void release(struct redis_store *s, struct conn *k, int broken)
{
    idem__pool_give_back(&s->pool, &k->pc, broken != 0);
}

/* ---- exec ------------------------------------------------------------------- */

int idem__redis_in_range(int64_t v)
{
    return v > -EXACT_MAX && v < EXACT_MAX;
}

/* Whether the numbers an op sends are exact as Lua doubles. */
int idem__redis_op_in_range(const idem_op_t *op)
{
    switch (op->kind) {
    case IDEM_OP_CLAIM:
        return idem__redis_in_range(op->now_ms) && idem__redis_in_range(op->lease_until_ms) &&
               idem__redis_in_range(op->expires_at_ms);
    case IDEM_OP_COMPLETE:
        return op->fence < (uint64_t)EXACT_MAX && idem__redis_in_range(op->expires_at_ms);
    case IDEM_OP_HOLD:
        return op->fence < (uint64_t)EXACT_MAX && idem__redis_in_range(op->lease_until_ms) &&
               idem__redis_in_range(op->expires_at_ms);
    case IDEM_OP_RENEW:
        return op->fence < (uint64_t)EXACT_MAX && idem__redis_in_range(op->lease_until_ms);
    case IDEM_OP_RELEASE:
        return op->fence < (uint64_t)EXACT_MAX;
    case IDEM_OP_DELETE:
        return 1;
    case IDEM_OP_TOKEN_ISSUE:
        return idem__redis_in_range(op->now_ms) && idem__redis_in_range(op->expires_at_ms);
    case IDEM_OP_TOKEN_USE:
    case IDEM_OP_TOKEN_RESTORE:
        return idem__redis_in_range(op->now_ms);
    }
    return 0;
}

/* The Redis key of an identity: prefix scope ':' key. */
size_t idem__redis_make_key(const struct rcfg *cfg, const idem_key_id_t *id, char *buf)
{
    size_t sl = strlen(id->scope), kl = strlen(id->key), n = cfg->prefix_len;
    memcpy(buf, cfg->prefix, n);
    memcpy(buf + n, id->scope, sl);
    buf[n + sl] = ':';
    memcpy(buf + n + sl + 1, id->key, kl);
    return n + sl + 1 + kl;
}

/* The script of each op kind. */
static const enum script kind_script[] = {
    [IDEM_OP_CLAIM] = S_CLAIM,
    [IDEM_OP_COMPLETE] = S_COMPLETE,
    [IDEM_OP_HOLD] = S_HOLD,
    [IDEM_OP_RENEW] = S_RENEW,
    [IDEM_OP_RELEASE] = S_RELEASE,
    [IDEM_OP_DELETE] = S_DELETE,
    [IDEM_OP_TOKEN_ISSUE] = S_TOKEN_ISSUE,
    [IDEM_OP_TOKEN_USE] = S_TOKEN_USE,
    [IDEM_OP_TOKEN_RESTORE] = S_TOKEN_RESTORE,
};

#define OP_ARGS_MAX 5 /* arguments an op's function reads after its key */
#define NUM_LEN 24    /* one decimal number */
#define FP_AT 9       /* an encoded record's fingerprint starts here */

/* An op's arguments (what its Lua function reads as a[j + 1] ...) into
 * argv/len, its numbers written into num; a completion's encoded record is
 * allocated into *rec (the caller frees it once the command is appended).
 * The count, or -1 with *err set. */
static int op_args(const idem_op_t *op, const char **argv, size_t *len,
                   char (*num)[NUM_LEN], uint8_t **rec, idem_err_t *err)
{
    int argc = 0;

    *rec = NULL;
#define ARG_NUM(i, fmt, v)                                                    \
    do {                                                                      \
        len[argc] = (size_t)snprintf(num[i], NUM_LEN, fmt, v);                \
        argv[argc] = num[i];                                                  \
        argc++;                                                               \
    } while (0)

    switch (op->kind) {
    case IDEM_OP_CLAIM:
        ARG_NUM(0, "%lld", (long long)op->now_ms);
        argv[argc] = (const char *)op->fp;
        len[argc++] = IDEM_FP_LEN;
        ARG_NUM(1, "%lld", (long long)op->lease_until_ms);
        ARG_NUM(2, "%lld", (long long)op->expires_at_ms);
        break;
    case IDEM_OP_COMPLETE: {
        idem_record_t next = {
            .state = IDEM_STATE_COMPLETED,
            .flags = op->flags,
            .fence = op->fence,
            .expires_at_ms = op->expires_at_ms,
            .response = *op->response,
        };
        size_t size = idem_record_encoded_size(&next);
        if (size == 0) {
            *err = IDEM_E_TOOBIG; /* store.c checked completions; cannot happen */
            return -1;
        }
        *rec = idem_malloc(size);
        if (*rec == NULL) {
            *err = IDEM_E_NOMEM;
            return -1;
        }
        idem_record_encode_into(&next, *rec);
        ARG_NUM(0, "%llu", (unsigned long long)op->fence);
        ARG_NUM(1, "%u", (unsigned)op->flags);
        ARG_NUM(2, "%lld", (long long)op->expires_at_ms);
        /* Around the fingerprint (bytes 9..40 from 0), which the script
         * puts in: the record's fixed layout, record.h. */
        argv[argc] = (const char *)*rec;
        len[argc++] = FP_AT;
        argv[argc] = (const char *)*rec + FP_AT + IDEM_FP_LEN;
        len[argc++] = size - FP_AT - IDEM_FP_LEN;
        break;
    }
    case IDEM_OP_HOLD:
        ARG_NUM(0, "%llu", (unsigned long long)op->fence);
        ARG_NUM(1, "%lld", (long long)op->lease_until_ms);
        ARG_NUM(2, "%lld", (long long)op->expires_at_ms);
        break;
    case IDEM_OP_RENEW:
        ARG_NUM(0, "%llu", (unsigned long long)op->fence);
        ARG_NUM(1, "%lld", (long long)op->lease_until_ms);
        break;
    case IDEM_OP_RELEASE:
        ARG_NUM(0, "%llu", (unsigned long long)op->fence);
        break;
    case IDEM_OP_DELETE:
        break;
    case IDEM_OP_TOKEN_ISSUE:
        ARG_NUM(0, "%lld", (long long)op->now_ms);
        ARG_NUM(1, "%lld", (long long)op->expires_at_ms);
        break;
    case IDEM_OP_TOKEN_USE:
    case IDEM_OP_TOKEN_RESTORE:
        ARG_NUM(0, "%lld", (long long)op->now_ms);
        break;
    }
#undef ARG_NUM
    return argc;
}

/* Append one op's EVALSHA of its op script to c's output buffer. */
idem_err_t idem__redis_append_op(const struct rcfg *cfg, idem__rconn_t *c,
                                 idem__redis_shas_t sha, const idem_op_t *op)
{
    const char *argv[4 + OP_ARGS_MAX];
    size_t len[4 + OP_ARGS_MAX];
    char key[KEYBUF], num[3][NUM_LEN];
    uint8_t *rec;
    idem_err_t err = IDEM_OK;

    argv[0] = "EVALSHA";
    len[0] = 7;
    argv[1] = sha[kind_script[op->kind]];
    len[1] = 40;
    argv[2] = "1";
    len[2] = 1;
    argv[3] = key;
    len[3] = idem__redis_make_key(cfg, &op->id, key);
    int argc = op_args(op, argv + 4, len + 4, num, &rec, &err);
    if (argc < 0)
        return err;
    int rc = idem__rconn_append(c, 4 + argc, argv, len);
    idem_free(rec);
    return rc == 0 ? IDEM_OK : IDEM_E_NOMEM;
}

idem_err_t idem__redis_append_batch(const struct rcfg *cfg, idem__rconn_t *c,
                                    idem__redis_shas_t sha, const idem_op_t *ops, size_t n,
                                    const uint8_t *pick, int keys_in_argv, size_t *sent)
{
    size_t m = 0, keybytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (pick[i / 8] & (1u << (i % 8))) {
            m++;
            keybytes += cfg->prefix_len + strlen(ops[i].id.scope) + 1 + strlen(ops[i].id.key);
        }
    }
    *sent = 0;
    if (m == 0)
        return IDEM_OK;
    /* EVALSHA sha numkeys [keys] frame, then each op's [key] and arguments. */
    size_t cap = 4 + m * (2 + OP_ARGS_MAX);
    const char **argv = idem_malloc(cap * sizeof *argv);
    size_t *len = idem_malloc(cap * sizeof *len);
    char *keys = idem_malloc(keybytes);
    char (*num)[NUM_LEN] = idem_malloc(m * 3 * NUM_LEN);
    char *frame = idem_malloc(2 * m);
    uint8_t **recs = idem_calloc(m, sizeof *recs);
    idem_err_t err = IDEM_OK;
    if (argv == NULL || len == NULL || keys == NULL || num == NULL || frame == NULL ||
        recs == NULL) {
        err = IDEM_E_NOMEM;
        goto out;
    }
    char numkeys[24];
    argv[0] = "EVALSHA";
    len[0] = 7;
    argv[1] = sha[S_BATCH];
    len[1] = 40;
    argv[2] = numkeys;
    len[2] = (size_t)snprintf(numkeys, sizeof numkeys, "%zu", keys_in_argv ? (size_t)0 : m);
    size_t argc = 3, key_at = 3, j = 0;
    if (!keys_in_argv)
        argc += m; /* KEYS, filled below */
    argv[argc] = frame;
    len[argc++] = 2 * m;
    char *kp = keys;
    for (size_t i = 0; i < n; i++) {
        if (!(pick[i / 8] & (1u << (i % 8))))
            continue;
        size_t kl = idem__redis_make_key(cfg, &ops[i].id, kp); /* keybytes counted it */
        if (keys_in_argv) {
            argv[argc] = kp;
            len[argc++] = kl;
        } else {
            argv[key_at] = kp;
            len[key_at++] = kl;
        }
        kp += kl;
        int na = op_args(&ops[i], argv + argc, len + argc, num + 3 * j, &recs[j], &err);
        if (na < 0)
            goto out;
        argc += (size_t)na;
        frame[2 * j] = (char)('0' + kind_script[ops[i].kind]);
        frame[2 * j + 1] = (char)('0' + na);
        j++;
    }
    if (argc > INT_MAX || idem__rconn_append(c, (int)argc, argv, len) != 0)
        err = IDEM_E_NOMEM;
    else
        *sent = m;
out:
    if (recs != NULL)
        for (size_t i = 0; i < m; i++)
            idem_free(recs[i]);
    idem_free(recs);
    idem_free(frame);
    idem_free(num);
    idem_free(keys);
    idem_free(len);
    idem_free(argv);
    return err;
}

/* A decimal integer reply element (bulk string), strictly. */
static int num_field(const redisReply *r, int64_t *out)
{
    if (!reply_is(r, REDIS_REPLY_STRING) || r->len == 0 || r->len > 20)
        return 0;
    char buf[24], *end;
    memcpy(buf, r->str, r->len);
    buf[r->len] = '\0';
    if (buf[0] != '-' && (buf[0] < '0' || buf[0] > '9'))
        return 0;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno != 0 || *end != '\0')
        return 0;
    *out = v;
    return 1;
}

/* Build a record from its decision fields and, for a completed record
 * with a response, r (the encoded record, its fingerprint spliced in: its
 * checksum was computed with a zero one, and the fingerprint is compared
 * with fp here).  r NULL: no response; C rebuilds the record from the
 * fields. */
static idem_err_t rec_build(int64_t st, int64_t fl, const uint8_t *fp, int64_t fe, int64_t lu,
                            int64_t ex, const uint8_t *r, size_t rlen, idem_record_t *rec)
{
    const uint32_t known = IDEM_REC_HELD | IDEM_REC_NOT_RETAINED | IDEM_REC_TOKEN;

    memset(rec, 0, sizeof *rec);
    if ((st != IDEM_STATE_IN_PROGRESS && st != IDEM_STATE_COMPLETED) || fl < 0 ||
        ((uint64_t)fl & ~(uint64_t)known) != 0 || fe < 0)
        return IDEM_E_CORRUPT;
    if (r != NULL) {
        idem_err_t err = idem__record_decode_spliced(r, rlen, rec);
        if (err != IDEM_OK)
            return err;
        if ((int64_t)rec->state != st || (int64_t)rec->flags != fl || rec->fence != (uint64_t)fe ||
            rec->lease_until_ms != lu || rec->expires_at_ms != ex ||
            memcmp(rec->fingerprint, fp, IDEM_FP_LEN) != 0) {
            idem_record_cleanup(rec);
            return IDEM_E_CORRUPT;
        }
        return IDEM_OK;
    }
    rec->state = (idem_state_t)st;
    rec->flags = (uint32_t)fl;
    memcpy(rec->fingerprint, fp, IDEM_FP_LEN);
    rec->fence = (uint64_t)fe;
    rec->lease_until_ms = lu;
    rec->expires_at_ms = ex;
    return IDEM_OK;
}

/* Build a record from its fields st fl fp fe lu ex r (f[0..6]): layout 1. */
idem_err_t idem__redis_rec_from_fields(redisReply *const *f, idem_record_t *rec)
{
    int64_t st, fl, fe, lu, ex;

    memset(rec, 0, sizeof *rec);
    if (!num_field(f[0], &st) || !num_field(f[1], &fl) || !reply_is(f[2], REDIS_REPLY_STRING) ||
        f[2]->len != IDEM_FP_LEN || !num_field(f[3], &fe) || !num_field(f[4], &lu) ||
        !num_field(f[5], &ex))
        return IDEM_E_CORRUPT;
    if (reply_is(f[6], REDIS_REPLY_STRING))
        return rec_build(st, fl, (const uint8_t *)f[2]->str, fe, lu, ex,
                         (const uint8_t *)f[6]->str, f[6]->len, rec);
    if (!reply_is(f[6], REDIS_REPLY_NIL))
        return IDEM_E_CORRUPT;
    return rec_build(st, fl, (const uint8_t *)f[2]->str, fe, lu, ex, NULL, 0, rec);
}

/* A little-endian signed 64-bit number (Lua's struct '<i8'). */
static int64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return (int64_t)v;
}

idem_err_t idem__redis_rec_from_value(const char *v, size_t len, idem_record_t *rec)
{
    const uint8_t *p = (const uint8_t *)v;

    memset(rec, 0, sizeof *rec);
    if (len < V2_MIN || p[0] != V2_VERSION)
        return IDEM_E_CORRUPT;
    return rec_build(p[1], p[2], p + V2_HDR, le64(p + 3), le64(p + 11), le64(p + 19),
                     len > V2_MIN ? p + V2_MIN : NULL, len - V2_MIN, rec);
}

/* Set an op's outputs from its script's reply. */
void idem__redis_take_result(idem_store_t *store, idem_op_t *op, const redisReply *r)
{
    if (!reply_is(r, REDIS_REPLY_ARRAY) || r->elements < 1 ||
        !reply_is(r->element[0], REDIS_REPLY_INTEGER)) {
        idem__store_seterr(store, "redis: unexpected answer from a script");
        op->err = IDEM_E_IO;
        return;
    }
    switch (r->element[0]->integer) {
    case ST_OK:
        break;
    case ST_FENCE:
        op->err = IDEM_E_FENCE;
        return;
    case ST_EXISTS:
        op->err = IDEM_E_EXISTS;
        return;
    case ST_CORRUPT:
        idem__store_seterr(store, "redis: the value of key \"%.64s\" of scope %.16s... is "
                           "not an idem record", op->id.key, op->id.scope);
        op->err = IDEM_E_CORRUPT;
        return;
    case ST_NOTFOUND:
        op->err = IDEM_E_NOTFOUND;
        return;
    default:
        op->err = IDEM_E_IO;
        return;
    }
    if (op->kind == IDEM_OP_TOKEN_USE) {
        if (r->elements >= 2 && reply_is(r->element[1], REDIS_REPLY_INTEGER) &&
            r->element[1]->integer >= IDEM_TOKEN_FIRST_USE &&
            r->element[1]->integer <= IDEM_TOKEN_INVALID)
            op->token = (idem_token_verdict_t)r->element[1]->integer;
        else
            op->err = IDEM_E_IO;
        return;
    }
    if (op->kind != IDEM_OP_CLAIM)
        return;
    if (r->elements < 4 || !reply_is(r->element[1], REDIS_REPLY_INTEGER) ||
        !reply_is(r->element[2], REDIS_REPLY_INTEGER) ||
        !reply_is(r->element[3], REDIS_REPLY_INTEGER) || r->element[1]->integer < 1 ||
        r->element[1]->integer > IDEM_DECIDE_RECONCILE || r->element[2]->integer < 0) {
        idem__store_seterr(store, "redis: unexpected answer from the claim script");
        op->err = IDEM_E_IO;
        return;
    }
    op->decision.kind = (idem_decision_kind_t)r->element[1]->integer;
    op->decision.fence = (uint64_t)r->element[2]->integer;
    op->decision.retry_after_s = r->element[3]->integer;
    if (op->decision.kind == IDEM_DECIDE_REPLAY) {
        if (r->elements != 5 || !reply_is(r->element[4], REDIS_REPLY_STRING)) {
            op->err = IDEM_E_IO;
            return;
        }
        op->err = idem__redis_rec_from_value(r->element[4]->str, r->element[4]->len,
                                             &op->record);
        if (op->err == IDEM_E_CORRUPT)
            idem__store_seterr(store, "redis: the record of key \"%.64s\" of scope %.16s... "
                               "is damaged", op->id.key, op->id.scope);
    }
}

/* Map a Redis error reply to ours. */
idem_err_t idem__redis_map_error(const char *msg, int *broken)
{
    if (strstr(msg, "OOM") != NULL)
        return IDEM_E_STORE_FULL;
    if (strstr(msg, "READONLY") != NULL || strstr(msg, "MASTERDOWN") != NULL)
        *broken = 1; /* a failover: find the master again */
    return IDEM_E_STORE_DOWN;
}

#define MARKED(m, i) ((m)[(i) / 8] & (1u << ((i) % 8)))
#define UNMARK(m, i) ((m)[(i) / 8] &= (uint8_t) ~(1u << ((i) % 8)))

/* What one round (one call of the batch script) did. */
struct round {
    size_t ran;       /* ops whose script ran */
    size_t noscript;  /* ops still marked: NOSCRIPT */
    size_t failed;    /* ops that got another error (op->err set) */
    idem_err_t first; /* the first such error */
    int broken;       /* the connection must be dropped */
};

/* Whether an error answer to a whole script call says the script did not
 * start (NOSCRIPT, OOM, READONLY, BUSY, LOADING, NOPERM ...: a code of its
 * own), rather than that it failed while running ("ERR ..."), when some
 * of its ops may have written. */
int idem__redis_refused(const char *msg)
{
    return strncmp(msg, "ERR", 3) != 0;
}

/* Run the marked ops as ONE EVALSHA of the batch script.  Returns a batch
 * error when the call as a whole failed: refused (nothing written), or an
 * outcome unknown (the connection lost, or the script failed while
 * running). */
static idem_err_t run_round(struct redis_store *s, struct conn *k, idem_op_t *ops, size_t n,
                            uint8_t *mark, struct round *out)
{
    idem__rconn_t *c = k->c;
    redisReply *r = NULL;
    size_t sent = 0;

    memset(out, 0, sizeof *out);
    idem_err_t err = idem__redis_append_batch(&s->cfg, c, k->sha, ops, n, mark, 0, &sent);
    if (err != IDEM_OK) {
        /* Nothing was sent; whatever hiredis kept goes with the connection. */
        out->broken = 1;
        idem__store_seterr(&s->base, "redis: %s while preparing a batch", idem_strerror(err));
        return err;
    }
    if (get_reply(c, &r) != 0)
        goto lost;
    if (reply_is(r, REDIS_REPLY_ERROR) && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        out->noscript = sent; /* did not run: every op stays marked */
        freeReplyObject(r);
        return IDEM_OK;
    }
    if (reply_is(r, REDIS_REPLY_ERROR) && !idem__redis_refused(r->str)) {
        idem__store_seterr(&s->base, "redis %s: the batch script failed, the batch's outcome "
                           "is unknown: %.150s", s->where, r->str);
        freeReplyObject(r);
        return IDEM_E_STORE_DOWN;
    }
    if (!reply_is(r, REDIS_REPLY_ARRAY) || r->elements != sent) {
        const char *msg = reply_is(r, REDIS_REPLY_ERROR) ? r->str : "";
        err = idem__redis_map_error(msg, &out->broken);
        if (!reply_is(r, REDIS_REPLY_ERROR))
            out->broken = 1; /* not even an error: the conversation is lost */
        idem__store_seterr(&s->base, "redis %s: batch refused: %.150s", s->where,
                           msg[0] ? msg : "unexpected answer to the batch script");
        freeReplyObject(r);
        return err;
    }
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (!MARKED(mark, i))
            continue;
        const redisReply *e = r->element[j++];
        UNMARK(mark, i);
        if (reply_is(e, REDIS_REPLY_ERROR)) {
            ops[i].err = idem__redis_map_error(e->str, &out->broken);
            idem__store_seterr(&s->base, "redis %s: %.150s", s->where, e->str);
            if (out->failed++ == 0)
                out->first = ops[i].err;
            continue;
        }
        idem__redis_take_result(&s->base, &ops[i], e);
        out->ran++;
    }
    freeReplyObject(r);
    return IDEM_OK;

lost:
    out->broken = 1;
    {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, s->where, c, s->cfg.timeout_ms);
        idem__store_seterr(&s->base, "redis %s; the batch's outcome is unknown", why);
    }
    return IDEM_E_STORE_DOWN;
}

/* wait=N: have N replicas acknowledged every write this connection made?
 * WAIT N T on k's connection, after a batch's EXEC (the server counts the
 * replicas whose acknowledged offset reached this connection's last write,
 * blocking up to T, the URL's timeout).  The socket waits a second longer
 * than the server may hold the answer.  Fewer than N is a store error with
 * the count in errstr: the batch's writes are on the master, but a failover
 * now could lose them, so the caller must not act on them (a claim stays
 * in_progress until its lease ends, docs/stores.md).  IDEM_OK, or
 * IDEM_E_STORE_DOWN (*broken set when the connection is lost or the server
 * is no master). */
static idem_err_t wait_replicas(struct redis_store *s, struct conn *k, int *broken)
{
    char n[12], t[12];
    idem__redis_say(n, sizeof n, "%d", s->cfg.wait);
    idem__redis_say(t, sizeof t, "%d", s->cfg.timeout_ms);
    const char *argv[] = {"WAIT", n, t};
    const size_t len[] = {4, strlen(n), strlen(t)};
    idem__rconn_set_timeout(k->c, s->cfg.timeout_ms + 1000);
    redisReply *r = command(k->c, 3, argv, len);
    idem__rconn_set_timeout(k->c, s->cfg.timeout_ms);
    idem_err_t err = IDEM_E_STORE_DOWN;
    if (r == NULL) {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, s->where, k->c, s->cfg.timeout_ms + 1000);
        idem__store_seterr(&s->base, "redis %s; WAIT %d: the batch's replication is unknown",
                           why, s->cfg.wait);
        *broken = 1;
    } else if (reply_is(r, REDIS_REPLY_ERROR)) {
        idem__redis_map_error(r->str, broken);
        idem__store_seterr(&s->base, "redis %s: WAIT %d: %.150s", s->where, s->cfg.wait,
                           r->str);
    } else if (!reply_is(r, REDIS_REPLY_INTEGER)) {
        *broken = 1;
        idem__store_seterr(&s->base, "redis %s: WAIT %d: unexpected answer", s->where,
                           s->cfg.wait);
    } else if (r->integer < s->cfg.wait) {
        idem__store_seterr(&s->base,
                           "redis %s: WAIT: %lld of %d replicas acknowledged within %d ms",
                           s->where, (long long)r->integer, s->cfg.wait, s->cfg.timeout_ms);
    } else {
        err = IDEM_OK;
    }
    freeReplyObject(r);
    return err;
}

static idem_err_t redis_exec(idem_store_t *base, idem_op_t *ops, size_t n)
{
    struct redis_store *s = (struct redis_store *)base;
    uint8_t mark[(IDEM_STORE_BATCH_MAX + 7) / 8];
    size_t todo = 0;
    struct conn *k;

    memset(mark, 0, (n + 7) / 8);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].err != IDEM_OK)
            continue;
        if (!idem__redis_op_in_range(&ops[i])) {
            idem__store_seterr(base, "redis: times and fences must lie within +-2^53");
            ops[i].err = IDEM_E_INVAL;
            continue;
        }
        mark[i / 8] |= (uint8_t)(1u << (i % 8));
        todo++;
    }
    if (todo == 0)
        return IDEM_OK;

    idem_err_t err = acquire(s, &k, NULL);
    if (err != IDEM_OK) {
        return err;
    }
    struct round rd;
    size_t ran = 0, failed = 0;
    idem_err_t first = IDEM_OK;
    int broken = 0;
    for (int pass = 0; pass < 2; pass++) {
        err = run_round(s, k, ops, n, mark, &rd);
        broken |= rd.broken;
        if (err != IDEM_OK)
            break;
        ran += rd.ran;
        if (rd.failed > 0 && failed == 0)
            first = rd.first;
        failed += rd.failed;
        if (rd.noscript == 0)
            break;
        char why[256];
        if (pass == 0 && idem__redis_load_scripts(k->c, k->sha, why, sizeof why, s->cfg.timeout_ms) == 0)
            continue;
        /* Scripts that cannot be loaded, or vanish again at once. */
        if (pass == 0) {
            idem__store_seterr(base, "redis %s: %s", s->where, why);
            broken = 1;
        } else {
            idem__store_seterr(base, "redis %s: NOSCRIPT right after SCRIPT LOAD", s->where);
        }
        for (size_t i = 0; i < n; i++) {
            if (MARKED(mark, i)) {
                ops[i].err = IDEM_E_STORE_DOWN;
                if (failed++ == 0)
                    first = IDEM_E_STORE_DOWN;
            }
        }
        break;
    }
    if (err == IDEM_OK && ran > 0 && s->cfg.wait > 0)
        err = wait_replicas(s, k, &broken); /* unacknowledged: the batch fails closed */
    release(s, k, broken);
    if (err == IDEM_OK && ran == 0 && failed > 0)
        err = first; /* nothing ran: the batch failed as a whole */
    return err;
}

/* ---- get, sweep, ping ------------------------------------------------------- */

static idem_err_t redis_get(idem_store_t *base, const idem_key_id_t *id, int64_t now_ms,
                            idem_record_t *rec)
{
    struct redis_store *s = (struct redis_store *)base;
    char key[KEYBUF];
    const char *argv[] = {"EVAL", idem__redis_read_script, "1", key};
    size_t len[] = {4, idem__redis_read_script_len, 1, idem__redis_make_key(&s->cfg, id, key)};
    struct conn *k;

    idem_err_t err = acquire(s, &k, NULL);
    if (err != IDEM_OK) {
        return err == IDEM_E_NOMEM ? err : IDEM_E_STORE_DOWN;
    }
    redisReply *r = command(k->c, 4, argv, len);
    int broken = 0;
    if (r == NULL) {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, s->where, k->c, s->cfg.timeout_ms);
        idem__store_seterr(base, "redis %s", why);
        broken = 1;
        err = IDEM_E_STORE_DOWN;
    } else {
        err = idem__redis_get_answer(base, s->where, r, now_ms, rec, &broken);
    }
    freeReplyObject(r);
    release(s, k, broken);
    return err;
}

/* Run the sweep script over keys[0..nkeys); *gone gets how many it deleted. */
static idem_err_t sweep_keys(struct redis_store *s, struct conn *k, redisReply **keys,
                             size_t nkeys, int64_t now_ms, size_t *gone, int *broken)
{
    const char *argv[4 + SWEEP_KEYS_PER_CALL];
    size_t len[4 + SWEEP_KEYS_PER_CALL];
    char nk[24], now[24];

    *gone = 0;
    argv[0] = "EVALSHA";
    len[0] = 7;
    argv[2] = nk;
    len[2] = (size_t)snprintf(nk, sizeof nk, "%zu", nkeys);
    for (size_t i = 0; i < nkeys; i++) {
        argv[3 + i] = keys[i]->str;
        len[3 + i] = keys[i]->len;
    }
    argv[3 + nkeys] = now;
    len[3 + nkeys] = (size_t)snprintf(now, sizeof now, "%lld", (long long)now_ms);
    for (int pass = 0; pass < 2; pass++) {
        argv[1] = k->sha[S_SWEEP];
        len[1] = 40;
        redisReply *r = command(k->c, (int)(4 + nkeys), argv, len);
        if (r == NULL) {
            char why[200];
            idem__redis_errtext_io(why, sizeof why, s->where, k->c, s->cfg.timeout_ms);
            idem__store_seterr(&s->base, "redis %s", why);
            *broken = 1;
            return IDEM_E_STORE_DOWN;
        }
        if (reply_is(r, REDIS_REPLY_INTEGER) && r->integer >= 0) {
            *gone = (size_t)r->integer;
            freeReplyObject(r);
            return IDEM_OK;
        }
        int noscript = reply_is(r, REDIS_REPLY_ERROR) && strncmp(r->str, "NOSCRIPT", 8) == 0;
        idem__store_seterr(&s->base, "redis %s: sweep: %.150s", s->where,
                           reply_is(r, REDIS_REPLY_ERROR) ? r->str : "unexpected answer");
        idem_err_t err = reply_is(r, REDIS_REPLY_ERROR) ? idem__redis_map_error(r->str, broken) : IDEM_E_IO;
        freeReplyObject(r);
        char why[256];
        if (!noscript || pass > 0)
            return err;
        if (idem__redis_load_scripts(k->c, k->sha, why, sizeof why, s->cfg.timeout_ms) != 0) {
            idem__store_seterr(&s->base, "redis %s: %s", s->where, why);
            *broken = 1;
            return IDEM_E_STORE_DOWN;
        }
    }
    return IDEM_E_STORE_DOWN;
}

/* One SCAN step from the saved cursor; the keys it found become the pending ones. */
static idem_err_t scan_step(struct redis_store *s, struct conn *k, int *broken)
{
    char cur[24];
    const char *argv[] = {"SCAN", cur, "MATCH", s->match, "COUNT", SWEEP_SCAN_COUNT};
    size_t len[] = {4, (size_t)snprintf(cur, sizeof cur, "%llu", s->sweep_cursor), 5,
                    strlen(s->match), 5, sizeof SWEEP_SCAN_COUNT - 1};
    redisReply *r = command(k->c, 6, argv, len);
    if (r == NULL) {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, s->where, k->c, s->cfg.timeout_ms);
        idem__store_seterr(&s->base, "redis %s", why);
        *broken = 1;
        return IDEM_E_STORE_DOWN;
    }
    unsigned long long next;
    char buf[24], *end;
    if (!reply_is(r, REDIS_REPLY_ARRAY) || r->elements != 2 ||
        !reply_is(r->element[0], REDIS_REPLY_STRING) || r->element[0]->len == 0 ||
        r->element[0]->len >= sizeof buf || !reply_is(r->element[1], REDIS_REPLY_ARRAY)) {
        idem__store_seterr(&s->base, "redis %s: SCAN: %.150s", s->where,
                           reply_is(r, REDIS_REPLY_ERROR) ? r->str : "unexpected answer");
        idem_err_t err = reply_is(r, REDIS_REPLY_ERROR) ? idem__redis_map_error(r->str, broken) : IDEM_E_IO;
        freeReplyObject(r);
        return err;
    }
    memcpy(buf, r->element[0]->str, r->element[0]->len);
    buf[r->element[0]->len] = '\0';
    errno = 0;
    next = strtoull(buf, &end, 10);
    if (errno != 0 || *end != '\0') {
        freeReplyObject(r);
        idem__store_seterr(&s->base, "redis %s: SCAN gave a bad cursor", s->where);
        return IDEM_E_IO;
    }
    for (size_t i = 0; i < r->element[1]->elements; i++) {
        if (!reply_is(r->element[1]->element[i], REDIS_REPLY_STRING)) {
            freeReplyObject(r);
            idem__store_seterr(&s->base, "redis %s: SCAN gave a key that is no string",
                               s->where);
            return IDEM_E_IO;
        }
    }
    s->sweep_cursor = next;
    s->sweep_started = 1;
    freeReplyObject(s->sweep_keys);
    s->sweep_keys = r;
    s->sweep_next = 0;
    return IDEM_OK;
}

/* Redis's own clock, in ms since the epoch (TIME): 0 and IDEM_OK with *ms
 * left at -1 when the answer does not look like TIME's. */
static idem_err_t server_time(struct redis_store *s, struct conn *k, int64_t *ms, int *broken)
{
    *ms = -1;
    redisReply *r = command(k->c, 1, (const char *[]){"TIME"}, (const size_t[]){4});
    if (r == NULL) {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, s->where, k->c, s->cfg.timeout_ms);
        idem__store_seterr(&s->base, "redis %s", why);
        *broken = 1;
        return IDEM_E_STORE_DOWN;
    }
    if (reply_is(r, REDIS_REPLY_ERROR)) {
        idem__store_seterr(&s->base, "redis %s: TIME: %.150s", s->where, r->str);
        idem_err_t err = idem__redis_map_error(r->str, broken);
        freeReplyObject(r);
        return err;
    }
    if (reply_is(r, REDIS_REPLY_ARRAY) && r->elements == 2 &&
        reply_is(r->element[0], REDIS_REPLY_STRING) &&
        reply_is(r->element[1], REDIS_REPLY_STRING) && r->element[0]->len < 20 &&
        r->element[1]->len < 20) {
        char a[24], b[24], *ea, *eb;
        memcpy(a, r->element[0]->str, r->element[0]->len);
        a[r->element[0]->len] = '\0';
        memcpy(b, r->element[1]->str, r->element[1]->len);
        b[r->element[1]->len] = '\0';
        errno = 0;
        long long sec = strtoll(a, &ea, 10), usec = strtoll(b, &eb, 10);
        if (errno == 0 && *ea == '\0' && *eb == '\0' && sec >= 0 && sec < (1ll << 40) &&
            usec >= 0 && usec < 1000000)
            *ms = (int64_t)sec * 1000 + usec / 1000;
    }
    freeReplyObject(r);
    return IDEM_OK;
}

static idem_err_t redis_sweep(idem_store_t *base, int64_t now_ms, size_t max, size_t *removed)
{
    struct redis_store *s = (struct redis_store *)base;
    struct conn *k;
    size_t visited = 0, total = 0;
    int steps = 0, broken = 0;

    *removed = 0;
    if (!idem__redis_in_range(now_ms)) {
        idem__store_seterr(base, "redis: times must lie within +-2^53");
        return IDEM_E_INVAL;
    }
    idem_err_t err = acquire(s, &k, NULL);
    if (err != IDEM_OK) {
        return err;
    }
    /* Native expiry: Redis deletes a record at its PXAT by its own
     * clock (on access, and by its active expiry cycle in the background),
     * so while the caller's now is not ahead of that clock there is nothing
     * for a sweep to do, and scanning would only visit live records.  Only
     * a caller whose clock runs ahead (tests, a skewed host) gets the scan. */
    int64_t server_ms;
    err = server_time(s, k, &server_ms, &broken);
    if (err != IDEM_OK || (server_ms >= 0 && now_ms <= server_ms + SWEEP_NATIVE_SLACK_MS)) {
        release(s, k, broken);
        return err;
    }
    pthread_mutex_lock(&s->sweep_lock);
    while (visited < max) {
        redisReply *pending = s->sweep_keys ? s->sweep_keys->element[1] : NULL;
        if (pending != NULL && s->sweep_next < pending->elements) {
            size_t m = pending->elements - s->sweep_next;
            if (m > max - visited)
                m = max - visited;
            if (m > SWEEP_KEYS_PER_CALL)
                m = SWEEP_KEYS_PER_CALL;
            size_t gone;
            err = sweep_keys(s, k, pending->element + s->sweep_next, m, now_ms, &gone, &broken);
            if (err != IDEM_OK)
                break;
            total += gone;
            visited += m;
            s->sweep_next += m;
            continue;
        }
        freeReplyObject(s->sweep_keys);
        s->sweep_keys = NULL;
        if (s->sweep_started && s->sweep_cursor == 0) {
            s->sweep_started = 0; /* a whole pass is done: the next call starts over */
            break;
        }
        if (steps++ == SWEEP_STEPS_MAX)
            break;
        err = scan_step(s, k, &broken);
        if (err != IDEM_OK)
            break;
    }
    pthread_mutex_unlock(&s->sweep_lock);
    release(s, k, broken);
    *removed = total;
    return err;
}

static idem_err_t redis_ping(idem_store_t *base)
{
    struct redis_store *s = (struct redis_store *)base;
    struct conn *k;

    idem_err_t err = acquire(s, &k, NULL);
    if (err != IDEM_OK) {
        return IDEM_E_STORE_DOWN;
    }
    redisReply *r = command(k->c, 1, (const char *[]){"PING"}, (const size_t[]){4});
    int broken = 0;
    if (r == NULL) {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, s->where, k->c, s->cfg.timeout_ms);
        idem__store_seterr(base, "redis %s", why);
        broken = 1;
        err = IDEM_E_STORE_DOWN;
    } else if (!reply_is(r, REDIS_REPLY_STATUS) || strcmp(r->str, "PONG") != 0) {
        idem__store_seterr(base, "redis %s: PING: %.150s", s->where,
                           reply_is(r, REDIS_REPLY_ERROR) ? r->str : "unexpected answer");
        if (reply_is(r, REDIS_REPLY_ERROR))
            idem__redis_map_error(r->str, &broken);
        err = IDEM_E_STORE_DOWN;
    } else if (s->cfg.wait > 0) {
        err = wait_replicas(s, k, &broken); /* /readyz says the replicas do not answer */
    }
    freeReplyObject(r);
    release(s, k, broken);
    return err;
}

/* ---- invalidations (redis_sub.c) ------------------------------------------- */

/* PUBLISH msg on the invalidation channel, on a pooled connection. */
static idem_err_t redis_publish(idem_store_t *base, const char *msg, size_t len)
{
    struct redis_store *s = (struct redis_store *)base;
    struct conn *k;
    if (acquire(s, &k, NULL) != IDEM_OK)
        return IDEM_E_STORE_DOWN;
    char chan[IDEM_STORE_OPT_MAX + sizeof "invalidate"];
    size_t cl = idem__redis_channel(&s->cfg, chan);
    redisReply *r = command(k->c, 3, (const char *[]){"PUBLISH", chan, msg},
                            (const size_t[]){7, cl, len});
    int broken = r == NULL;
    idem_err_t err = reply_is(r, REDIS_REPLY_INTEGER) ? IDEM_OK : IDEM_E_STORE_DOWN;
    if (r == NULL) {
        char why[200];
        idem__redis_errtext_io(why, sizeof why, s->where, k->c, s->cfg.timeout_ms);
        idem__store_seterr(base, "redis %s", why);
    } else if (err != IDEM_OK) {
        idem__store_seterr(base, "redis %s: PUBLISH: %.150s", s->where,
                           reply_is(r, REDIS_REPLY_ERROR) ? r->str : "unexpected answer");
        if (reply_is(r, REDIS_REPLY_ERROR))
            idem__redis_map_error(r->str, &broken);
    }
    freeReplyObject(r);
    release(s, k, broken);
    return err;
}

static void redis_watch_session(idem_store_t *base, int stop_fd, idem__watch_sink_t *sink)
{
    struct redis_store *s = (struct redis_store *)base;
    idem__redis_watch_session(&s->cfg, s->tls, stop_fd, sink);
}

/* ---- open, close ------------------------------------------------------------ */

static void redis_close(idem_store_t *base)
{
    struct redis_store *s = (struct redis_store *)base;
    idem__pool_cleanup(&s->pool); /* every connection is idle when the store is closed */
    freeReplyObject(s->sweep_keys);
    pthread_mutex_destroy(&s->sweep_lock);
    idem__tls_ctx_unref(s->tls);
    idem_free(s);
}

/* The TLS context of a rediss URL, its files read now.  On failure, one
 * line naming the parameter ("redis store option ca=/x.pem: No such file
 * or directory"): core/tls.c names the fields as "R.ca_file: ", which
 * becomes the parameter here. */
idem_err_t idem__redis_tls_context(const struct rcfg *cfg, idem_tls_ctx_t **out, char *errbuf,
                              size_t errlen)
{
    static const char *const none[] = {NULL}; /* Redis speaks no ALPN */
    idem_tls_client_opts_t o = {
        .name = "R",
        .ca_file = cfg->ca[0] ? cfg->ca : NULL,
        .cert_file = cfg->cert[0] ? cfg->cert : NULL,
        .key_file = cfg->key[0] ? cfg->key : NULL,
        .no_verify = cfg->no_verify != 0,
        .alpn = none,
    };
    char why[PATH_OPT_MAX + 256];
    if (idem__tls_client_ctx_create(&o, out, why, sizeof why) == 0)
        return IDEM_OK;
    static const struct {
        const char *field, *param;
    } map[] = {{"R.ca_file: ", "ca="}, {"R.cert_file: ", "cert="}, {"R.key_file: ", "key="}};
    for (size_t i = 0; i < 3; i++) {
        size_t fl = strlen(map[i].field);
        if (strncmp(why, map[i].field, fl) == 0) {
            idem__store_errbuf(errbuf, errlen, "redis store option %s%s", map[i].param,
                               why + fl);
            return IDEM_E_INVAL;
        }
    }
    idem__store_errbuf(errbuf, errlen, "redis store (TLS): %s",
                       strncmp(why, "R: ", 3) == 0 ? why + 3 : why);
    return strstr(why, "out of memory") != NULL ? IDEM_E_NOMEM : IDEM_E_INVAL;
}

idem_err_t idem__redis_prepare(const char *rest, int form, int tls, struct rcfg *cfg,
                               idem_tls_ctx_t **ctx, char *errbuf, size_t errlen)
{
    *ctx = NULL;
    if (idem__redis_parse_url(rest, form, tls, cfg, errbuf, errlen) != 0)
        return IDEM_E_INVAL;
    return tls ? idem__redis_tls_context(cfg, ctx, errbuf, errlen) : IDEM_OK;
}

static idem_err_t open_common(const char *rest, int sentinel, int tls, idem_store_t **out,
                              char *errbuf, size_t errlen)
{
    struct rcfg cfg;
    idem_tls_ctx_t *ctx;
    idem_err_t perr = idem__redis_prepare(rest, sentinel, tls, &cfg, &ctx, errbuf, errlen);
    if (perr != IDEM_OK)
        return perr;
    if (out == NULL) {
        idem__tls_ctx_unref(ctx);
        return IDEM_OK; /* idem_store_check_url: the URL and its files are good */
    }

    struct redis_store *s = idem_calloc(1, sizeof *s);
    if (s == NULL) {
        idem__tls_ctx_unref(ctx);
        return IDEM_E_NOMEM;
    }
    s->tls = ctx;
    s->base.ops = tls ? (sentinel ? &idem__store_rediss_sentinel_ops : &idem__store_rediss_ops)
                      : (sentinel ? &idem__store_redis_sentinel_ops : &idem__store_redis_ops);
    s->base.exec_is_cheap = false;
    s->cfg = cfg;
    if (sentinel)
        idem__redis_say(s->where, sizeof s->where, "master %s", cfg.master);
    else if (strchr(cfg.ep[0].host, ':') != NULL)
        idem__redis_say(s->where, sizeof s->where, "[%s]:%d", cfg.ep[0].host, cfg.ep[0].port);
    else
        idem__redis_say(s->where, sizeof s->where, "%s:%d", cfg.ep[0].host, cfg.ep[0].port);
    /* SCAN's pattern: the prefix with glob characters escaped, then '*'. */
    size_t m = 0;
    for (size_t i = 0; i < cfg.prefix_len; i++) {
        if (strchr("*?[]\\", cfg.prefix[i]) != NULL)
            s->match[m++] = '\\';
        s->match[m++] = cfg.prefix[i];
    }
    s->match[m++] = '*';
    s->match[m] = '\0';

    idem__pool_cfg_t pc = {.ops = &pool_ops, .ctx = s, .max = cfg.pool,
                           .wait_ms = cfg.timeout_ms};
    if (idem__pool_init(&s->pool, &pc) != IDEM_OK) {
        idem__tls_ctx_unref(s->tls);
        idem_free(s);
        return IDEM_E_NOMEM;
    }
    pthread_mutex_init(&s->sweep_lock, NULL);

    /* One connection now, so a wrong address or password fails the open. */
    struct conn *k;
    idem__pool_fail_t f;
    idem_err_t err = acquire(s, &k, &f);
    if (err == IDEM_OK)
        release(s, k, 0);
    if (err != IDEM_OK) {
        idem__store_errbuf(errbuf, errlen, "redis %s: %s", s->where,
                           err == IDEM_E_STORE_DOWN && f.why[0] ? f.why : idem_strerror(err));
        redis_close(&s->base);
        return err;
    }
    *out = &s->base;
    return IDEM_OK;
}

static idem_err_t redis_open(const char *rest, idem_store_t **out, char *errbuf, size_t errlen)
{
    return open_common(rest, 0, 0, out, errbuf, errlen);
}

static idem_err_t sentinel_open(const char *rest, idem_store_t **out, char *errbuf,
                                size_t errlen)
{
    return open_common(rest, 1, 0, out, errbuf, errlen);
}

static idem_err_t rediss_open(const char *rest, idem_store_t **out, char *errbuf, size_t errlen)
{
    return open_common(rest, 0, 1, out, errbuf, errlen);
}

static idem_err_t rediss_sentinel_open(const char *rest, idem_store_t **out, char *errbuf,
                                       size_t errlen)
{
    return open_common(rest, 1, 1, out, errbuf, errlen);
}

/* ---- what redis_list.c needs (redis_impl.h) -------------------------------- */

static idem_err_t single_borrow(idem_store_t *base, int node, idem__rconn_t **c, void **hold)
{
    (void)node;
    struct conn *k;
    idem_err_t err = acquire((struct redis_store *)base, &k, NULL);
    if (err != IDEM_OK)
        return err == IDEM_E_NOMEM ? err : IDEM_E_STORE_DOWN;
    *c = k->c;
    *hold = k;
    return IDEM_OK;
}

static void single_give_back(idem_store_t *base, int node, void *hold, int broken)
{
    (void)node;
    release((struct redis_store *)base, hold, broken);
}

idem_err_t idem__redis_single_nodes(idem_store_t *base, idem__redis_nodes_t *out)
{
    struct redis_store *s = (struct redis_store *)base;
    memset(out, 0, sizeof *out);
    out->cfg = &s->cfg;
    out->where = s->where;
    out->n = 1;
    out->borrow = single_borrow;
    out->give_back = single_give_back;
    return IDEM_OK;
}

#define REDIS_OPS(scheme_, open_)                                                            \
    {                                                                                        \
        .name = "redis", .scheme = scheme_, .open = open_, .close = redis_close,            \
        .exec = redis_exec, .get = redis_get, .sweep = redis_sweep, .ping = redis_ping,     \
        .publish = redis_publish, .watch_session = redis_watch_session,                     \
        .list = idem__redis_list, .delete_if = idem__redis_delete_if,                       \
    }

const struct idem_store_ops idem__store_redis_ops = REDIS_OPS("redis", redis_open);
const struct idem_store_ops idem__store_redis_sentinel_ops =
    REDIS_OPS("redis+sentinel", sentinel_open);
const struct idem_store_ops idem__store_rediss_ops = REDIS_OPS("rediss", rediss_open);
const struct idem_store_ops idem__store_rediss_sentinel_ops =
    REDIS_OPS("rediss+sentinel", rediss_sentinel_open);
