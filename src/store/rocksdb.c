/* src/store/rocksdb.c - the embedded store that grows with its data ("rocksdb:PATH").
 *
 * A RocksDB database in directory PATH (created if missing) through
 * RocksDB's C API, with two column families:
 *
 *   "default"  scope '\0' key -> the encoded record (src/core/record.c),
 *              the same bytes LMDB and memory: keep;
 *   "expiry"   BE64(expires_at_ms, sign bit flipped) || scope '\0' key ->
 *              empty: the expiry index, in expiry order.
 *
 * Every record write, overwrite or delete changes the index in the same
 * WriteBatch, so the two never disagree after a crash.  sweep walks the
 * index from its oldest entry up to now and deletes what it finds, so it
 * never reads a live record and its cost is the number of records that
 * leave, not the size of the store.  An index entry whose record is gone or
 * carries another expires_at (a record that did not decode when it was
 * overwritten) is simply dropped.  The sweep starts at a floor (the oldest
 * expires_at that can still be indexed), so it does not step again over
 * the delete tombstones of what it already removed; an exec that indexes a
 * record below the floor lowers it after its write.
 *
 * A compaction filter that drops expired records was considered and left
 * out: the time of a record is the caller's (tests and the gateway pass it
 * in), a fenced op may still finish a record past expires_at that nobody
 * else claimed, and a record dropped behind the index's back would leave
 * the index to clean up anyway.  The index is the one way records leave.
 *
 * Exec.  RocksDB has no read-modify-write transaction in its plain API, so
 * exec serialises the decisions itself: concurrent exec calls queue, and one
 * of them (the leader) takes the whole queue, reads each key through a
 * WriteBatchWithIndex (so a later op of the group sees what an earlier one
 * wrote), lets idem__store_apply decide, and writes the batch at once,
 * atomically; the others wait for its write.  That is the group commit: one
 * WAL fsync for everything that queued while the last one ran.  Reads (get,
 * ping) never wait for the leader: RocksDB reads see the last write.
 *
 * Durability.  sync=always (default): the WriteBatch is written with
 * sync=true, so the WAL is fsynced before exec returns.  sync=interval:
 * written without sync (a crash of the process loses nothing: the WAL is in
 * the kernel), and a flusher thread fsyncs the WAL every 100 ms and at
 * close, so a power loss loses up to 100 ms, as LMDB's interval mode.
 *
 * Memory is bounded by options: one LRU block cache (cache_size, default
 * 32 MiB) holds data, index and filter blocks of both column families, and
 * each column family keeps at most two memtables of write_buffer_size
 * (default 16 MiB).  Open replays at most the WAL behind those memtables,
 * never scans the data, so it is fast at any size.
 *
 * One process per directory: RocksDB locks PATH/LOCK, and a second open of
 * the same directory, in this process or another, fails (IDEM_E_IO, the
 * RocksDB text in the error).  Several idemd sharing one directory need
 * lmdb:.
 *
 * Room on disk.  RocksDB writes until the disk is full, and then it is
 * stuck: a full disk fails the WAL write and stops flushes and compactions,
 * and compaction is the only way deletes give space back.  So the store
 * refuses new records itself while the filesystem has room left:
 * free_bytes (idem_store_space) is what statvfs says is available to us
 * minus a reserve of max(min_free, used / 32), and while it is 0 a
 * caller's batch that would add a record or make one larger fails with
 * IDEM_E_STORE_FULL (that batch alone; the rest of its group commits).
 * Renewals, releases, holds, deletes and the sweep still go through, and
 * the reserve is room for compactions to write their output before they
 * delete their input.  used_bytes is the sum of st_blocks of the regular
 * files in PATH (SSTs, WAL with its preallocation, MANIFEST, LOG): what
 * the store takes on the disk, obsolete files not yet deleted included.
 * The exec path measures at most once a second (SPACE_TTL_NS), only when
 * a batch grows the store, and never waits for another thread measuring;
 * within that second up to a second's writes can go in, which the
 * reserve covers.
 *
 * Errors: a full disk (RocksDB's NoSpace, "No space left on device") is
 * IDEM_E_STORE_FULL, as is a growing batch while free_bytes is 0; any
 * other write error IDEM_E_IO; a read error IDEM_E_STORE_DOWN; the RocksDB
 * text goes to idem_store_errstr.
 *
 * THREADING: get and ping from any thread at any time; exec from any
 * thread, queued under qlock with one leader at a time; sweep under
 * sweep_lock, and its writes are plain RocksDB writes (each a check of the
 * record it deletes made inside the leader's lock, see sweep); space from
 * any thread, measuring under space_lock, its last answer in atomics.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "idem/alloc.h"
#include "idem/clock.h"
#include "idem/units.h"
#include "store/store_impl.h"

#define DEFAULT_CACHE (32ull << 20)
#define MIN_CACHE (1ull << 20)
#define MAX_CACHE (64ull << 30)
#define DEFAULT_WBUF (16ull << 20)
#define MIN_WBUF (1ull << 20)
#define MAX_WBUF (1ull << 30)
#define FLUSH_INTERVAL_NS 100000000L
#define GROUP_MAX_OPS 10000 /* ops in one group past the first batch */
#define IXKEY_MAX (8 + IDEM_STORE_KEY_MAX)
/* The room kept on the filesystem for compaction and deletes: at least
 * min_free (default below), and used / SPACE_RESERVE_DIV of a large store,
 * since a compaction writes its output before it deletes its input (at 51
 * GB used that is RocksDB's default max_compaction_bytes, 1.6 GB). */
