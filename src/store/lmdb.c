/* src/store/lmdb.c - the embedded, durable store ("lmdb:PATH").
 *
 * An LMDB environment in directory PATH (created, mode 0700, if missing)
 * with two named databases: "records", mapping scope '\0' key to the
 * encoded record (src/core/record.c), and "expiry", the expiry index:
 * BE64(expires_at_ms, sign bit flipped) || scope '\0' key -> empty, changed
 * in the same transaction as every record write, overwrite and delete.  Every exec is one LMDB write transaction:
 * for each op it reads the current value, lets idem__store_apply decide
 * (the same code the memory store runs), and writes the new value in place
 * with MDB_RESERVE, so the claim path allocates nothing.  LMDB allows one
 * writer at a time across all threads and processes, which is what makes a
 * claim exclusive: of any number of claims of one key, in any number of
 * processes sharing PATH, the first to commit forwards and every later one
 * sees its record.
 *
 * Durability.  sync=always (default) keeps LMDB's default flags: a commit
 * returns after fsync, so a claim is durable before its request is
 * forwarded.  Concurrent requests share one fsync in two ways: a caller may
 * batch them into one exec, and concurrent exec calls on one environment
 * are group-committed here: they queue, and one of them (the leader) runs
 * the whole queue as one transaction while the others wait for its commit.
 * (Letting the next group begin while the last one synced its meta page,
 * MDB_NOMETASYNC and mdb_env_sync outside the writer lock, was measured and
 * lost: a separate fdatasync costs more than LMDB's O_DSYNC meta write;
 * docs/stores.md.)
 * sync=interval opens the environment with MDB_NOSYNC, and a flusher thread
 * calls mdb_env_sync every 100 ms and once at close: a crash of the process loses nothing, a power loss loses
 * up to the last 100 ms.  MDB_WRITEMAP is not used; docs/stores.md has the
 * measurements and the reasons (with it, a full disk kills the process with
 * SIGBUS instead of failing a commit).
 *
 * One environment per directory per process.  LMDB forbids opening the same
 * environment twice in one process (its fcntl locks are per process, so a
 * second open would re-initialise the lock file under the first).  Handles
 * opened on one directory therefore share one refcounted `struct env` from a
 * process-wide registry keyed by the directory's (device, inode); entries
 * of another pid (inherited over fork) are ignored, since a child must open
 * its own environment.  Several processes may open PATH at once: LMDB's
 * lock file coordinates them, and open runs mdb_reader_check to free the
 * reader slots of processes that died.  All sharers should use one map_size.
 *
 * Retention.  get treats a record past expires_at as absent; sweep walks
 * the expiry index from its first (oldest) entry up to now and deletes each
 * record it names, in bounded steps: records leave in expiry order and a
 * sweep never reads a live record, whatever the size of the store.  An
 * entry whose record is gone or carries another expires_at (a value that
 * did not decode when it was overwritten) is dropped alone.  A directory
 * written before the index existed gets it built once, at open.
 *
 * Headroom: a transaction that grows the store (more pages or more
 * records in the records tree) is refused as MDB_MAP_FULL while the trees hold all but 1/64 of
 * the map (at least 16 pages), or when it would leave less than min_free
 * (default 256 MiB) of room on the disk (the file's free pages plus the
 * filesystem's free bytes), so deletes and the sweep always find the
 * fresh pages LMDB's copy-on-write needs, and a full store can always give
 * space back.  In a group commit each caller's batch runs in a nested
 * transaction, and one refused so is taken out alone: the others commit.  The map defaults to the
 * filesystem's size (map_size=auto), so the disk is the limit.
 *
 * Memory: reads touch pages of the map, which count in the process's RSS
 * until it lets them go; with max_resident set, the sweep hands them back
 * above it (trim_resident).  idem_store_space reports the room left (lmdb_space).
 *
 * The data file is checked before LMDB maps it (check_data_file): LMDB
 * trusts data.mdb, and a file cut short (a bad copy, a full disk during a
 * restore) made mdb_dbi_open touch a page past its end, which kills the
 * process with SIGBUS at every start.  Open reads the two meta pages with
 * pread and refuses, with one sentence, a file that is not an LMDB
 * database or is shorter than the last page its newest meta says is used.
 *
 * Errors: MDB_MAP_FULL is IDEM_E_STORE_FULL (the transaction is aborted,
 * reads go on working); a full reader table or a panic is IDEM_E_STORE_DOWN;
 * anything else IDEM_E_IO; the LMDB text goes to idem_store_errstr.
 *
 * THREADING: the environment is opened with MDB_NOTLS, so a read-only
 * transaction belongs to no thread; get and ping may run in any number of
 * threads and never wait for the writer.  exec queues under the
 * environment's qlock and the leader takes LMDB's writer lock; sweep takes
 * it directly.  The registry has its own mutex, the sweep position another.
 */
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "idem/alloc.h"
#include "idem/units.h"
#include "store/store_impl.h"

#define AUTO_MAP_MIN (1ull << 30) /* map_size=auto never maps less */
#define MIN_MAP_SIZE (64ull << 10)
#define MAX_MAP_SIZE (1ull << 44) /* 16 TiB: beyond that, a typo */
#define MAX_READERS 512
#define FLUSH_INTERVAL_NS 100000000L
#define DB_NAME "records"
#define RESERVE_MIN_PAGES 16 /* kept free for deletes in a full map (run_jobs) */
#define DEFAULT_MIN_FREE (256ull << 20) /* room kept on the disk for deletes */
#define MAX_MIN_FREE (1ull << 44)        /* 16 TiB: beyond that, a typo */
#define DISK_CHECK_NS 100000000L    /* statvfs at most this often on the commit path */
#define DEFAULT_MAX_RESIDENT 0 /* off: see trim_resident */
#define MAX_MAX_RESIDENT (1ull << 40)
#define GROUP_MAX_OPS 10000 /* ops in one group-commit transaction, past the first batch */

/* A caller's batch waiting for the group commit (lives on its stack). */
struct job {
    struct job *next;
    idem_op_t *ops;
    size_t n;
    int done;          /* set by the leader, under qlock */
    idem_err_t result; /* the transaction's outcome */
    char errstr[200];  /* its detail, for the caller's idem_store_errstr */
};

