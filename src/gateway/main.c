/* src/gateway/main.c - idemd: the command line, start-up and shutdown.
 *
 * Configuration is layered: docs/protocol.md section 14's defaults, then the YAML file
 * (--config), then the flags.  Any problem with them is one line on stderr
 * naming it, and exit status 2.  `idemd -t` stops after that check.
 *
 * Start-up order: bind the public and the admin listening sockets (so an
 * address in use fails before anything is opened: no SO_REUSEPORT, so a
 * second idemd cannot share a port), open the store and run its self-check
 * (selfcheck.h: a store that does not claim, fence and delete as it must
 * stops idemd here, exit 2), start the writer thread, give each worker and
 * the admin thread a dup() of its socket, start the admin thread, then the
 * workers.  Handing each a listening
 * socket, not an address, leaves room for one inherited from systemd or an
 * old process later.  SIGTERM/SIGINT reverse the start: workers stop
 * accepting and finish what is in flight (their completions go through the
 * writer), then the admin thread stops, then the writer applies its last
 * batch, then the store is closed and idemd exits 0.  SIGHUP reads the
 * configuration again (reload): what can change at run time (routes and
 * policies, TTLs, scope, JWT keys, the listen_tls certificate, log format:
 * the "yes" keys of `idemd --list-config-keys`) applies to requests that
 * start after it, while those in flight finish under the configuration
 * they began with; a changed key that needs a restart is logged and kept;
 * a file that does not load keeps the running configuration, with one
 * line in the log.  A thread
 * that does not start (idem__thread_create, thread.h) is one line naming it
 * and exit 2, after the threads that did start are stopped and joined.
 *
 * THREADING: the main thread only waits for signals; see gateway.h.
 */
#include <errno.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "gateway/conn.h"
#include "gateway/gateway.h"
#include "gateway/log.h"
#include "gateway/otlp.h"
#include "gateway/selfcheck.h"
#include "gateway/takeover.h"
#include "gateway/thread.h"
#include "core/jwt.h"
#include "core/tls.h"
#include "gateway/worker.h"
#include "idem/clock.h"
#include "idem/units.h"
#include "idem/version.h"

/* The TLS listener's ALPN names with http2 on, in our order of preference. */
static const char *const h2_alpn[] = {"h2", "http/1.1", NULL};

static void usage(FILE *f)
{
    fputs("usage: idemd [--config FILE] [--listen ADDR:PORT] [--upstream URL] [--store URL]\n"
          "             [--admin ADDR:PORT] [--workers N] [--log-format json|text]\n"
          "             [--takeover] [-t] [--list-config-keys] [--version] [--help]\n"
          "\n"
          "An idempotency gateway: a reverse proxy that runs each keyed POST/PATCH once\n"
          "and answers every repeat with the first answer (Idempotency-Key).\n"
          "\n"
          "  --config FILE       YAML configuration (docs/configuration.md)\n"
          "  --listen ADDR:PORT  public listener (default 127.0.0.1:8080)\n"
          "  --upstream URL      http://HOST:PORT or https://HOST:PORT of the service\n"
          "                      (default http://127.0.0.1:9000; TLS: upstream_tls in the config)\n"
          "  --store URL         lmdb:PATH[?sync=always|interval&map_size=auto|SIZE],\n"
          "                      rocksdb:PATH[?sync=always|interval],\n"
          "                      redis://[user:pass@]host:port[/db][?prefix=P&wait=N],\n"
          "                      redis+sentinel://host:port[,host:port]/master[/db],\n"
          "                      redis+cluster://host:port[,host:port...][?prefix=P&wait=N],\n"
          "                      rediss://..., rediss+sentinel://..., rediss+cluster://...\n"
          "                      (TLS: ?ca=&cert=&key=&sni=&verify=),\n"
          "                      postgres://user@host:port/db[?table=T], or memory:\n"
          "                      (default lmdb:./idem-data)\n"
          "  --admin ADDR:PORT   admin listener: /healthz /readyz /metrics /keys (default 127.0.0.1:8081)\n"
          "                      (a TLS public listener: listen_tls in the config; SIGHUP re-reads\n"
          "                      its certificate and key)\n"
          "  --workers N|auto    worker threads (default auto: one per CPU idemd may use)\n"
          "  --log-format F      json or text (default text)\n"
          "  --takeover          take the listening sockets over from the idemd running\n"
          "                      on the same addresses (docs/operations.md); it serves on\n"
          "                      until SIGTERM drains it\n"
          "  -t                  check the configuration and exit (0 good, 2 bad)\n"
          "  --list-config-keys  print every configuration key: name, what SIGHUP does\n"
          "                      (yes, restart, partly), default, what it is for\n"
          "  --version           print the version\n",
          f);
}