#define DEFAULT_MIN_FREE (256ull << 20)
#define MAX_MIN_FREE (1ull << 44) /* 16 TiB: beyond that, a typo */
#define SPACE_RESERVE_DIV 32
#define SPACE_TTL_NS 1000000000ull /* the exec path measures at most this often */

/* A caller's batch waiting for the group commit (lives on its stack). */
struct job {
    struct job *next;
    idem_op_t *ops;
    size_t n;
    int done;          /* set by the leader, under qlock */
    int refused;       /* refused alone for want of room (run_jobs) */
    idem_err_t result; /* the write's outcome */
    char errstr[200];  /* its detail, for the caller's idem_store_errstr */
};

struct rocks_store {
    struct idem_store base; /* first: a rocks_store is an idem_store */
    rocksdb_t *db;
    rocksdb_options_t *opts;     /* the DB's and the records family's */
    rocksdb_options_t *ix_opts;  /* the expiry family's */
    rocksdb_block_based_table_options_t *table;
    rocksdb_cache_t *cache;
    rocksdb_column_family_handle_t *cf_rec, *cf_ix;
    rocksdb_writeoptions_t *wopts; /* sync per the URL */
    rocksdb_readoptions_t *ropts;
    int nosync;
    char dir[PATH_MAX]; /* PATH, for the room on disk */
    uint64_t min_free;  /* the URL's min_free: the least reserve */
    /* The room on disk: the last measure, read by exec without a lock. */
    pthread_mutex_t space_lock;     /* one measure at a time */
    _Atomic uint64_t space_at_ns;   /* monotonic time of the last measure; 0: never */
    atomic_bool space_full;         /* it found free_bytes 0 */
    _Atomic uint64_t space_avail;   /* what the filesystem had for us then */
    _Atomic uint64_t space_reserve; /* and the reserve (for the error text) */
    /* the group commit queue */
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    struct job *qhead, **qtail;
    int leading; /* a leader is writing; guarded by qlock */
    /* the sweep */
    pthread_mutex_t sweep_lock;
    _Atomic int64_t floor; /* no index entry below this expires_at */
    idem__flusher_t flusher; /* nosync only */
};

/* ---- helpers -------------------------------------------------------------- */

static idem_err_t fail(struct rocks_store *s, const char *what, char *err, idem_err_t other)
{
    idem_err_t code = other;
    if (err != NULL && (strstr(err, "No space left") != NULL || strstr(err, "NoSpace") != NULL))
        code = IDEM_E_STORE_FULL;
    idem__store_seterr(&s->base, "rocksdb %s: %s", what, err != NULL ? err : "failed");
    rocksdb_free(err);
    return code;
}

/* Fault injection (store_impl.h): each call into RocksDB that reads or
 * writes may fail as an I/O error would; this makes *errp such an error. */
static bool injected(char **errp)
{
    if (!idem__store_io_fault())
        return false;
    static const char msg[] = "IO error: injected";
    char *e = malloc(sizeof msg); /* rocksdb_free is free() */
    if (e != NULL)
        memcpy(e, msg, sizeof msg);
    *errp = e;
    return true;
}

/* expires_at as 8 bytes that sort as the signed number does. */
static void put_be64(uint8_t *p, int64_t v)
{
    uint64_t u = (uint64_t)v ^ (1ull << 63);
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)u;
        u >>= 8;
    }
}

static int64_t get_be64(const uint8_t *p)
{
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = (u << 8) | p[i];
    return (int64_t)(u ^ (1ull << 63));
}

static size_t ix_key(uint8_t *buf, int64_t expires_at, const char *key, size_t klen)
{
    put_be64(buf, expires_at);
    memcpy(buf + 8, key, klen);
    return 8 + klen;
}

/* Lower the sweep floor to at most v. */
static void lower_floor(struct rocks_store *s, int64_t v)
{
    int64_t f = atomic_load(&s->floor);
    while (v < f && !atomic_compare_exchange_weak(&s->floor, &f, v))
        ;
}

/* The flusher's call (sync=interval): fsync the WAL. */
static int wal_flush(void *arg)
{
    struct rocks_store *s = arg;
    char *err = NULL;
    rocksdb_flush_wal(s->db, 1, &err);
    int failed = err != NULL;
    rocksdb_free(err);
    return failed;
}

/* ---- opening ------------------------------------------------------------- */