/* One open environment, shared by every handle of its directory in this process. */
struct env {
    struct env *next; /* registry list */
    dev_t dev;
    ino_t ino;
    pid_t pid;    /* the process that opened it */
    int refs;     /* handles using it; guarded by registry_lock */
    int nosync;   /* opened with sync=interval (MDB_NOSYNC) */
    MDB_env *env;
    MDB_dbi dbi;    /* records */
    MDB_dbi ix_dbi; /* the expiry index */
    size_t map_pages;     /* the map's size in pages */
    size_t reserve_pages; /* kept free for deletes: see run_jobs */
    size_t psize;         /* LMDB's page size */
    char dir[PATH_MAX];   /* for statvfs */
    char data_path[PATH_MAX + 16]; /* dir/data.mdb */
    _Atomic int64_t disk_checked_ns; /* when disk_free was last read (monotonic) */
    _Atomic uint64_t disk_free;      /* bytes free to us on the filesystem */
    /* RSS: the map's address in this process and the resident budget */
    uintptr_t map_addr;
    size_t map_len;
    uint64_t max_resident; /* 0: never hand pages back */
    uint64_t min_free;     /* room kept on the disk: see run_jobs */
    idem__flusher_t flusher; /* nosync only */
    /* the group commit queue */
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    struct job *qhead;
    struct job **qtail;
    int leading; /* a caller is running a transaction for the queue */
};

struct lmdb_store {
    struct idem_store base; /* first: an lmdb_store is an idem_store */
    struct env *e;
    pthread_mutex_t sweep_lock; /* one sweep at a time per handle */
};

#define IX_DB_NAME "expiry"
#define IXKEY_MAX (8 + IDEM_STORE_KEY_MAX)

/* expires_at as 8 bytes that sort as the signed number does. */
static size_t ix_key(uint8_t *buf, int64_t expires_at, const void *key, size_t klen)
{
    uint64_t u = (uint64_t)expires_at ^ (1ull << 63);
    for (int i = 7; i >= 0; i--) {
        buf[i] = (uint8_t)u;
        u >>= 8;
    }
    memcpy(buf + 8, key, klen);
    return 8 + klen;
}

static int64_t ix_time(const uint8_t *p)
{
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = (u << 8) | p[i];
    return (int64_t)(u ^ (1ull << 63));
}

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct env *registry;

/* Map an LMDB code to ours, keeping the detail for idem_store_errstr. */
static idem_err_t fail(struct lmdb_store *s, const char *what, int rc)
{
    idem__store_seterr(&s->base, "lmdb %s: %s", what, mdb_strerror(rc));
    switch (rc) {
    case MDB_MAP_FULL:
    case ENOSPC:
    case EDQUOT:
        return IDEM_E_STORE_FULL;
    case MDB_READERS_FULL:
    case MDB_MAP_RESIZED:
    case MDB_PANIC:
        return IDEM_E_STORE_DOWN;
    default:
        return IDEM_E_IO;
    }
}

/* Fault injection (store_impl.h): each LMDB call that touches the map or
 * the disk may fail with EIO as a real one would.  An injected commit
 * failure frees the transaction, as a failed mdb_txn_commit does. */
#define IO(call) (idem__store_io_fault() ? EIO : (call))

static int txn_commit(MDB_txn *txn)
{
    if (idem__store_io_fault()) {
        mdb_txn_abort(txn);
        return EIO;
    }
    return mdb_txn_commit(txn);
}

static int begin(struct lmdb_store *s, unsigned flags, MDB_txn **txn)
{
    int rc = IO(mdb_txn_begin(s->e->env, NULL, flags, txn));
    if (rc == MDB_READERS_FULL) {
        /* Slots of dead processes are freed lazily; try once more after. */
        int dead = 0;
        if (mdb_reader_check(s->e->env, &dead) == 0 && dead > 0)
            rc = mdb_txn_begin(s->e->env, NULL, flags, txn);
    }
    return rc;
}

/* The flusher's call (sync=interval). */
static int env_flush(void *arg)
{
    struct env *e = arg;
    return mdb_env_sync(e->env, 1);
}

/* ---- opening ------------------------------------------------------------- */

struct opts {
    int nosync;
    uint64_t map_size; /* 0: auto, the filesystem's size */
    uint64_t max_resident;
    uint64_t min_free;
};

static idem_err_t parse_opts(const char *query, struct opts *o, char *errbuf, size_t errlen)
{
    char name[IDEM_STORE_OPT_MAX + 1], value[IDEM_STORE_OPT_MAX + 1];
    int r;

    o->nosync = 0;
    o->map_size = 0;
    o->max_resident = DEFAULT_MAX_RESIDENT;
    o->min_free = DEFAULT_MIN_FREE;
    while ((r = idem__store_next_opt(&query, name, value, errbuf, errlen)) > 0) {
        if (strcmp(name, "sync") == 0) {
            if (idem__store_sync_opt("lmdb", value, &o->nosync, errbuf, errlen) != 0)
                return IDEM_E_INVAL;
        } else if (strcmp(name, "map_size") == 0 && strcmp(value, "auto") == 0) {
            o->map_size = 0;
        } else if (strcmp(name, "min_free") == 0) {
            if (idem__store_size_opt("lmdb", name, value, 0, MAX_MIN_FREE, "from 0 to 16384GiB, e.g. 1GiB", &o->min_free, errbuf,
                                     errlen) != 0)
                return IDEM_E_INVAL;
        } else if (strcmp(name, "max_resident") == 0) {
            if (idem__store_size_opt("lmdb", name, value, 0, MAX_MAX_RESIDENT, "up to 1TiB, e.g. 128MiB (0: never)", &o->max_resident, errbuf,
                                     errlen) != 0)
                return IDEM_E_INVAL;
        } else if (strcmp(name, "map_size") == 0) {
            uint64_t size;
            if (idem_parse_size(value, &size) != IDEM_OK || size < MIN_MAP_SIZE ||
                size > MAX_MAP_SIZE) {
                idem__store_errbuf(errbuf, errlen,
                                   "lmdb store option map_size=%s: expected auto or a size "
                                   "from 64KiB to 16TiB, e.g. 1GiB",
                                   value);
                return IDEM_E_INVAL;
            }
            /* LMDB maps whole pages. */
            long page = sysconf(_SC_PAGESIZE);
            uint64_t ps = page > 0 ? (uint64_t)page : 4096u;
            o->map_size = (size + ps - 1) / ps * ps;
        } else {
            idem__store_errbuf(errbuf, errlen,
                               "unknown option \"%s\" for store lmdb: (known: sync, map_size, "
                               "max_resident, min_free)",
                               name);
            return IDEM_E_INVAL;
        }
    }
    return r < 0 ? IDEM_E_INVAL : IDEM_OK;
}

/* ---- room and memory ---------------------------------------------------- */