/* The CPUs a cgroup v2 quota (cpu.max "QUOTA PERIOD") lets idemd use,
 * rounded up, or 0 when there is none or it cannot be read.  The file of
 * idemd's own cgroup (/proc/self/cgroup "0::PATH"), else the root's (what a
 * container sees as its own). */
static long cgroup_cpus(void)
{
    char line[512], path[600];
    path[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (f != NULL) {
        while (fgets(line, sizeof line, f) != NULL)
            if (strncmp(line, "0::", 3) == 0) {
                line[strcspn(line, "\n")] = '\0';
                snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max",
                         strcmp(line + 3, "/") == 0 ? "" : line + 3);
            }
        fclose(f);
    }
    f = path[0] != '\0' ? fopen(path, "re") : NULL;
    if (f == NULL)
        f = fopen("/sys/fs/cgroup/cpu.max", "re");
    if (f == NULL)
        return 0;
    long long quota = 0, period = 0;
    int n = fscanf(f, "%lld %lld", &quota, &period);
    fclose(f);
    if (n != 2 || quota <= 0 || period <= 0)
        return 0; /* "max": no quota */
    return (long)((quota + period - 1) / period);
}

/* `workers: auto` (the default): one worker per CPU idemd may run on, as
 * nginx's worker_processes auto: the CPUs of its affinity mask (taskset,
 * cpusets), else the CPUs online, lowered to a cgroup's CPU quota (a
 * container given 2 CPUs of 64), at least 1 and at most 64. */
static int auto_workers(void)
{
    long n = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    long q = cgroup_cpus();
    if (q > 0 && q < n)
        n = q;
    return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

static int fail(const char *msg)
{
    fprintf(stderr, "idemd: %s\n", msg);
    return 2;
}

/* The value of a flag given as "--flag value" or "--flag=value". */
static const char *flag_value(int argc, char **argv, int *i, const char *name, bool *matched)
{
    size_t n = strlen(name);
    *matched = false;
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=') {
        *matched = true;
        return argv[*i] + n + 1;
    }
    if (argv[*i][n] != '\0')
        return NULL;
    *matched = true;
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

typedef struct {
    const char *config, *listen, *upstream, *store, *admin, *workers, *log_format;
    bool test, version, help, takeover, list_keys;
} args_t;

static int parse_args(int argc, char **argv, args_t *a, char *err, size_t errlen)
{
    static const char *const names[] = {"--config", "--listen", "--upstream", "--store",
                                        "--admin", "--workers", "--log-format"};
    memset(a, 0, sizeof *a);
    const char **slots[] = {&a->config, &a->listen, &a->upstream, &a->store,
                            &a->admin, &a->workers, &a->log_format};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--test") == 0) {
            a->test = true;
            continue;
        }
        if (strcmp(argv[i], "--takeover") == 0) {
            a->takeover = true;
            continue;
        }
        if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            a->version = true;
            continue;
        }
        if (strcmp(argv[i], "--list-config-keys") == 0) {
            a->list_keys = true;
            continue;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            a->help = true;
            continue;
        }
        bool done = false;
        for (size_t k = 0; k < sizeof names / sizeof names[0] && !done; k++) {
            bool matched;
            const char *v = flag_value(argc, argv, &i, names[k], &matched);
            if (!matched)
                continue;
            if (!v) {
                snprintf(err, errlen, "%s: needs a value", names[k]);
                return -1;
            }
            *slots[k] = v;
            done = true;
        }
        if (!done) {
            snprintf(err, errlen, "unknown argument '%s' (see --help)", argv[i]);
            return -1;
        }
    }
    return 0;
}