struct opts {
    int nosync;
    uint64_t cache_size;
    uint64_t write_buffer_size;
    uint64_t min_free;
};

static idem_err_t parse_opts(const char *query, struct opts *o, char *errbuf, size_t errlen)
{
    char name[IDEM_STORE_OPT_MAX + 1], value[IDEM_STORE_OPT_MAX + 1];
    int r;

    o->nosync = 0;
    o->cache_size = DEFAULT_CACHE;
    o->write_buffer_size = DEFAULT_WBUF;
    o->min_free = DEFAULT_MIN_FREE;
    while ((r = idem__store_next_opt(&query, name, value, errbuf, errlen)) > 0) {
        if (strcmp(name, "sync") == 0) {
            if (idem__store_sync_opt("rocksdb", value, &o->nosync, errbuf, errlen) != 0)
                return IDEM_E_INVAL;
        } else if (strcmp(name, "cache_size") == 0) {
            if (idem__store_size_opt("rocksdb", name, value, MIN_CACHE, MAX_CACHE,
                                     "from 1MiB to 64GiB, e.g. 32MiB", &o->cache_size, errbuf,
                                     errlen) != 0)
                return IDEM_E_INVAL;
        } else if (strcmp(name, "write_buffer_size") == 0) {
            if (idem__store_size_opt("rocksdb", name, value, MIN_WBUF, MAX_WBUF,
                                     "from 1MiB to 1GiB, e.g. 16MiB", &o->write_buffer_size,
                                     errbuf, errlen) != 0)
                return IDEM_E_INVAL;
        } else if (strcmp(name, "min_free") == 0) {
            if (idem__store_size_opt("rocksdb", name, value, 0, MAX_MIN_FREE,
                                     "from 0 to 16384GiB, e.g. 1GiB", &o->min_free, errbuf,
                                     errlen) != 0)
                return IDEM_E_INVAL;
        } else {
            idem__store_errbuf(errbuf, errlen,
                               "unknown option \"%s\" for store rocksdb: (known: sync, "
                               "cache_size, write_buffer_size, min_free)",
                               name);
            return IDEM_E_INVAL;
        }
    }
    return r < 0 ? IDEM_E_INVAL : IDEM_OK;
}

static void destroy_parts(struct rocks_store *s)
{
    if (s->cf_rec != NULL)
        rocksdb_column_family_handle_destroy(s->cf_rec);
    if (s->cf_ix != NULL)
        rocksdb_column_family_handle_destroy(s->cf_ix);
    if (s->db != NULL)
        rocksdb_close(s->db);
    if (s->opts != NULL)
        rocksdb_options_destroy(s->opts);
    if (s->ix_opts != NULL)
        rocksdb_options_destroy(s->ix_opts);
    if (s->table != NULL)
        rocksdb_block_based_options_destroy(s->table);
    if (s->cache != NULL)
        rocksdb_cache_destroy(s->cache);
    if (s->wopts != NULL)
        rocksdb_writeoptions_destroy(s->wopts);
    if (s->ropts != NULL)
        rocksdb_readoptions_destroy(s->ropts);
}

static void common_options(rocksdb_options_t *o, const struct opts *u,
                           rocksdb_block_based_table_options_t *table)
{
    rocksdb_options_set_write_buffer_size(o, (size_t)u->write_buffer_size);
    rocksdb_options_set_max_write_buffer_number(o, 2);
    rocksdb_options_set_block_based_table_factory(o, table);
    rocksdb_options_set_level_compaction_dynamic_level_bytes(o, 1);
    /* A damaged write-ahead log refuses the open instead of being cut at
     * the damage: RocksDB's default (point in time) silently drops the
     * damaged record and every later one, so keys completed after it come
     * back absent and their requests run again.  Only an incomplete last
     * record, which a crash leaves, is tolerated. */
    rocksdb_options_set_wal_recovery_mode(o, rocksdb_tolerate_corrupted_tail_records_recovery);
}