/* Where LMDB mapped data.mdb in this process (its public API does not
 * tell): the /proc/self/maps range of data.mdb (device and inode) that
 * holds a key LMDB returned from the map, the name of a database in the
 * main tree.  A process forked from one that had the store open also has
 * its parent's mapping of the file; the key tells the two apart.  Not
 * found (no /proc): the map is never trimmed. */
static void find_map(struct env *e)
{
    struct stat st;
    char line[PATH_MAX + 128];
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_val k, v;
    uintptr_t inside = 0;

    if (mdb_txn_begin(e->env, NULL, MDB_RDONLY, &txn) != 0)
        return;
    if (mdb_cursor_open(txn, 1 /* MAIN_DBI */, &c) == 0) {
        if (mdb_cursor_get(c, &k, &v, MDB_FIRST) == 0)
            inside = (uintptr_t)k.mv_data;
        mdb_cursor_close(c);
    }
    mdb_txn_abort(txn);
    FILE *f;
    if (inside == 0 || stat(e->data_path, &st) != 0 ||
        (f = fopen("/proc/self/maps", "re")) == NULL)
        return;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long start, end, ino;
        unsigned dmaj, dmin;
        if (sscanf(line, "%lx-%lx %*4s %*x %x:%x %lu", &start, &end, &dmaj, &dmin, &ino) == 5 &&
            ino == (unsigned long)st.st_ino && makedev(dmaj, dmin) == st.st_dev &&
            start <= inside && inside < end) {
            e->map_addr = (uintptr_t)start;
            e->map_len = (size_t)(end - start);
            break;
        }
    }
    fclose(f);
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Bytes free to this process on the store's filesystem; read with statvfs
 * at most every DISK_CHECK_NS (fresh: now), else the last figure.
 * DISK_UNKNOWN when the filesystem cannot be asked: then nothing is
 * refused for want of disk (the write itself would find out). */
#define DISK_UNKNOWN UINT64_MAX
static uint64_t disk_free(struct env *e, int fresh)
{
    int64_t now = mono_ns();
    if (fresh || now - atomic_load(&e->disk_checked_ns) >= DISK_CHECK_NS) {
        struct statvfs v;
        atomic_store(&e->disk_free, statvfs(e->dir, &v) == 0
                                        ? (uint64_t)v.f_bavail * v.f_frsize
                                        : DISK_UNKNOWN);
        atomic_store(&e->disk_checked_ns, now);
    }
    return atomic_load(&e->disk_free);
}

/* Pages in data.mdb as of the last commit (its high-water mark). */
static size_t file_pages(struct env *e)
{
    MDB_envinfo info;
    return mdb_env_info(e->env, &info) == 0 ? (size_t)info.me_last_pgno + 1 : 0;
}

/* Hand the map's pages back to the kernel when this process holds more
 * than max_resident of file pages.  Reading a random key touches a page of
 * the map, and a touched page stays in the process's RSS until the process
 * lets it go, so replays of random keys over a store of 10M records would
 * grow the RSS to the whole file (gigabytes) although the pages are the
 * kernel's page cache, shared and clean.  MADV_DONTNEED on this read-only
 * shared file mapping drops only the process's mappings: the pages stay
 * cached, the next read maps them again (a minor fault), and a reader in
 * another thread that touches one meanwhile just faults it back in.  Runs
 * from the sweep (once a second in idemd).
 *
 * Off by default: measured over 10M records at 50-70k random replays a
 * second, a budget of 128 MiB cost 20-40% of the replays and still let
 * the RSS reach 2.3 GiB between two sweeps, because each page fault maps
 * up to 16 cached neighbours (the kernel's fault-around).  It bounds the
 * RSS where reads are fewer (docs/stores.md, "Memory"). */
static void trim_resident(struct env *e)
{
    if (e->max_resident == 0 || e->map_addr == 0)
        return;
    FILE *f = fopen("/proc/self/statm", "re");
    unsigned long size, resident, shared;
    int got = f != NULL && fscanf(f, "%lu %lu %lu", &size, &resident, &shared) == 3;
    if (f != NULL)
        fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (!got || page <= 0 || (uint64_t)shared * (uint64_t)page <= e->max_resident)
        return;
    size_t len = file_pages(e) * e->psize;
    if (len == 0 || len > e->map_len)
        len = e->map_len;
    (void)madvise((void *)e->map_addr, len, MADV_DONTNEED);
}

/* Index every record of dbi in ix (a directory written before the index). */
static int build_index(MDB_txn *txn, MDB_dbi dbi, MDB_dbi ix)
{
    MDB_cursor *c;
    MDB_val k, v;
    idem_record_t head;
    uint8_t buf[IXKEY_MAX];
    int rc = mdb_cursor_open(txn, dbi, &c);

    if (rc != 0)
        return rc;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        if (k.mv_size > IDEM_STORE_KEY_MAX ||
            idem_record_decode_head(v.mv_data, v.mv_size, &head) != IDEM_OK)
            continue; /* not ours, or corrupt: a delete still removes it */
        MDB_val ik = {ix_key(buf, head.expires_at_ms, k.mv_data, k.mv_size), buf}, iv = {0, ""};
        if ((rc = mdb_put(txn, ix, &ik, &iv, 0)) != 0)
            break;
    }
    mdb_cursor_close(c);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* ---- the data file, before LMDB maps it ----------------------------------- */

/* LMDB's meta page, as mdb.c lays it out (MDB_page's header, then MDB_meta,
 * in the host's byte order and sizes): page header pgno size_t, pad u16,
 * flags u16, lower u16, upper u16; then magic u32, version u32, address
 * void *, mapsize size_t, dbs[2] (pad u32, flags u16, depth u16, five
 * size_t each), last_pg size_t, txnid size_t.  The free database's pad
 * (dbs[0]) holds the page size.  Only these fields are read here. */
#define META_MAGIC 0xBEEFC0DEu
#define META_HDR (sizeof(size_t) + 8)
#define META_MAGIC_AT META_HDR
#define META_DB_LEN (8 + 5 * sizeof(size_t))
#define META_DBS_AT (META_HDR + 8 + sizeof(void *) + sizeof(size_t))
#define META_PSIZE_AT META_DBS_AT
#define META_LAST_PG_AT (META_DBS_AT + 2 * META_DB_LEN)
#define META_TXNID_AT (META_LAST_PG_AT + sizeof(size_t))
#define META_LEN (META_TXNID_AT + sizeof(size_t))

static size_t meta_size(const uint8_t *m, size_t at)
{
    size_t v;
    memcpy(&v, m + at, sizeof v);
    return v;
}

static uint32_t meta_u32(const uint8_t *m, size_t at)
{
    uint32_t v;
    memcpy(&v, m + at, sizeof v);
    return v;
}