static int apply_flags(idem_config_t *cfg, const args_t *a, char *err, size_t errlen)
{
    if ((a->listen && idem__config_set_string(&cfg->listen, a->listen)) ||
        (a->upstream && idem__config_set_string(&cfg->upstream, a->upstream)) ||
        (a->store && idem__config_set_string(&cfg->store, a->store)) ||
        (a->admin && idem__config_set_string(&cfg->admin, a->admin))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (a->workers && strcmp(a->workers, "auto") == 0) {
        cfg->workers = IDEM_WORKERS_AUTO;
    } else if (a->workers) {
        char *end;
        errno = 0;
        long n = strtol(a->workers, &end, 10);
        if (errno || *end || end == a->workers || n < 1 || n > 64) {
            snprintf(err, errlen, "--workers: must be auto or a whole number from 1 to 64: '%s'",
                     a->workers);
            return -1;
        }
        cfg->workers = (int)n;
    }
    if (a->log_format) {
        if (strcmp(a->log_format, "json") != 0 && strcmp(a->log_format, "text") != 0) {
            snprintf(err, errlen, "--log-format: must be json or text: '%s'", a->log_format);
            return -1;
        }
        if (idem__config_set_string(&cfg->log_format, a->log_format)) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

/* SIGHUP: read the configuration again (defaults, the file, the flags, as
 * at the start) and make it the one new requests start with, with the JWT
 * keys and the listen_tls certificate it names read again too.  Keys only
 * a restart changes keep their running values, named in one line.  A file
 * that does not load, or keys or a certificate that do not, leave
 * everything as it was, with one line in the log. */
static void reload(idem_gw_t *gw, const args_t *a, uint64_t loaded_max_connections)
{
    char err[1024], changed[512] = "";
    const char *kept = "the running configuration is kept";
    idem__jwt_keys_t *keys = NULL;
    idem_tls_ctx_t *fresh = NULL;
    idem_config_t *next = idem__config_new();
    if (next == NULL) {
        snprintf(err, sizeof err, "out of memory");
        goto bad;
    }
    if ((a->config && idem__config_load_file(next, a->config, err, sizeof err) != 0) ||
        apply_flags(next, a, err, sizeof err) != 0)
        goto bad;
    if (next->max_connections == loaded_max_connections)
        next->max_connections = gw->cfg->max_connections;
    if (next->workers == IDEM_WORKERS_AUTO) /* as at the start: a number */
        next->workers = auto_workers();
    if (idem__config_keep_restart_keys(next, gw->cfg, changed, sizeof changed) != 0) {
        snprintf(err, sizeof err, "out of memory");
        goto bad;
    }
    if (idem__config_validate(next, err, sizeof err) != 0)
        goto bad;
    if (next->jwt_keys != NULL || next->jwt_secret_file != NULL) {
        char jerr[700];
        if (idem__jwt_keys_load(next->jwt_keys, next->jwt_secret_file, &keys, jerr,
                                sizeof jerr) != IDEM_OK) {
            snprintf(err, sizeof err, "%s", jerr);
            kept = "the running JWT keys are kept, and the running configuration";
            goto bad;
        }
    }
    if (gw->has_tls_listener) {
        /* New connections get the new certificate; open ones keep theirs. */
        idem_tls_server_opts_t topts = {
            .name = "listen_tls",
            .cert_file = next->listen_tls_cert_file,
            .key_file = next->listen_tls_key_file,
            .client_ca_file = next->listen_tls_client_ca_file,
            .alpn = next->http2 ? h2_alpn : NULL,
        };
        if (idem__tls_server_ctx_create(&topts, &fresh, err, sizeof err) != 0) {
            kept = "the running certificate is kept, and the running configuration";
            goto bad;
        }
    }
    /* The set of JWT keys replaced is kept until exit (gateway.h says why). */
    idem__jwt_keys_t **r = realloc(gw->jwt_retired, (gw->n_jwt_retired + 1) * sizeof *r);
    if (r == NULL) {
        snprintf(err, sizeof err, "out of memory");
        goto bad;
    }
    gw->jwt_retired = r;

    /* Everything loaded: now it all goes in. */
    if (changed[0] != '\0')
        idem__log(gw, "warn",
                  "SIGHUP: %s changed in the configuration: needs a restart; the running "
                  "value is kept",
                  changed);
    r[gw->n_jwt_retired] = atomic_exchange_explicit(&gw->jwt_keys, keys, memory_order_acq_rel);
    if (r[gw->n_jwt_retired] != NULL)
        gw->n_jwt_retired++;
    if (fresh != NULL)
        idem__tls_server_swap(&gw->tls_server, fresh);
    atomic_store(&gw->log_json, strcmp(next->log_format, "json") == 0);
    size_t n_routes = next->n_routes;
    pthread_mutex_lock(&gw->live_mu);
    const idem_config_t *old = gw->live;
    gw->live = next;
    atomic_fetch_add_explicit(&gw->live_gen, 1, memory_order_release);
    pthread_mutex_unlock(&gw->live_mu);
    idem__config_unref(old); /* freed when the last request holding it ends */
    if (fresh != NULL)
        idem__log(gw, "info", "SIGHUP: listen_tls certificate and key read again");
    if (keys != NULL)
        idem__log(gw, "info", "SIGHUP: JWT keys read again (%zu key(s))",
                  idem__jwt_keys_count(keys));
    idem__log(gw, "info", "SIGHUP: configuration read again (%zu route(s)); new requests use it",
              n_routes);
    return;
bad:
    idem__jwt_keys_unref(keys);
    idem__tls_ctx_unref(fresh);
    idem__config_unref(next);
    idem__log(gw, "error", "SIGHUP: %s; %s", err, kept);
}

/* Resolve the upstream URL (validated as http://host:port) once. */
static int resolve_upstream(idem_gw_t *gw, char *err, size_t errlen)
{
    char host[256];
    int port;
    bool tls = false;
    if (idem__config_parse_upstream_url(gw->cfg->upstream, host, sizeof host, &port, &tls) != 0) {
        snprintf(err, errlen, "--upstream: not http://HOST:PORT or https://HOST:PORT: '%s'",
                 gw->cfg->upstream);
        return -1;
    }
    gw->upstream_tls = tls;
    snprintf(gw->upstream_host, sizeof gw->upstream_host, "%s", host);
    snprintf(gw->upstream_hostport, sizeof gw->upstream_hostport,
             strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "--upstream: cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    /* A name like localhost may give ::1 first; services on loopback
     * listen on 127.0.0.1 far more often, so IPv4 goes first. */
    const struct addrinfo *pick = res;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next)
        if (ai->ai_family == AF_INET) {
            pick = ai;
            break;
        }
    memcpy(&gw->upstream_addr, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* Descriptors idemd may need with mc client connections: each connection
 * and the upstream connection of its request, the idle upstream pool of the
 * other workers (a worker takes from its own pool before it connects anew),
 * the admin listener's connections, and a reserve for listeners, loops,
 * the store and the log. */
static uint64_t fds_needed(uint64_t mc, int workers)
{
    uint64_t pool = mc < IDEM_UP_IDLE_MAX ? mc : IDEM_UP_IDLE_MAX;
    return 2 * mc + pool * (uint64_t)(workers - 1) + IDEM_ADMIN_MAX_CONNS + 64 +
           8 * (uint64_t)workers;
}

/* Make room for max_connections in RLIMIT_NOFILE (docs/protocol.md section
 * 11): raise the soft limit as far as needed (never past the hard one).
 * When the hard limit is too low, a max_connections written in the
 * configuration is an error (exit 2); the default is lowered to fit, with a
 * warning, so that idemd starts in a plain shell (hard limit 4096) and still
 * cannot run out of descriptors.  The warning goes to warn (else ""), for
 * the caller to log once the listeners are bound: a start that fails says
 * one line only.  @return 0, or -1 with err set. */
static int fit_open_files(idem_gw_t *gw, char *err, size_t errlen, char *warn, size_t warnlen)
{
    warn[0] = '\0';
    idem_config_t *cfg = gw->cfg;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        snprintf(err, errlen, "cannot read the open-files limit: %s", strerror(errno));
        return -1;
    }
    uint64_t need = fds_needed(cfg->max_connections, cfg->workers);
    if (rl.rlim_max != RLIM_INFINITY && need > (uint64_t)rl.rlim_max) {
        uint64_t hard = (uint64_t)rl.rlim_max;
        if (cfg->max_connections_set) {
            snprintf(err, errlen,
                     "max_connections: %llu connections need %llu open files, but the hard "
                     "limit is %llu (raise it: ulimit -Hn, LimitNOFILE=)",
                     (unsigned long long)cfg->max_connections, (unsigned long long)need,
                     (unsigned long long)hard);
            return -1;
        }
        uint64_t lo = 0, hi = cfg->max_connections;
        while (lo < hi) { /* the largest count that fits */
            uint64_t mid = lo + (hi - lo + 1) / 2;
            if (fds_needed(mid, cfg->workers) <= hard)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (lo == 0) {
            snprintf(err, errlen, "the open-files hard limit (%llu) is too low to run idemd",
                     (unsigned long long)hard);
            return -1;
        }
        snprintf(warn, warnlen,
                 "max_connections lowered from %llu to %llu to fit the open-files hard limit "
                 "%llu (raise it, or set max_connections)",
                 (unsigned long long)cfg->max_connections, (unsigned long long)lo,
                 (unsigned long long)hard);
        cfg->max_connections = lo;
        need = fds_needed(lo, cfg->workers);
    }
    if (rl.rlim_cur != RLIM_INFINITY && (uint64_t)rl.rlim_cur < need) {
        rl.rlim_cur = (rlim_t)need;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            snprintf(err, errlen, "cannot raise the open-files limit to %llu: %s",
                     (unsigned long long)need, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* otlp_endpoint is set: the span exporter (otlp.h), its thread running
 * before the workers that feed it start.  @return 0, or -1 with err. */
static int start_otlp(idem_gw_t *gw, char *err, size_t errlen)
{
    const idem_config_t *cfg = gw->cfg;
    char url[1100];
    if (idem__otlp_traces_url(cfg->otlp_endpoint, url, sizeof url) != 0) {
        snprintf(err, errlen, "otlp_endpoint: too long");
        return -1;
    }
    idem_otlp_opts_t o = {
        .url = url,
        .service_name = cfg->otlp_service_name,
        .queue_spans = (size_t)cfg->otlp_queue_spans,
        .timeout_ms = cfg->otlp_timeout_ms,
    };
    idem_err_t rc = idem__otlp_create(&o, &gw->metrics, &gw->otlp);
    if (rc != IDEM_OK) {
        snprintf(err, errlen, "otlp_endpoint: cannot start the span exporter: %s",
                 idem_strerror(rc));
        return -1;
    }
    if (idem__otlp_start(gw->otlp) != 0) {
        snprintf(err, errlen, "cannot start the otlp exporter thread: %s", strerror(errno));
        idem__otlp_destroy(gw->otlp);
        gw->otlp = NULL;
        return -1;
    }
    idem__log(gw, "info", "traces: spans to %s (service %s, sample ratio %g)", url,
              cfg->otlp_service_name, cfg->otlp_sample_ratio);
    return 0;
}

int main(int argc, char **argv)
{
    char err[1024];
    args_t a;
    if (parse_args(argc, argv, &a, err, sizeof err) != 0)
        return fail(err);
    if (a.help) {
        usage(stdout);
        return 0;
    }
    if (a.version) {
        printf("idemd %s\n", IDEM_VERSION_STRING);
        return 0;
    }
    if (a.list_keys) {
        idem__config_list_keys(stdout);
        return 0;
    }
    /* The configuration is shared (config.h): the start's is gw.cfg and the
     * first live one; SIGHUP publishes the next ones (reload). */
    idem_config_t *cfg = idem__config_new();
    if (cfg == NULL)
        return fail("out of memory");
    if (a.config && idem__config_load_file(cfg, a.config, err, sizeof err) != 0) {
        idem__config_unref(cfg);
        return fail(err);
    }
    if (apply_flags(cfg, &a, err, sizeof err) != 0 ||
        idem__config_validate(cfg, err, sizeof err) != 0) {
        idem__config_unref(cfg);
        return fail(err);
    }
    bool workers_auto = cfg->workers == IDEM_WORKERS_AUTO;
    if (workers_auto)
        cfg->workers = auto_workers();
    static idem_gw_t gw;
    gw.cfg = cfg;
    pthread_mutex_init(&gw.live_mu, NULL);
    /* The admin token is read now, so that a file that does not do stops
     * idemd here with one line (exit 2), `-t` included. */
    if (cfg->admin_token_file != NULL) {
        if (idem__admin_token_load(cfg->admin_token_file, gw.admin_token_sha256, err,
                                   sizeof err) != 0) {
            idem__config_unref(cfg);
            return fail(err);
        }
        gw.admin_token_set = true;
    }
    gw.log_json = strcmp(cfg->log_format, "json") == 0;
    if (resolve_upstream(&gw, err, sizeof err) != 0) {
        idem__config_unref(cfg);
        return fail(err);
    }
    if (gw.upstream_tls) {
        /* One client context for every worker (SPEC section 16); `-t`
         * checks its files too. */
        const idem_tls_client_opts_t topts = {
            .name = "upstream_tls",
            .ca_file = cfg->upstream_tls_ca_file,
            .cert_file = cfg->upstream_tls_cert_file,
            .key_file = cfg->upstream_tls_key_file,
            .no_verify = !cfg->upstream_tls_verify,
        };
        if (idem__tls_client_ctx_create(&topts, &gw.upstream_tls_ctx, err, sizeof err) != 0) {
            idem__config_unref(cfg);
            return fail(err);
        }
    }
    if (idem_store_check_url(cfg->store, err, sizeof err) != IDEM_OK) {
        char msg[1200];
        snprintf(msg, sizeof msg, "store: %s", err);
        idem__tls_ctx_unref(gw.upstream_tls_ctx);
        idem__config_unref(cfg);
        return fail(msg);
    }
    char nofile_warning[256];
    /* max_connections as read, before fit_open_files may lower it: a
     * SIGHUP that reads the same value changed nothing. */
    uint64_t loaded_max_connections = cfg->max_connections;
    if (fit_open_files(&gw, err, sizeof err, nofile_warning, sizeof nofile_warning) != 0) {
        idem__tls_ctx_unref(gw.upstream_tls_ctx);
        idem__config_unref(cfg);
        return fail(err);
    }
    /* The JWT keys are read now, so a file that does not load stops idemd
     * here with one line (exit 2), as a TLS certificate does. */
    if (cfg->jwt_keys != NULL || cfg->jwt_secret_file != NULL) {
        idem__jwt_keys_t *keys = NULL;
        char jerr[700];
        if (idem__jwt_keys_load(cfg->jwt_keys, cfg->jwt_secret_file, &keys, jerr, sizeof jerr) !=
            IDEM_OK) {
            char msg[800];
            snprintf(msg, sizeof msg, "%s: %s",
                     cfg->jwt_keys != NULL && strstr(jerr, cfg->jwt_keys) == jerr ? "jwt_keys"
                                                                                : "jwt_secret_file",
                     jerr);
            idem__tls_ctx_unref(gw.upstream_tls_ctx);
            idem__config_unref(cfg);
            return fail(msg);
        }
        atomic_store_explicit(&gw.jwt_keys, keys, memory_order_release);
    }
    if (a.test) {
        idem__jwt_keys_unref(atomic_exchange(&gw.jwt_keys, NULL));
        printf("idemd: configuration OK\n");
        idem__tls_ctx_unref(gw.upstream_tls_ctx);
        idem__config_unref(cfg);
        return 0;
    }

    /* Signals are taken by sigwait in this thread only.  SIGHUP too: it
     * reads the TLS and JWT key files again, never the default death. */
    signal(SIGPIPE, SIG_IGN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    /* Both addresses are bound before anything is opened: a second idemd
     * on an address in use stops here (EADDRINUSE, exit 2).  Sockets
     * systemd passed (LISTEN_FDS) or, with --takeover, the running idemd's
     * are used instead of new ones (takeover.h).  The workers and the
     * admin thread each watch a dup() of these sockets, so these
     * descriptors are closed once they have started. */
    static idem_takeover_t tk;
    idem__takeover_init(&tk, cfg->listen, cfg->admin, cfg->listen_tls_address);
    /* From here a start that fails goes to start_failed with why, which
     * stops and frees whatever these say was started. */
    int listen_fd = -1, admin_fd = -1, tls_fd = -1;
    int inited = 0, started = 0, rc = 0;
    idem_admin_t *admin = NULL;
    const char *why = err;
    char msg[1200];
    if (idem__takeover_inherit(&tk, a.takeover, err, sizeof err) == 0)
        listen_fd = idem__takeover_listener(&tk, IDEM_TK_PUBLIC, IDEM_LISTEN_BACKLOG, "--listen",
                                            err, sizeof err);
    if (listen_fd >= 0)
        admin_fd = idem__takeover_listener(&tk, IDEM_TK_ADMIN, IDEM_ADMIN_BACKLOG, "--admin",
                                           err, sizeof err);
    if (admin_fd < 0)
        goto start_failed;
    /* listen_tls: a third socket, and its certificate loaded now, so that
     * a file that does not load stops idemd here with one line. */
    if (cfg->listen_tls_address != NULL) {
        tls_fd = idem__takeover_listener(&tk, IDEM_TK_TLS, IDEM_LISTEN_BACKLOG,
                                         "listen_tls.address", err, sizeof err);
        idem_tls_server_opts_t topts = {
            .name = "listen_tls",
            .cert_file = cfg->listen_tls_cert_file,
            .key_file = cfg->listen_tls_key_file,
            .client_ca_file = cfg->listen_tls_client_ca_file,
            .alpn = cfg->http2 ? h2_alpn : NULL,
        };
        if (tls_fd < 0 || idem__tls_server_init(&gw.tls_server, &topts, err, sizeof err) != 0)
            goto start_failed;
        gw.has_tls_listener = true;
    }

    idem_err_t serr = idem_store_open(cfg->store, &gw.store, err, sizeof err);
    /* Taken over from a running idemd whose store admits one process
     * (rocksdb:): the sockets queue connections until it has drained and
     * exited, then the store opens here (docs/operations.md). */
    if (serr != IDEM_OK && tk.old_pid > 0) {
        idem__log(&gw, "info", "--store: %s; waiting for idemd pid %ld, which has it open, to exit",
                  err[0] ? err : idem_strerror(serr), (long)tk.old_pid);
        if (idem__takeover_wait_old(&tk))
            serr = idem_store_open(cfg->store, &gw.store, err, sizeof err);
    }
    if (serr != IDEM_OK) {
        snprintf(msg, sizeof msg, "--store: %s", err[0] ? err : idem_strerror(serr));
        why = msg;
        goto start_failed;
    }
    /* The store proves it claims, fences and deletes (selfcheck.h) before
     * any thread serves: /readyz cannot answer until the admin thread starts. */
    int checked = idem__selfcheck_run(gw.store, idem_clock_now(NULL), err, sizeof err);
    if (checked > 0)
        idem__log(&gw, "warn", "%s", err); /* a full store: it starts as before */
    if (checked < 0)
        goto start_failed;
    if (cfg->local_cache > 0) {
        gw.cache = idem__cache_create((size_t)cfg->local_cache, IDEM_CACHE_MAX_BYTES);
        if (gw.cache == NULL) {
            why = "local_cache: out of memory";
            goto start_failed;
        }
    }
    if (cfg->scope_rate_limit.count > 0) {
        gw.ratelimit = idem__ratelimit_create(cfg->scope_rate_limit, IDEM_RATELIMIT_MAX_SCOPES);
        if (gw.ratelimit == NULL) {
            why = "scope_rate_limit: out of memory";
            goto start_failed;
        }
    }
    bool addr_oom;
    gw.addrlimit = idem__addrlimit_create(cfg->max_connections_per_address, &addr_oom);
    if (addr_oom) {
        why = "max_connections_per_address: out of memory";
        goto start_failed;
    }
    if (cfg->otlp_endpoint != NULL && start_otlp(&gw, err, sizeof err) != 0)
        goto start_failed;
    if (idem__writer_start(&gw.writer, gw.store, &gw.metrics, &gw, err, sizeof err) != 0)
        goto start_failed;
    gw.live = idem__config_ref(cfg); /* what the first requests start with */
    gw.nworkers = cfg->workers;
    atomic_store(&gw.metrics.workers, (uint32_t)cfg->workers);
    gw.workers = calloc((size_t)gw.nworkers, sizeof *gw.workers);
    if (gw.workers == NULL) {
        snprintf(err, sizeof err, "out of memory");
        rc = -1;
    }
    for (int i = 0; i < gw.nworkers && rc == 0; i++) {
        rc = idem__worker_init(&gw.workers[i], &gw, i, listen_fd, tls_fd, err, sizeof err);
        inited = i + 1;
    }
    /* Before the admin listener answers: whoever sees /healthz answer can
     * read the warning already. */
    if (rc == 0 && nofile_warning[0] != '\0')
        idem__log(&gw, "warn", "%s", nofile_warning);
    if (rc != 0)
        goto start_failed;
    /* The workers first, the admin thread last: once /healthz answers,
     * every thread of idemd runs. */
    for (; started < gw.nworkers; started++) {
        int trc = idem__thread_create(&gw.workers[started].thread, "worker", idem__worker_main,
                                      &gw.workers[started]);
        if (trc != 0) {
            snprintf(err, sizeof err, "cannot start worker thread %d: %s", started,
                     strerror(trc));
            rc = -1;
            break;
        }
    }
    /* local_cache hears other instances' deletes (invalidate.c). */
    if (rc == 0 && idem__inval_start(&gw, err, sizeof err) < 0)
        rc = -1;
    if (rc == 0)
        rc = idem__admin_start(&gw, admin_fd, &admin, err, sizeof err);
    if (rc == 0) {
        /* Serving: a later idemd --takeover may have these sockets. */
        const int tk_fds[IDEM_TK_N] = {listen_fd, admin_fd, tls_fd};
        rc = idem__takeover_serve(&tk, &gw, tk_fds, err, sizeof err);
    }
    if (rc != 0)
        goto start_failed;
    close(listen_fd);
    close(admin_fd);
    if (tls_fd >= 0)
        close(tls_fd);
    idem__log(&gw, "info",
              "listening on %s%s%s, upstream %s, store %s, admin %s%s, %d worker(s)%s",
              cfg->listen, cfg->listen_tls_address ? " and TLS on " : "",
              cfg->listen_tls_address ? cfg->listen_tls_address : "", cfg->upstream, cfg->store,
              cfg->admin, gw.admin_token_set ? " (token required)" : "", cfg->workers,
              workers_auto ? " (auto: one per CPU)" : "");
    if (tk.from[0] != '\0')
        idem__log(&gw, "info", "listening sockets inherited from %s", tk.from);
    if (tk.note[0] != '\0')
        idem__log(&gw, "info", "%s", tk.note);

    int sig = 0;
    for (;;) {
        sigwait(&sigs, &sig);
        if (sig != SIGHUP)
            break;
        reload(&gw, &a, loaded_max_connections);
    }
    idem__log(&gw, "info", "%s: finishing requests in flight",
              sig == SIGTERM ? "SIGTERM" : "SIGINT");
    /* No takeover of a process that is closing its listeners. */
    idem__takeover_stop(&tk);
    atomic_store(&gw.stopping, true);
    for (int i = 0; i < gw.nworkers; i++)
        idem__worker_request_stop(&gw.workers[i]);
    for (int i = 0; i < gw.nworkers; i++)
        pthread_join(gw.workers[i].thread, NULL);
    idem__admin_stop(admin);
    idem__inval_stop(&gw); /* no callback touches the cache after this */
    /* The writer goes before the loops are torn down: a job it still hands
     * back (a forced shutdown) must find its worker's async handle. */
    idem__writer_stop(&gw.writer);
    for (int i = 0; i < gw.nworkers; i++)
        idem__worker_cleanup(&gw.workers[i]);
    /* Every request has ended: the spans they queued go out now (a second
     * at most), then the exporter stops. */
    idem__otlp_destroy(gw.otlp);
    idem__ratelimit_destroy(gw.ratelimit);
    idem__addrlimit_destroy(gw.addrlimit);
    idem__cache_destroy(gw.cache);
    idem_store_close(gw.store);
    free(gw.workers);
    if (gw.has_tls_listener)
        idem__tls_server_cleanup(&gw.tls_server);
    idem__jwt_keys_unref(atomic_exchange(&gw.jwt_keys, NULL));
    for (size_t i = 0; i < gw.n_jwt_retired; i++)
        idem__jwt_keys_unref(gw.jwt_retired[i]);
    free(gw.jwt_retired);
    idem__log(&gw, "info", "stopped");
    idem__config_unref(gw.live);
    idem__tls_ctx_unref(gw.upstream_tls_ctx);
    idem__config_unref(cfg);
    return 0;

start_failed:
    /* Stop what did start, in the shutdown's order; every step is a no-op
     * for what never started (NULL, -1, a writer not started), a worker
     * that never started is not joined, only its loop closed. */
    idem__takeover_discard(&tk);
    if (listen_fd >= 0)
        close(listen_fd);
    if (admin_fd >= 0)
        close(admin_fd);
    if (tls_fd >= 0)
        close(tls_fd);
    idem__takeover_stop(&tk);
    atomic_store(&gw.stopping, true);
    for (int i = 0; i < started; i++)
        idem__worker_request_stop(&gw.workers[i]);
    for (int i = 0; i < started; i++)
        pthread_join(gw.workers[i].thread, NULL);
    idem__admin_stop(admin);
    idem__inval_stop(&gw);
    idem__writer_stop(&gw.writer);
    for (int i = 0; i < inited; i++)
        idem__worker_cleanup(&gw.workers[i]);
    free(gw.workers);
    idem__otlp_destroy(gw.otlp);
    idem__ratelimit_destroy(gw.ratelimit);
    idem__addrlimit_destroy(gw.addrlimit);
    idem__cache_destroy(gw.cache);
    idem_store_close(gw.store);
    idem__tls_ctx_unref(gw.upstream_tls_ctx);
    if (gw.has_tls_listener)
        idem__tls_server_cleanup(&gw.tls_server);
    idem__config_unref(gw.live);
    idem__config_unref(cfg);
    return fail(why);
}