static idem_err_t rocks_open(const char *rest, idem_store_t **out, char *errbuf, size_t errlen)
{
    const char *query;
    char dir[PATH_MAX];
    struct opts o;

    idem_err_t err = idem__store_dir("rocksdb", rest, dir, sizeof dir, &query, errbuf, errlen);
    if (err != IDEM_OK)
        return err;
    err = parse_opts(query, &o, errbuf, errlen);
    if (err != IDEM_OK)
        return err;
    if (out == NULL)
        return IDEM_OK; /* idem_store_check_url: the URL is good */

    struct rocks_store *s = idem_calloc(1, sizeof *s);
    if (s == NULL)
        return IDEM_E_NOMEM;
    s->base.ops = &idem__store_rocksdb_ops;
    s->base.exec_is_cheap = o.nosync != 0;
    s->base.reads_are_local = true;
    s->nosync = o.nosync;
    s->min_free = o.min_free;
    memcpy(s->dir, dir, strlen(dir) + 1);
    atomic_init(&s->space_at_ns, 0);
    atomic_init(&s->space_full, false);
    atomic_init(&s->space_avail, 0);
    atomic_init(&s->space_reserve, 0);
    s->qtail = &s->qhead;
    atomic_init(&s->floor, INT64_MIN);

    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        idem__store_errbuf(errbuf, errlen, "rocksdb store: cannot create directory %s: %s", dir,
                           strerror(errno));
        idem_free(s);
        return IDEM_E_IO;
    }

    /* 16 shards: an LRU shard smaller than a block would drop it at once. */
    rocksdb_lru_cache_options_t *lru = rocksdb_lru_cache_options_create();
    rocksdb_lru_cache_options_set_capacity(lru, (size_t)o.cache_size);
    rocksdb_lru_cache_options_set_num_shard_bits(lru, 4);
    s->cache = rocksdb_cache_create_lru_opts(lru);
    rocksdb_lru_cache_options_destroy(lru);
    s->table = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_cache(s->table, s->cache);
    /* Index and filter blocks live in the cache, cut in 4 KiB partitions
     * (a two-level index over them, pinned), so the memory they take is
     * bounded by cache_size however large the store grows, and a look-up
     * reads one partition, not a whole SST's filter. */
    rocksdb_block_based_options_set_format_version(s->table, 5);
    rocksdb_block_based_options_set_index_type(
        s->table, rocksdb_block_based_table_index_type_two_level_index_search);
    rocksdb_block_based_options_set_partition_filters(s->table, 1);
    rocksdb_block_based_options_set_metadata_block_size(s->table, 4096);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks(s->table, 1);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks_with_high_priority(s->table, 1);
    rocksdb_block_based_options_set_pin_top_level_index_and_filter(s->table, 1);
    rocksdb_block_based_options_set_pin_l0_filter_and_index_blocks_in_cache(s->table, 1);
    rocksdb_block_based_options_set_filter_policy(s->table, rocksdb_filterpolicy_create_bloom(10));
    s->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(s->opts, 1);
    rocksdb_options_set_create_missing_column_families(s->opts, 1);
    rocksdb_options_set_max_background_jobs(s->opts, 2);
    rocksdb_options_set_max_open_files(s->opts, 1000);
    rocksdb_options_set_max_total_wal_size(s->opts, 4 * o.write_buffer_size);
    rocksdb_options_set_keep_log_file_num(s->opts, 2);
    rocksdb_options_set_max_log_file_size(s->opts, 4 << 20);
    rocksdb_options_set_info_log_level(s->opts, 3); /* errors only in PATH/LOG */
    common_options(s->opts, &o, s->table);
    s->ix_opts = rocksdb_options_create();
    common_options(s->ix_opts, &o, s->table);
    s->wopts = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(s->wopts, o.nosync ? 0 : 1);
    s->ropts = rocksdb_readoptions_create();

    const char *names[2] = {"default", "expiry"};
    const rocksdb_options_t *cfo[2] = {s->opts, s->ix_opts};
    rocksdb_column_family_handle_t *cfh[2] = {NULL, NULL};
    char *rerr = NULL;
    if (!injected(&rerr))
        s->db = rocksdb_open_column_families(s->opts, dir, 2, names, cfo, cfh, &rerr);
    if (rerr != NULL || s->db == NULL) {
        idem__store_errbuf(errbuf, errlen, "rocksdb store %s: %s", dir,
                           rerr != NULL ? rerr : "cannot open");
        err = rerr != NULL && strstr(rerr, "No space left") != NULL ? IDEM_E_STORE_FULL
                                                                    : IDEM_E_IO;
        rocksdb_free(rerr);
        s->cf_rec = cfh[0];
        s->cf_ix = cfh[1];
        destroy_parts(s);
        idem_free(s);
        return err;
    }
    s->cf_rec = cfh[0];
    s->cf_ix = cfh[1];
    if (o.nosync && idem__flusher_start(&s->flusher, FLUSH_INTERVAL_NS, wal_flush, s) != 0) {
        idem__store_errbuf(errbuf, errlen, "rocksdb store %s: cannot start the flusher thread",
                           dir);
        destroy_parts(s);
        idem_free(s);
        return IDEM_E_NOMEM;
    }
    pthread_mutex_init(&s->qlock, NULL);
    pthread_cond_init(&s->qcond, NULL);
    pthread_mutex_init(&s->sweep_lock, NULL);
    pthread_mutex_init(&s->space_lock, NULL);
    *out = &s->base;
    return IDEM_OK;
}

static void rocks_close(idem_store_t *base)
{
    struct rocks_store *s = (struct rocks_store *)base;
    if (s->nosync) {
        idem__flusher_stop(&s->flusher);
        char *err = NULL;
        rocksdb_flush_wal(s->db, 1, &err); /* the last 100 ms */
        rocksdb_free(err);
    }
    destroy_parts(s);
    pthread_cond_destroy(&s->qcond);
    pthread_mutex_destroy(&s->qlock);
    pthread_mutex_destroy(&s->sweep_lock);
    pthread_mutex_destroy(&s->space_lock);
    idem_free(s);
}