/* Refuse a data.mdb that LMDB would map and then fault on: one that is not
 * an LMDB database, or is shorter than the pages its newest meta uses.  A
 * missing or empty file is LMDB's to create.  @return IDEM_OK or IDEM_E_IO
 * with errbuf naming the problem and what to do. */
static idem_err_t check_data_file(const char *dir, const char *path, char *errbuf, size_t errlen)
{
    static const char fix[] = "restore it from a backup or move it away";
    uint8_t m[2][META_LEN];
    struct stat st;
    idem_err_t err = IDEM_OK;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return IDEM_OK; /* missing: LMDB creates it; unreadable: LMDB says so */
    /* The metas before the size: the file only grows while LMDB writes,
     * so a size read after a meta is at least what that meta needs. */
    ssize_t n0 = pread(fd, m[0], META_LEN, 0);
    size_t psize = n0 == (ssize_t)META_LEN ? meta_u32(m[0], META_PSIZE_AT) : 0;
    ssize_t n1 = psize >= 512 && psize <= 65536 && (psize & (psize - 1)) == 0
                     ? pread(fd, m[1], META_LEN, (off_t)psize)
                     : -1;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return IDEM_OK; /* LMDB will meet the same error and say so */
    }
    close(fd);
    uint64_t size = (uint64_t)st.st_size;

    if (size == 0)
        return IDEM_OK; /* LMDB writes a new database into an empty file */
    if (n0 != (ssize_t)META_LEN || meta_u32(m[0], META_MAGIC_AT) != META_MAGIC) {
        idem__store_errbuf(errbuf, errlen,
                           "lmdb store %s: data.mdb is not an LMDB database (%llu bytes, no "
                           "LMDB meta page at its start): %s",
                           dir, (unsigned long long)size, fix);
        return IDEM_E_IO;
    }
    if (psize == 0 || n1 < 0) {
        idem__store_errbuf(errbuf, errlen,
                           "lmdb store %s: data.mdb is not an LMDB database (its meta page "
                           "gives a page size of %zu bytes): %s",
                           dir, psize, fix);
        return IDEM_E_IO;
    }
    if (n1 != (ssize_t)META_LEN) {
        idem__store_errbuf(errbuf, errlen,
                           "lmdb store %s: data.mdb is truncated (%llu bytes, the database "
                           "needs at least %zu): %s",
                           dir, (unsigned long long)size, 2 * psize, fix);
        return IDEM_E_IO;
    }
    if (meta_u32(m[1], META_MAGIC_AT) != META_MAGIC) {
        idem__store_errbuf(errbuf, errlen,
                           "lmdb store %s: data.mdb is damaged (its second meta page, at "
                           "byte %zu, is not LMDB's): %s",
                           dir, psize, fix);
        return IDEM_E_IO;
    }
    /* LMDB uses the meta of the newer transaction. */
    const uint8_t *cur = meta_size(m[1], META_TXNID_AT) > meta_size(m[0], META_TXNID_AT)
                             ? m[1]
                             : m[0];
    size_t last_pg = meta_size(cur, META_LAST_PG_AT);
    if (last_pg >= SIZE_MAX / psize) {
        err = IDEM_E_IO;
        idem__store_errbuf(errbuf, errlen,
                           "lmdb store %s: data.mdb is damaged (its meta page says %zu pages "
                           "are used): %s",
                           dir, last_pg, fix);
    } else if (size < (uint64_t)(last_pg + 1) * psize) {
        err = IDEM_E_IO;
        idem__store_errbuf(errbuf, errlen,
                           "lmdb store %s: data.mdb is truncated (%llu bytes, the database "
                           "needs %llu): %s",
                           dir, (unsigned long long)size,
                           (unsigned long long)(last_pg + 1) * psize, fix);
    }
    return err;
}

/* Open a new environment in dir (registry_lock held). */
static idem_err_t env_create(const char *dir, const struct stat *st, const struct opts *o,
                             struct env **out, char *errbuf, size_t errlen)
{
    struct env *e = idem_calloc(1, sizeof *e);
    MDB_txn *txn = NULL;
    const char *what;
    int rc;

    if (e == NULL)
        return IDEM_E_NOMEM;
    e->dev = st->st_dev;
    e->ino = st->st_ino;
    e->pid = getpid();
    e->nosync = o->nosync;
    e->qtail = &e->qhead;

    snprintf(e->dir, sizeof e->dir, "%s", dir);
    snprintf(e->data_path, sizeof e->data_path, "%s/data.mdb", dir);
    e->max_resident = o->max_resident;
    e->min_free = o->min_free;
    /* map_size=auto: the filesystem's size, so the store grows on disk as
     * records arrive, up to what the disk holds (the file is as large as
     * what was written, never the map).  Where the address space is
     * limited (ulimit -v), the map halves until it fits. */
    uint64_t map = o->map_size;
    if (map == 0) {
        struct statvfs v;
        map = statvfs(dir, &v) == 0 ? (uint64_t)v.f_blocks * v.f_frsize : AUTO_MAP_MIN;
        map = map < AUTO_MAP_MIN ? AUTO_MAP_MIN : map > MAX_MAP_SIZE ? MAX_MAP_SIZE : map;
        map &= ~(uint64_t)(64 * 1024 - 1);
    }
    idem_err_t ferr = check_data_file(dir, e->data_path, errbuf, errlen);
    if (ferr != IDEM_OK) {
        idem_free(e);
        return ferr;
    }
    /* No MDB_WRITEMAP: see docs/stores.md (a full disk would be SIGBUS). */
    unsigned flags = MDB_NOTLS | (o->nosync ? MDB_NOSYNC : 0);
    for (;;) {
        if ((rc = mdb_env_create(&e->env)) != 0) {
            what = "mdb_env_create";
            goto fail;
        }
        if ((rc = mdb_env_set_maxreaders(e->env, MAX_READERS)) != 0 ||
            (rc = mdb_env_set_maxdbs(e->env, 3)) != 0 ||
            (rc = mdb_env_set_mapsize(e->env, (size_t)map)) != 0) {
            what = "configuring the environment";
            goto fail;
        }
        rc = IO(mdb_env_open(e->env, dir, flags, 0600));
        if (rc == ENOMEM && o->map_size == 0 && map / 2 >= AUTO_MAP_MIN) {
            mdb_env_close(e->env);
            e->env = NULL;
            map /= 2;
            continue;
        }
        if (rc != 0) {
            what = "mdb_env_open";
            goto fail;
        }
        break;
    }
    int dead = 0;
    mdb_reader_check(e->env, &dead); /* free slots of dead processes; best effort */
    if ((rc = IO(mdb_txn_begin(e->env, NULL, 0, &txn))) != 0) {
        what = "mdb_txn_begin";
        goto fail;
    }
    if ((rc = IO(mdb_dbi_open(txn, DB_NAME, MDB_CREATE, &e->dbi))) != 0) {
        mdb_txn_abort(txn);
        what = "mdb_dbi_open";
        goto fail;
    }
    rc = IO(mdb_dbi_open(txn, IX_DB_NAME, 0, &e->ix_dbi));
    if (rc == MDB_NOTFOUND) { /* a store from before the index: build it once */
        if ((rc = IO(mdb_dbi_open(txn, IX_DB_NAME, MDB_CREATE, &e->ix_dbi))) == 0)
            rc = build_index(txn, e->dbi, e->ix_dbi);
    }
    if (rc != 0) {
        mdb_txn_abort(txn);
        what = "opening the expiry index";
        goto fail;
    }
    if ((rc = txn_commit(txn)) != 0) {
        what = "creating the records database";
        goto fail;
    }
    MDB_envinfo info;
    MDB_stat est;
    e->psize = mdb_env_stat(e->env, &est) == 0 && est.ms_psize > 0 ? est.ms_psize : 4096;
    e->map_pages = (size_t)((mdb_env_info(e->env, &info) == 0 ? info.me_mapsize : map) / e->psize);
    find_map(e);
    e->reserve_pages = e->map_pages / 64 > RESERVE_MIN_PAGES ? e->map_pages / 64
                                                              : RESERVE_MIN_PAGES;
    if (o->nosync && idem__flusher_start(&e->flusher, FLUSH_INTERVAL_NS, env_flush, e) != 0) {
        idem__store_errbuf(errbuf, errlen, "lmdb store %s: cannot start the flusher thread",
                           dir);
        mdb_env_close(e->env);
        idem_free(e);
        return IDEM_E_NOMEM;
    }
    pthread_mutex_init(&e->qlock, NULL);
    pthread_cond_init(&e->qcond, NULL);
    *out = e;
    return IDEM_OK;

fail:
    idem__store_errbuf(errbuf, errlen, "lmdb store %s: %s: %s", dir, what, mdb_strerror(rc));
    if (e->env != NULL)
        mdb_env_close(e->env);
    idem_free(e);
    return rc == MDB_MAP_FULL ? IDEM_E_STORE_FULL : IDEM_E_IO;
}

static void env_release(struct env *e)
{
    pthread_mutex_lock(&registry_lock);
    if (--e->refs > 0) {
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    for (struct env **pp = &registry; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (e->nosync) {
        idem__flusher_stop(&e->flusher); /* it syncs once more on its way out */
        mdb_env_sync(e->env, 1); /* the last 100 ms, also if the flusher never ran */
    }
    mdb_env_close(e->env);
    pthread_cond_destroy(&e->qcond);
    pthread_mutex_destroy(&e->qlock);
    idem_free(e);
}

static idem_err_t lmdb_open(const char *rest, idem_store_t **out, char *errbuf, size_t errlen)
{
    const char *query;
    char dir[PATH_MAX];
    struct opts o;
    struct stat st;

    idem_err_t err = idem__store_dir("lmdb", rest, dir, sizeof dir, &query, errbuf, errlen);
    if (err != IDEM_OK)
        return err;
    err = parse_opts(query, &o, errbuf, errlen);
    if (err != IDEM_OK)
        return err;
    if (out == NULL)
        return IDEM_OK; /* idem_store_check_url: the URL is good */

    struct lmdb_store *s = idem_calloc(1, sizeof *s);
    if (s == NULL)
        return IDEM_E_NOMEM;
    s->base.ops = &idem__store_lmdb_ops;
    s->base.exec_is_cheap = o.nosync != 0; /* no fsync in the commit */
    s->base.reads_are_local = true;

    pthread_mutex_lock(&registry_lock);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        idem__store_errbuf(errbuf, errlen, "lmdb store: cannot create directory %s: %s", dir,
                           strerror(errno));
        err = IDEM_E_IO;
    } else if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        idem__store_errbuf(errbuf, errlen, "lmdb store: %s is not a directory", dir);
        err = IDEM_E_IO;
    } else {
        pid_t pid = getpid();
        struct env *e = registry;
        while (e != NULL && !(e->dev == st.st_dev && e->ino == st.st_ino && e->pid == pid))
            e = e->next;
        if (e != NULL && e->nosync != o.nosync) {
            idem__store_errbuf(errbuf, errlen,
                               "lmdb store %s is already open in this process with sync=%s",
                               dir, e->nosync ? "interval" : "always");
            err = IDEM_E_INVAL;
        } else if (e == NULL) {
            err = env_create(dir, &st, &o, &e, errbuf, errlen);
            if (err == IDEM_OK) {
                e->next = registry;
                registry = e;
            }
        }
        if (err == IDEM_OK) {
            e->refs++;
            s->e = e;
        }
    }
    pthread_mutex_unlock(&registry_lock);

    if (err != IDEM_OK) {
        idem_free(s);
        return err;
    }
    pthread_mutex_init(&s->sweep_lock, NULL);
    *out = &s->base;
    return IDEM_OK;
}

static void lmdb_close(idem_store_t *base)
{
    struct lmdb_store *s = (struct lmdb_store *)base;
    env_release(s->e);
    pthread_mutex_destroy(&s->sweep_lock);
    idem_free(s);
}

/* ---- the ops ------------------------------------------------------------- */

/* Move key's index entry from old_exp (have_old) to new_exp (have_new). */
static int reindex(MDB_txn *txn, MDB_dbi ix, const char *key, size_t klen, int have_old,
                   int64_t old_exp, int have_new, int64_t new_exp, const char **what)
{
    uint8_t buf[IXKEY_MAX];
    int rc;

    if (have_old && have_new && old_exp == new_exp)
        return 0;
    if (have_old) {
        MDB_val ik = {ix_key(buf, old_exp, key, klen), buf};
        rc = IO(mdb_del(txn, ix, &ik, NULL));
        if (rc != 0 && rc != MDB_NOTFOUND) {
            *what = "mdb_del (expiry index)";
            return rc;
        }
    }
    if (have_new) {
        MDB_val ik = {ix_key(buf, new_exp, key, klen), buf}, iv = {0, ""};
        if ((rc = IO(mdb_put(txn, ix, &ik, &iv, 0))) != 0) {
            *what = "mdb_put (expiry index)";
            return rc;
        }
    }
    return 0;
}