/* ---- room on disk ----------------------------------------------------------- */

/* Measure the store's files and the room of its filesystem into out, and
 * keep the verdict for exec (space_lock held).  A file that a compaction
 * deletes between readdir and fstatat is simply not counted. */
static idem_err_t measure(struct rocks_store *s, idem_store_space_t *out)
{
    uint64_t used = 0;
    DIR *d = opendir(s->dir);
    if (d == NULL) {
        idem__store_seterr(&s->base, "rocksdb: cannot read directory %s: %s", s->dir,
                           strerror(errno));
        return IDEM_E_IO;
    }
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            used += (uint64_t)st.st_blocks * 512u;
    }
    closedir(d);
    struct statvfs vfs;
    if (statvfs(s->dir, &vfs) != 0) {
        idem__store_seterr(&s->base, "rocksdb: statvfs %s: %s", s->dir, strerror(errno));
        return IDEM_E_IO;
    }
    uint64_t frsize = vfs.f_frsize != 0 ? vfs.f_frsize : vfs.f_bsize;
    uint64_t avail = frsize != 0 && (uint64_t)vfs.f_bavail > UINT64_MAX / frsize
                         ? UINT64_MAX
                         : (uint64_t)vfs.f_bavail * frsize;
    uint64_t reserve =
        used / SPACE_RESERVE_DIV > s->min_free ? used / SPACE_RESERVE_DIV : s->min_free;
    out->used_bytes = used;
    out->free_bytes = avail > reserve ? avail - reserve : 0;
    atomic_store(&s->space_avail, avail);
    atomic_store(&s->space_reserve, reserve);
    atomic_store(&s->space_full, out->free_bytes == 0);
    return IDEM_OK;
}

static idem_err_t rocks_space(idem_store_t *base, idem_store_space_t *out)
{
    struct rocks_store *s = (struct rocks_store *)base;
    pthread_mutex_lock(&s->space_lock);
    idem_err_t err = measure(s, out);
    if (err == IDEM_OK)
        atomic_store(&s->space_at_ns, idem_clock_mono_ns());
    pthread_mutex_unlock(&s->space_lock);
    return err;
}

/* Whether a batch that grows the store must be refused: the last measure
 * found no room.  Measures again when that one is older than SPACE_TTL_NS,
 * unless another thread is measuring right now (then the last one stands).
 * A filesystem that cannot be asked refuses nothing: the write itself then
 * says whether the disk took it. */
static bool no_room(struct rocks_store *s)
{
    uint64_t now = idem_clock_mono_ns(), at = atomic_load(&s->space_at_ns);
    if ((at == 0 || now - at >= SPACE_TTL_NS) && pthread_mutex_trylock(&s->space_lock) == 0) {
        idem_store_space_t sp;
        if (measure(s, &sp) != IDEM_OK)
            atomic_store(&s->space_full, false);
        atomic_store(&s->space_at_ns, now != 0 ? now : 1);
        pthread_mutex_unlock(&s->space_lock);
    }
    return atomic_load(&s->space_full);
}

/* ---- exec ----------------------------------------------------------------- */

/* Apply one caller's ops into wb; IDEM_OK or what stops the whole group.
 * *low is lowered to the least expires_at indexed; *grew is set when an op
 * adds a record or makes one larger. */
static idem_err_t apply_ops(struct rocks_store *s, rocksdb_writebatch_wi_t *wb, idem_op_t *ops,
                            size_t n, int64_t *low, uint8_t **encp, size_t *capp, bool *grew)
{
    uint8_t *enc = *encp;
    size_t enc_cap = *capp;
    char key[IDEM_STORE_KEY_MAX];
    uint8_t ix[IXKEY_MAX];
    idem_record_t next, head;

    for (size_t i = 0; i < n; i++) {
        idem_op_t *op = &ops[i];
        if (op->err != IDEM_OK)
            continue;
        size_t klen = idem__store_key(&op->id, key), vlen = 0;
        char *err = NULL, *cur = NULL;
        if (!injected(&err))
            cur = rocksdb_writebatch_wi_get_from_batch_and_db_cf(wb, s->db, s->ropts, s->cf_rec,
                                                                 key, klen, &vlen, &err);
        if (err != NULL)
            return fail(s, "get", err, IDEM_E_IO);
        int have_old = cur != NULL &&
                       idem_record_decode_head((const uint8_t *)cur, vlen, &head) == IDEM_OK;
        int64_t old_exp = have_old ? head.expires_at_ms : 0;
        idem__store_action_t act = idem__store_apply(op, (const uint8_t *)cur, vlen, &next);
        if (act == IDEM__STORE_PUT) {
            size_t need = idem_record_encoded_size(&next);
            if (need > enc_cap) {
                uint8_t *p = idem_realloc(enc, need);
                if (p == NULL) { /* the whole group fails: nothing is written */
                    rocksdb_free(cur);
                    idem__store_seterr(&s->base, "rocksdb: out of memory encoding a record");
                    return IDEM_E_NOMEM;
                }
                *encp = enc = p;
                *capp = enc_cap = need;
            }
            idem_record_encode_into(&next, enc);
            if (cur == NULL || need > vlen)
                *grew = true;
            rocksdb_writebatch_wi_put_cf(wb, s->cf_rec, key, klen, (const char *)enc, need);
            if (!have_old || old_exp != next.expires_at_ms) {
                if (have_old)
                    rocksdb_writebatch_wi_delete_cf(wb, s->cf_ix,
                                                    (const char *)ix, ix_key(ix, old_exp, key, klen));
                rocksdb_writebatch_wi_put_cf(wb, s->cf_ix, (const char *)ix,
                                             ix_key(ix, next.expires_at_ms, key, klen), "", 0);
                if (next.expires_at_ms < *low)
                    *low = next.expires_at_ms;
            }
        } else if (act == IDEM__STORE_DEL) {
            rocksdb_writebatch_wi_delete_cf(wb, s->cf_rec, key, klen);
            if (have_old)
                rocksdb_writebatch_wi_delete_cf(wb, s->cf_ix, (const char *)ix,
                                                ix_key(ix, old_exp, key, klen));
        }
        rocksdb_free(cur);
    }
    return IDEM_OK;
}