/* Apply one caller's ops inside txn; 0 or the LMDB code that stops the txn. */
static int apply_ops(MDB_txn *txn, MDB_dbi dbi, MDB_dbi ix, idem_op_t *ops, size_t n,
                     const char **what)
{
    char key[IDEM_STORE_KEY_MAX];
    idem_record_t next, head;
    int rc;

    for (size_t i = 0; i < n; i++) {
        idem_op_t *op = &ops[i];
        if (op->err != IDEM_OK)
            continue;
        MDB_val k = {idem__store_key(&op->id, key), key}, v;
        rc = IO(mdb_get(txn, dbi, &k, &v));
        if (rc != 0 && rc != MDB_NOTFOUND) {
            *what = "mdb_get";
            return rc;
        }
        const uint8_t *cur = rc == 0 ? v.mv_data : NULL;
        int have_old = cur != NULL && idem_record_decode_head(cur, v.mv_size, &head) == IDEM_OK;
        int64_t old_exp = have_old ? head.expires_at_ms : 0;
        switch (idem__store_apply(op, cur, rc == 0 ? v.mv_size : 0, &next)) {
        case IDEM__STORE_KEEP:
            break;
        case IDEM__STORE_PUT: {
            /* The index first: MDB_RESERVE's space is valid until the next write. */
            if ((rc = reindex(txn, ix, key, k.mv_size, have_old, old_exp, 1, next.expires_at_ms,
                              what)) != 0)
                return rc;
            MDB_val nv = {idem_record_encoded_size(&next), NULL};
            if ((rc = IO(mdb_put(txn, dbi, &k, &nv, MDB_RESERVE))) != 0) {
                *what = "mdb_put";
                return rc;
            }
            idem_record_encode_into(&next, nv.mv_data);
            break;
        }
        case IDEM__STORE_DEL:
            if ((rc = reindex(txn, ix, key, k.mv_size, have_old, old_exp, 0, 0, what)) != 0)
                return rc;
            if ((rc = IO(mdb_del(txn, dbi, &k, NULL))) != 0) {
                *what = "mdb_del";
                return rc;
            }
            break;
        }
    }
    return 0;
}

/* What the trees hold in a transaction's view. */
struct tree_size {
    size_t pages;       /* all trees (records, index, the main and free
                         * databases) and the meta pages: what the data
                         * takes, without the free list */
    size_t rec_pages;   /* the records tree alone */
    size_t rec_entries; /* records */
};

static struct tree_size tree_size(MDB_txn *txn, const struct env *e)
{
    MDB_dbi dbis[4] = {0 /* FREE_DBI */, 1 /* MAIN_DBI */, e->dbi, e->ix_dbi};
    struct tree_size t = {.pages = 2};
    for (int i = 0; i < 4; i++) {
        MDB_stat st;
        if (mdb_stat(txn, dbis[i], &st) == 0) {
            size_t n = st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages;
            t.pages += n;
            if (i == 2) {
                t.rec_pages = n;
                t.rec_entries = st.ms_entries;
            }
        }
    }
    return t;
}

static size_t used_pages(MDB_txn *txn, const struct env *e)
{
    return tree_size(txn, e).pages;
}

/* Whether a transaction that took the trees from b to a may commit, or
 * the reason it may not (MDB_MAP_FULL, *why set).
 *
 * Headroom: even a delete needs fresh pages in LMDB (copy-on-write of the
 * path to the leaf, in the records and in the index), so a map or a disk
 * filled to the last page could not free anything.  A transaction grows
 * the store when the records tree gets more pages or more records (a new
 * record that fits a page already there is still new in a store that said
 * it is full; the index follows the records, so its own page splits, say
 * from a renewal that moves an entry, do not count).  A growing one is
 * refused when the trees would leave fewer than reserve_pages of the map
 * free, or less than min_free of room on the disk: the file's free pages
 * plus the filesystem's free bytes (a write that found the disk full would
 * fail anyway, ENOSPC, but then the deletes would find no room either).
 * One that does not grow the store (deletes, releases, renewals, the sweep)
 * may use the reserve. */
static int room_refused(struct lmdb_store *s, const struct tree_size *b,
                        const struct tree_size *a, const char **why)
{
    struct env *e = s->e;
    if (a->rec_pages <= b->rec_pages && a->rec_entries <= b->rec_entries)
        return 0;
    if (a->pages + e->reserve_pages > e->map_pages) {
        *why = "keeping the reserve for deletes";
        return MDB_MAP_FULL;
    }
    size_t fp = file_pages(e);
    uint64_t in_file = fp > a->pages ? (uint64_t)(fp - a->pages) * e->psize : 0;
    uint64_t lack = (uint64_t)(a->pages > fp ? a->pages - fp : 0) * e->psize;
    uint64_t dfree = disk_free(e, 0); /* cached: a statvfs at most every 100 ms */
    if (dfree != DISK_UNKNOWN && in_file + dfree < e->min_free + lack) {
        *why = "no room left on the disk above min_free (kept for deletes)";
        return MDB_MAP_FULL;
    }
    return 0;
}

static void job_result(struct lmdb_store *s, struct job *j, idem_err_t err)
{
    j->result = err;
    if (err != IDEM_OK)
        snprintf(j->errstr, sizeof j->errstr, "%s", idem_store_errstr(&s->base));
}

/* One write transaction over every job of the list; sets each job's
 * result.  Alone, a job runs in the transaction itself.  In a group each
 * job runs in a nested transaction of its own, so that one refused for
 * want of room (room_refused) is taken out of the group alone: its
 * writes are aborted, its batch fails whole with IDEM_E_STORE_FULL (and
 * store.c resets its ops), and the jobs after it see the store as if it
 * had never run.  Any other LMDB error, or a failed commit, fails every
 * job of the transaction with the same code (an I/O error is not one
 * caller's). */
static void run_jobs(struct lmdb_store *s, struct job *jobs)
{
    MDB_txn *txn, *child;
    const char *what = "";
    int rc;
    bool group = jobs->next != NULL;

    if ((rc = begin(s, 0, &txn)) != 0)
        goto fail_all;
    for (struct job *j = jobs; j != NULL; j = j->next) {
        j->result = IDEM_OK;
        MDB_txn *t = txn;
        if (group && (rc = IO(mdb_txn_begin(s->e->env, txn, 0, &child))) != 0) {
            what = "mdb_txn_begin (nested)";
            goto abort_all;
        }
        if (group)
            t = child;
        struct tree_size b = tree_size(t, s->e);
        if ((rc = apply_ops(t, s->e->dbi, s->e->ix_dbi, j->ops, j->n, &what)) != 0) {
            if (group)
                mdb_txn_abort(child);
            goto abort_all;
        }
        struct tree_size a = tree_size(t, s->e);
        const char *why;
        if (room_refused(s, &b, &a, &why) != 0) {
            job_result(s, j, fail(s, why, MDB_MAP_FULL));
            if (!group) {
                mdb_txn_abort(txn);
                return;
            }
            mdb_txn_abort(child);
            continue;
        }
        if (group && (rc = txn_commit(child)) != 0) {
            what = "mdb_txn_commit (nested)";
            goto abort_all;
        }
    }
    if ((rc = txn_commit(txn)) != 0) {
        what = "mdb_txn_commit";
        goto fail_all;
    }
    return;

abort_all:
    mdb_txn_abort(txn);
fail_all : {
    idem_err_t err = fail(s, *what ? what : "mdb_txn_begin", rc);
    for (struct job *j = jobs; j != NULL; j = j->next)
        job_result(s, j, err);
}
}

/* Group commit: callers queue their batch; whoever finds no leader becomes
 * it, takes the queue (up to GROUP_MAX_OPS ops) and runs it as one
 * transaction, one fsync for all, then wakes the others.  Alone, a caller
 * simply leads its own batch.  A transaction that fails fails every batch in
 * it with the same code (a full map or an I/O error is not one caller's). */
static idem_err_t lmdb_exec(idem_store_t *base, idem_op_t *ops, size_t n)
{
    struct lmdb_store *s = (struct lmdb_store *)base;
    struct env *e = s->e;
    struct job me = {.ops = ops, .n = n};

    pthread_mutex_lock(&e->qlock);
    *e->qtail = &me;
    e->qtail = &me.next;
    while (!me.done) {
        if (e->leading) {
            pthread_cond_wait(&e->qcond, &e->qlock);
            continue;
        }
        e->leading = 1;
        struct job *first = e->qhead, *last = first;
        size_t total = first->n;
        while (last->next != NULL && total + last->next->n <= GROUP_MAX_OPS) {
            last = last->next;
            total += last->n;
        }
        e->qhead = last->next;
        if (e->qhead == NULL)
            e->qtail = &e->qhead;
        last->next = NULL;
        pthread_mutex_unlock(&e->qlock);

        run_jobs(s, first);

        pthread_mutex_lock(&e->qlock);
        for (struct job *j = first; j != NULL; j = j->next) {
            j->done = 1;
        }
        e->leading = 0;
        pthread_cond_broadcast(&e->qcond);
    }
    pthread_mutex_unlock(&e->qlock);
    if (me.result != IDEM_OK)
        idem__store_seterr(base, "%s", me.errstr);
    return me.result;
}

static idem_err_t lmdb_get(idem_store_t *base, const idem_key_id_t *id, int64_t now_ms,
                           idem_record_t *rec)
{
    struct lmdb_store *s = (struct lmdb_store *)base;
    char key[IDEM_STORE_KEY_MAX];
    MDB_val k = {idem__store_key(id, key), key}, v;
    MDB_txn *txn;
    idem_err_t err;
    int rc;

    if ((rc = begin(s, MDB_RDONLY, &txn)) != 0) {
        err = fail(s, "mdb_txn_begin", rc);
        return err == IDEM_E_IO ? IDEM_E_STORE_DOWN : err;
    }
    rc = IO(mdb_get(txn, s->e->dbi, &k, &v));
    if (rc == MDB_NOTFOUND) {
        err = IDEM_E_NOTFOUND;
    } else if (rc != 0) {
        fail(s, "mdb_get", rc);
        err = IDEM_E_STORE_DOWN;
    } else {
        err = idem_record_decode(v.mv_data, v.mv_size, rec);
        if (err == IDEM_OK && rec->expires_at_ms <= now_ms) {
            idem_record_cleanup(rec);
            err = IDEM_E_NOTFOUND;
        }
    }
    mdb_txn_abort(txn);
    return err;
}

/* One sweep transaction: walk the expiry index from its first entry, up
 * to max entries with expires_at <= now_ms, deleting at most max_del
 * records.  Returns the LMDB code; *removed the records deleted. */
static int sweep_once(struct lmdb_store *s, int64_t now_ms, size_t max, size_t max_del,
                      size_t *removed, const char **whatp)
{
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_val k, v, rk, rv;
    idem_record_t head;
    size_t seen = 0, gone = 0, dels = 0;
    const char *what = "mdb_cursor_open";
    int rc;

    *removed = 0;
    if ((rc = begin(s, 0, &txn)) != 0) {
        *whatp = "mdb_txn_begin";
        return rc;
    }
    if ((rc = IO(mdb_cursor_open(txn, s->e->ix_dbi, &c))) != 0)
        goto abort;
    what = "sweeping";
    rc = IO(mdb_cursor_get(c, &k, &v, MDB_FIRST));
    while (rc == 0 && seen < max && dels < max_del) {
        if (k.mv_size < 8 || k.mv_size - 8 > IDEM_STORE_KEY_MAX) {
            rc = IO(mdb_cursor_del(c, 0)); /* not an entry of ours */
        } else {
            if (ix_time(k.mv_data) > now_ms)
                break; /* the rest is live */
            seen++;
            atomic_fetch_add_explicit(&idem__store_sweep_visits, 1, memory_order_relaxed);
            rk.mv_data = (uint8_t *)k.mv_data + 8;
            rk.mv_size = k.mv_size - 8;
            rc = IO(mdb_get(txn, s->e->dbi, &rk, &rv));
            if (rc == 0 && idem_record_decode_head(rv.mv_data, rv.mv_size, &head) == IDEM_OK &&
                head.expires_at_ms == ix_time(k.mv_data)) {
                /* rk points into the index page: delete the record first. */
                if ((rc = IO(mdb_del(txn, s->e->dbi, &rk, NULL))) != 0)
                    goto abort;
                gone++;
            } else if (rc != 0 && rc != MDB_NOTFOUND) {
                goto abort;
            }
            dels++;
            rc = IO(mdb_cursor_del(c, 0));
        }
        if (rc != 0)
            goto abort;
        /* After a delete the cursor already rests on the next entry, and
         * LMDB's MDB_NEXT returns that one rather than skipping it. */
        rc = IO(mdb_cursor_get(c, &k, &v, MDB_NEXT));
    }
    if (rc != 0 && rc != MDB_NOTFOUND)
        goto abort;
    mdb_cursor_close(c);
    if (dels == 0) {
        mdb_txn_abort(txn); /* nothing written: no commit, no fsync */
    } else if ((rc = txn_commit(txn)) != 0) {
        *whatp = "mdb_txn_commit";
        return rc;
    }
    *removed = gone;
    return 0;

abort:
    mdb_txn_abort(txn); /* also closes the cursor */
    *whatp = what;
    return rc;
}