/* One WriteBatch over every job of the list.  A job that grows the store
 * while there is no room is taken back out of the batch (a save point
 * before each job) and marked refused, with IDEM_E_STORE_FULL as its
 * result; the later jobs never see its writes.  The return value is the
 * outcome of the others. */
static idem_err_t run_jobs(struct rocks_store *s, struct job *jobs)
{
    rocksdb_writebatch_wi_t *wb = rocksdb_writebatch_wi_create(0, 1);
    int64_t low = INT64_MAX;
    idem_err_t err = IDEM_OK;
    uint8_t *enc = NULL; /* the encoding buffer, grown as records need */
    size_t enc_cap = 0;

    if (wb == NULL)
        return IDEM_E_NOMEM;
    for (struct job *j = jobs; j != NULL && err == IDEM_OK; j = j->next) {
        bool grew = false;
        rocksdb_writebatch_wi_set_save_point(wb);
        err = apply_ops(s, wb, j->ops, j->n, &low, &enc, &enc_cap, &grew);
        if (err != IDEM_OK || !grew || !no_room(s))
            continue;
        char *rerr = NULL;
        rocksdb_writebatch_wi_rollback_to_save_point(wb, &rerr);
        if (rerr != NULL) {
            err = fail(s, "rollback", rerr, IDEM_E_IO);
            break;
        }
        j->refused = 1;
        j->result = IDEM_E_STORE_FULL;
        snprintf(j->errstr, sizeof j->errstr,
                 "rocksdb: no room for new records: the filesystem has %llu MiB free, and "
                 "%llu MiB are kept for compaction and deletes (min_free, or 1/%d of the store)",
                 (unsigned long long)(atomic_load(&s->space_avail) >> 20),
                 (unsigned long long)(atomic_load(&s->space_reserve) >> 20), SPACE_RESERVE_DIV);
    }
    idem_free(enc);
    if (err == IDEM_OK && rocksdb_writebatch_wi_count(wb) > 0) {
        char *werr = NULL;
        if (!injected(&werr))
            rocksdb_write_writebatch_wi(s->db, s->wopts, wb, &werr);
        if (werr != NULL)
            err = fail(s, "write", werr, IDEM_E_IO);
        else if (low != INT64_MAX)
            lower_floor(s, low); /* after the write: see the file's comment */
    }
    rocksdb_writebatch_wi_destroy(wb);
    return err;
}

/* Group commit, as lmdb.c's: callers queue their batch; whoever finds no
 * leader becomes it, takes the queue (up to GROUP_MAX_OPS ops), writes it
 * as one batch with one WAL fsync, and wakes the others. */
static idem_err_t rocks_exec(idem_store_t *base, idem_op_t *ops, size_t n)
{
    struct rocks_store *s = (struct rocks_store *)base;
    struct job me = {.ops = ops, .n = n};

    pthread_mutex_lock(&s->qlock);
    *s->qtail = &me;
    s->qtail = &me.next;
    while (!me.done) {
        if (s->leading) {
            pthread_cond_wait(&s->qcond, &s->qlock);
            continue;
        }
        s->leading = 1;
        struct job *first = s->qhead, *last = first;
        size_t total = first->n;
        while (last->next != NULL && total + last->next->n <= GROUP_MAX_OPS) {
            last = last->next;
            total += last->n;
        }
        s->qhead = last->next;
        if (s->qhead == NULL)
            s->qtail = &s->qhead;
        last->next = NULL;
        pthread_mutex_unlock(&s->qlock);

        idem_err_t err = run_jobs(s, first);

        pthread_mutex_lock(&s->qlock);
        for (struct job *j = first; j != NULL; j = j->next) {
            if (!j->refused) { /* a refused job has its own result */
                j->result = err;
                if (err != IDEM_OK)
                    snprintf(j->errstr, sizeof j->errstr, "%s", idem_store_errstr(base));
            }
            j->done = 1;
        }
        s->leading = 0;
        pthread_cond_broadcast(&s->qcond);
    }
    pthread_mutex_unlock(&s->qlock);
    if (me.result != IDEM_OK)
        idem__store_seterr(base, "%s", me.errstr);
    return me.result;
}