/* Even a delete needs fresh pages in LMDB (copy-on-write of the path to the
 * leaf), so in a full map one large sweep transaction fails with
 * MDB_MAP_FULL however much it would free.  Then the sweep goes on in ever
 * smaller transactions: each commit returns pages to the free list for the
 * next one, so a full store always gets its expired space back. */
static idem_err_t lmdb_sweep(idem_store_t *base, int64_t now_ms, size_t max, size_t *removed)
{
    struct lmdb_store *s = (struct lmdb_store *)base;
    static const size_t steps[] = {SIZE_MAX, 32, 4, 1};
    const char *what = "sweeping";
    size_t total = 0;
    int rc = 0;

    *removed = 0;
    pthread_mutex_lock(&s->sweep_lock);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        size_t gone = 0;
        rc = sweep_once(s, now_ms, max, steps[i], &gone, &what);
        if (rc == 0 && i > 0) {
            /* Small steps: keep going while they free something. */
            total += gone;
            while (rc == 0 && gone == steps[i] && total < max) {
                rc = sweep_once(s, now_ms, max, steps[i], &gone, &what);
                total += rc == 0 ? gone : 0;
            }
            break;
        }
        if (rc == 0) {
            total += gone;
            break;
        }
        if (rc != MDB_MAP_FULL && rc != ENOSPC && rc != EDQUOT)
            break;
    }
    pthread_mutex_unlock(&s->sweep_lock);
    trim_resident(s->e);
    *removed = total;
    return rc == 0 ? IDEM_OK : fail(s, what, rc);
}

/* A listing is a range of the records' B-tree (keys sort as scope '\0'
 * key), read in one read-only transaction: from the filter's start or the
 * cursor on, never past the scope and prefix. */
static idem_err_t lmdb_list(idem_store_t *base, idem__list_t *l)
{
    struct lmdb_store *s = (struct lmdb_store *)base;
    char start[IDEM_STORE_KEY_MAX];
    bool exclusive;
    MDB_val k = {idem__store_list_start(l, start, &exclusive), start}, v;
    MDB_txn *txn;
    MDB_cursor *c;
    idem_err_t err = IDEM_OK;
    int rc;

    if (l->raw[0] != '\0' && !l->has_after)
        return IDEM_E_INVAL; /* not an ordered cursor */
    if ((rc = begin(s, MDB_RDONLY, &txn)) != 0) {
        err = fail(s, "mdb_txn_begin", rc);
        return err == IDEM_E_IO ? IDEM_E_STORE_DOWN : err;
    }
    if ((rc = IO(mdb_cursor_open(txn, s->e->dbi, &c))) != 0) {
        mdb_txn_abort(txn);
        return fail(s, "mdb_cursor_open", rc);
    }
    rc = IO(mdb_cursor_get(c, &k, &v, k.mv_size > 0 ? MDB_SET_RANGE : MDB_FIRST));
    if (rc == 0 && exclusive && k.mv_size == l->after_len &&
        memcmp(k.mv_data, l->after, l->after_len) == 0)
        rc = IO(mdb_cursor_get(c, &k, &v, MDB_NEXT));
    while (rc == 0) {
        if (!idem__store_list_in_range(l, k.mv_data, k.mv_size))
            break;
        if (idem__store_list_offer(l, k.mv_data, k.mv_size, v.mv_data, v.mv_size)) {
            MDB_val nk, nv;
            if (IO(mdb_cursor_get(c, &nk, &nv, MDB_NEXT)) == 0)
                idem__store_list_resume_after(l, k.mv_data, k.mv_size);
            break;
        }
        rc = IO(mdb_cursor_get(c, &k, &v, MDB_NEXT));
    }
    if (rc != 0 && rc != MDB_NOTFOUND)
        err = fail(s, "listing", rc);
    mdb_cursor_close(c);
    mdb_txn_abort(txn);
    return err;
}

static idem_err_t lmdb_ping(idem_store_t *base)
{
    struct lmdb_store *s = (struct lmdb_store *)base;
    MDB_txn *txn;
    int rc = begin(s, MDB_RDONLY, &txn);

    if (rc != 0) {
        fail(s, "mdb_txn_begin", rc);
        return IDEM_E_STORE_DOWN;
    }
    mdb_txn_abort(txn);
    if (s->e->nosync && atomic_load(&s->e->flusher.failed)) {
        idem__store_seterr(base, "lmdb: the background mdb_env_sync failed");
        return IDEM_E_STORE_DOWN;
    }
    return IDEM_OK;
}

/* The room left: the smaller of what the map and what the disk allow, each
 * less its reserve for deletes; the file's free pages count on the disk's
 * side, since LMDB reuses them before it grows the file. */
static idem_err_t lmdb_space(idem_store_t *base, idem_store_space_t *out)
{
    struct lmdb_store *s = (struct lmdb_store *)base;
    struct env *e = s->e;
    struct stat st;
    MDB_txn *txn;

    if (stat(e->data_path, &st) != 0) {
        idem__store_seterr(base, "lmdb: stat %s: %s", e->data_path, strerror(errno));
        return IDEM_E_IO;
    }
    int rc = begin(s, MDB_RDONLY, &txn);
    if (rc != 0)
        return fail(s, "mdb_txn_begin", rc);
    size_t used = used_pages(txn, e);
    mdb_txn_abort(txn);
    size_t in_file = file_pages(e);
    uint64_t dfree = disk_free(e, 1);
    if (dfree == DISK_UNKNOWN) {
        idem__store_seterr(base, "lmdb: statvfs %s: %s", e->dir, strerror(errno));
        return IDEM_E_IO;
    }
    uint64_t room = (in_file > used ? (uint64_t)(in_file - used) * e->psize : 0) + dfree;
    uint64_t on_disk = room > e->min_free ? room - e->min_free : 0;
    uint64_t in_map = e->map_pages > used + e->reserve_pages
                          ? (uint64_t)(e->map_pages - used - e->reserve_pages) * e->psize
                          : 0;
    out->used_bytes = (uint64_t)st.st_blocks * 512u;
    out->free_bytes = on_disk < in_map ? on_disk : in_map;
    return IDEM_OK;
}

const struct idem_store_ops idem__store_lmdb_ops = {
    .name = "lmdb",
    .scheme = "lmdb",
    .open = lmdb_open,
    .close = lmdb_close,
    .exec = lmdb_exec,
    .get = lmdb_get,
    .sweep = lmdb_sweep,
    .ping = lmdb_ping,
    .space = lmdb_space,
    .list = lmdb_list,
};