/* ---- reads ------------------------------------------------------------------ */

static idem_err_t rocks_get(idem_store_t *base, const idem_key_id_t *id, int64_t now_ms,
                            idem_record_t *rec)
{
    struct rocks_store *s = (struct rocks_store *)base;
    char key[IDEM_STORE_KEY_MAX];
    size_t klen = idem__store_key(id, key), vlen;
    char *err = NULL;
    rocksdb_pinnableslice_t *v = NULL;

    if (!injected(&err))
        v = rocksdb_get_pinned_cf(s->db, s->ropts, s->cf_rec, key, klen, &err);
    if (err != NULL) {
        fail(s, "get", err, IDEM_E_STORE_DOWN);
        return IDEM_E_STORE_DOWN;
    }
    if (v == NULL)
        return IDEM_E_NOTFOUND;
    const char *p = rocksdb_pinnableslice_value(v, &vlen);
    idem_err_t rc = idem_record_decode((const uint8_t *)p, vlen, rec);
    rocksdb_pinnableslice_destroy(v);
    if (rc == IDEM_OK && rec->expires_at_ms <= now_ms) {
        idem_record_cleanup(rec);
        rc = IDEM_E_NOTFOUND;
    }
    return rc;
}

static idem_err_t rocks_ping(idem_store_t *base)
{
    struct rocks_store *s = (struct rocks_store *)base;
    char *err = NULL;
    rocksdb_pinnableslice_t *v = NULL;

    if (!injected(&err))
        v = rocksdb_get_pinned_cf(s->db, s->ropts, s->cf_ix, "", 0, &err);
    rocksdb_pinnableslice_destroy(v);
    if (err != NULL) {
        fail(s, "ping", err, IDEM_E_STORE_DOWN);
        return IDEM_E_STORE_DOWN;
    }
    if (s->nosync && atomic_load(&s->flusher.failed)) {
        idem__store_seterr(base, "rocksdb: the background WAL fsync failed");
        return IDEM_E_STORE_DOWN;
    }
    return IDEM_OK;
}

/* ---- listing ------------------------------------------------------------------ */

/* A listing is a range of the records family (keys sort bytewise, as scope
 * '\0' key) read through one iterator, which sees one snapshot: from the
 * filter's start or the cursor on, never past the scope and prefix. */
static idem_err_t rocks_list(idem_store_t *base, idem__list_t *l)
{
    struct rocks_store *s = (struct rocks_store *)base;
    char start[IDEM_STORE_KEY_MAX];
    bool exclusive;
    if (l->raw[0] != '\0' && !l->has_after)
        return IDEM_E_INVAL; /* not an ordered cursor */
    size_t slen = idem__store_list_start(l, start, &exclusive);
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    idem_err_t err = IDEM_OK;
    char *rerr = NULL;

    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, ro, s->cf_rec);
    if (injected(&rerr)) {
        err = fail(s, "listing", rerr, IDEM_E_STORE_DOWN);
        goto out;
    }
    if (slen > 0)
        rocksdb_iter_seek(it, start, slen);
    else
        rocksdb_iter_seek_to_first(it);
    while (rocksdb_iter_valid(it)) {
        size_t klen, vlen;
        const char *k = rocksdb_iter_key(it, &klen);
        if (exclusive && klen == l->after_len && memcmp(k, l->after, klen) == 0) {
            rocksdb_iter_next(it);
            continue;
        }
        if (!idem__store_list_in_range(l, k, klen))
            break;
        const char *v = rocksdb_iter_value(it, &vlen);
        if (idem__store_list_offer(l, k, klen, (const uint8_t *)v, vlen)) {
            char last[IDEM_STORE_KEY_MAX];
            size_t ll = klen <= sizeof last ? klen : sizeof last;
            memcpy(last, k, ll);
            rocksdb_iter_next(it);
            if (rocksdb_iter_valid(it))
                idem__store_list_resume_after(l, last, ll);
            break;
        }
        rocksdb_iter_next(it);
    }
    rocksdb_iter_get_error(it, &rerr);
    if (rerr != NULL)
        err = fail(s, "listing", rerr, IDEM_E_STORE_DOWN);
out:
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return err;
}

/* ---- the sweep -------------------------------------------------------------- */

/* Delete up to max records whose expires_at <= now_ms, oldest first, reading
 * only the expiry index and the records it names.  The check of each record
 * and its delete run as an exec does, under the leader role (qlock's
 * `leading`), so no exec can overwrite a record between the sweep's read
 * and its delete. */
static idem_err_t sweep_step(struct rocks_store *s, int64_t now_ms, size_t max, size_t *removed,
                             int *more)
{
    uint8_t lo[8], hi[8];
    int64_t floor0 = atomic_load(&s->floor), last = floor0;
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    idem_err_t err = IDEM_OK;
    size_t gone = 0, seen = 0;
    char *rerr = NULL;

    *more = 0;
    put_be64(lo, floor0);
    put_be64(hi, now_ms == INT64_MAX ? now_ms : now_ms + 1);
    rocksdb_readoptions_set_iterate_lower_bound(ro, (const char *)lo, sizeof lo);
    rocksdb_readoptions_set_iterate_upper_bound(ro, (const char *)hi, sizeof hi);
    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(s->db, ro, s->cf_ix);
    if (injected(&rerr)) {
        err = fail(s, "sweeping", rerr, IDEM_E_IO);
        goto out;
    }
    rocksdb_iter_seek(it, (const char *)lo, sizeof lo);
    while (rocksdb_iter_valid(it)) {
        if (seen == max) {
            *more = 1;
            break;
        }
        size_t ilen;
        const char *ik = rocksdb_iter_key(it, &ilen);
        if (ilen < 8 || ilen - 8 > IDEM_STORE_KEY_MAX) {
            rocksdb_writebatch_delete_cf(wb, s->cf_ix, ik, ilen); /* not ours */
            rocksdb_iter_next(it);
            continue;
        }
        int64_t ts = get_be64((const uint8_t *)ik);
        last = ts;
        seen++;
        atomic_fetch_add_explicit(&idem__store_sweep_visits, 1, memory_order_relaxed);
        rocksdb_pinnableslice_t *v = NULL;
        if (!injected(&rerr))
            v = rocksdb_get_pinned_cf(s->db, s->ropts, s->cf_rec, ik + 8, ilen - 8, &rerr);
        if (rerr != NULL) {
            err = fail(s, "sweeping", rerr, IDEM_E_IO);
            goto out;
        }
        idem_record_t head;
        size_t vlen = 0;
        const char *val = v != NULL ? rocksdb_pinnableslice_value(v, &vlen) : NULL;
        if (val != NULL && idem_record_decode_head((const uint8_t *)val, vlen, &head) == IDEM_OK &&
            head.expires_at_ms == ts) {
            rocksdb_writebatch_delete_cf(wb, s->cf_rec, ik + 8, ilen - 8);
            gone++;
        }
        rocksdb_pinnableslice_destroy(v);
        rocksdb_writebatch_delete_cf(wb, s->cf_ix, ik, ilen); /* stale or done */
        rocksdb_iter_next(it);
    }
    rocksdb_iter_get_error(it, &rerr);
    if (rerr != NULL) {
        err = fail(s, "sweeping", rerr, IDEM_E_IO);
        goto out;
    }
    if (rocksdb_writebatch_count(wb) > 0) {
        if (!injected(&rerr))
            rocksdb_write(s->db, s->wopts, wb, &rerr);
        if (rerr != NULL) {
            err = fail(s, "sweep write", rerr, IDEM_E_IO);
            goto out;
        }
    }
    /* Everything below `last` is gone now (or below now, when the index
     * ran out): raise the floor unless an exec lowered it meanwhile. */
    int64_t nf = *more ? last : (now_ms == INT64_MAX ? now_ms : now_ms + 1);
    if (nf > floor0)
        atomic_compare_exchange_strong(&s->floor, &floor0, nf);
    *removed = gone;
out:
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    rocksdb_writebatch_destroy(wb);
    return err;
}

static idem_err_t rocks_sweep(idem_store_t *base, int64_t now_ms, size_t max, size_t *removed)
{
    struct rocks_store *s = (struct rocks_store *)base;
    int more;
    idem_err_t err;

    *removed = 0;
    pthread_mutex_lock(&s->sweep_lock);
    /* Take the leader role so that no exec decides on a record between
     * the sweep's check of it and its delete. */
    pthread_mutex_lock(&s->qlock);
    while (s->leading)
        pthread_cond_wait(&s->qcond, &s->qlock);
    s->leading = 1;
    pthread_mutex_unlock(&s->qlock);

    err = sweep_step(s, now_ms, max, removed, &more);

    pthread_mutex_lock(&s->qlock);
    s->leading = 0;
    pthread_cond_broadcast(&s->qcond);
    pthread_mutex_unlock(&s->qlock);
    pthread_mutex_unlock(&s->sweep_lock);
    return err;
}

const struct idem_store_ops idem__store_rocksdb_ops = {
    .name = "rocksdb",
    .scheme = "rocksdb",
    .open = rocks_open,
    .close = rocks_close,
    .exec = rocks_exec,
    .get = rocks_get,
    .sweep = rocks_sweep,
    .ping = rocks_ping,
    .space = rocks_space,
    .list = rocks_list,
};
