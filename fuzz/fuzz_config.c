/* fuzz/fuzz_config.c - libFuzzer target for idemd's configuration loader
 * (idem__config_load_file, src/gateway/config.c).
 *
 * The input is the text of the YAML file.  The loader takes a path, so the
 * input is written to a memfd (made once) and the loader is given
 * /proc/self/fd/N: no file on disk, nothing to clean up.  Properties checked:
 *   - the result is 0 or -1; on -1 the message is one line that starts
 *     with the file name; on 0 there is no message;
 *   - an accepted file leaves a config that passes idem__config_validate,
 *     except for the one check that is between two keys the file may set
 *     on their own (admin on the same address as listen), and that holds
 *     what the loader promises: every list within IDEM_CONFIG_MAX_LIST,
 *     methods uppercase tokens, paths starting with '/', header names
 *     lowercase tokens, pointers valid (idem_json_pointer_valid), statuses
 *     100-599, durations positive where 0 is refused and at most ten years;
 *   - loading the same file again over the result changes nothing;
 *   - out of memory at the Nth allocation (N from a hash of the input) is
 *     -1 with "out of memory" in the message, or the same config as before;
 *   - nothing leaks (LeakSanitizer) and idem__config_match runs on the result.
 * libFuzzer's -timeout catches a hang; the loader's own limit on the file
 * is 1 MiB, above libFuzzer's default input size.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_check.h"
#include "gateway/config.h"
#include "idem/alloc.h"
#include "idem/fingerprint.h"

#define TEN_YEARS_MS (3650LL * 24 * 3600 * 1000)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char path[64];

static bool is_token(const char *s, bool lower_only, bool upper_only)
{
    if (s == NULL || *s == '\0')
        return false;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && strchr("!#$%&'*+-.^_`|~", c) == NULL)
            return false;
        if ((lower_only && c >= 'A' && c <= 'Z') || (upper_only && c >= 'a' && c <= 'z'))
            return false;
    }
    return true;
}

static void check_policy(const idem_policy_t *p)
{
    CHECK(p->key_ttl_ms > 0 && p->key_ttl_ms <= TEN_YEARS_MS);
    CHECK(p->lease_ms > 0 && p->lease_ms <= TEN_YEARS_MS);
    CHECK(p->failure_ttl_ms >= 0 && p->failure_ttl_ms <= TEN_YEARS_MS);
    CHECK(p->wait_timeout_ms >= 0 && p->wait_timeout_ms <= TEN_YEARS_MS);
    CHECK(p->on_conflict == IDEM_CONFLICT_REJECT || p->on_conflict == IDEM_CONFLICT_WAIT);
    CHECK(p->on_unknown_outcome == IDEM_UNKNOWN_EXPIRE ||
          p->on_unknown_outcome == IDEM_UNKNOWN_HOLD ||
          p->on_unknown_outcome == IDEM_UNKNOWN_RECONCILE);
    CHECK(p->fingerprint_body == IDEM_FPBODY_RAW || p->fingerprint_body == IDEM_FPBODY_JSON);
    CHECK(p->n_fingerprint_headers <= IDEM_CONFIG_MAX_LIST);
    for (size_t i = 0; i < p->n_fingerprint_headers; i++)
        CHECK(is_token(p->fingerprint_headers[i], true, false));
    CHECK(p->n_fingerprint_ignore <= IDEM_CONFIG_MAX_LIST);
    for (size_t i = 0; i < p->n_fingerprint_ignore; i++)
        CHECK(idem_json_pointer_valid(p->fingerprint_ignore[i]));
    CHECK(p->n_release_statuses <= IDEM_CONFIG_MAX_LIST);
    for (size_t i = 0; i < p->n_release_statuses; i++)
        CHECK(p->release_statuses[i] >= 100 && p->release_statuses[i] <= 599);
}

static void check_config(const idem_config_t *cfg)
{
    char err[512];
    /* What only validation can see, because it needs two keys: every other
     * refusal is the parser's, with the line of the file. */
    static const char *const cross[] = {
        "admin: must not be the same address as listen:", /* listen and admin */
        "admin: '",                                       /* not loopback, no admin_token_file */
        "defaults.reconcile_url: ",                       /* on_unknown_outcome and upstream */
        "max_buffered_bytes: must be at least max_request_bytes", /* the two sizes */
        "listen_tls.address: must not be the same address",       /* listen, admin */
        "listen_tls: needs",                                /* address, cert_file, key_file */
        "scope: client_cert needs",                         /* scope and listen_tls */
        "scope: jwt:",                                      /* scope and jwt_keys */
        "upstream_tls: cert_file and key_file go together", /* the two files */
        "upstream_tls: written, but",                       /* upstream_tls and upstream */
    };
    if (idem__config_validate(cfg, err, sizeof err) != 0) {
        bool known = false;
        for (size_t i = 0; i < sizeof cross / sizeof *cross; i++)
            known = known || strncmp(err, cross[i], strlen(cross[i])) == 0;
        known = known || (strncmp(err, "routes[", 7) == 0 && strstr(err, "].reconcile_url: "));
        if (!known)
            fprintf(stderr, "validation refused what the parser took: %s\n", err);
        CHECK(known);
    }
    CHECK(cfg->n_routes <= IDEM_CONFIG_MAX_ROUTES);
    CHECK(cfg->upstream_timeout_ms > 0 && cfg->token_ttl_ms > 0);
    check_policy(&cfg->defaults);
    for (size_t r = 0; r < cfg->n_routes; r++) {
        const idem_route_t *rt = &cfg->routes[r];
        CHECK(rt->n_methods >= 1 && rt->n_methods <= IDEM_CONFIG_MAX_LIST);
        for (size_t i = 0; i < rt->n_methods; i++)
            CHECK(is_token(rt->methods[i], false, true));
        CHECK(rt->path != NULL && rt->path[0] == '/');
        CHECK(rt->mode >= IDEM_MODE_REQUIRED && rt->mode <= IDEM_MODE_OFF);
        check_policy(&rt->policy);
    }
    (void)idem__config_match(cfg, "POST", 4, "/orders/1?x=1", 13);
    (void)idem__config_match(cfg, "PATCH", 5, "http://h/a", 10);
}

static void dump_policy(FILE *f, const idem_policy_t *p)
{
    fprintf(f, "%lld %lld %lld %d %d %lld %d %llu |", (long long)p->key_ttl_ms,
            (long long)p->failure_ttl_ms, (long long)p->lease_ms, (int)p->on_conflict,
            (int)p->on_unknown_outcome, (long long)p->wait_timeout_ms, (int)p->fingerprint_body,
            (unsigned long long)p->max_response_bytes);
    for (size_t i = 0; i < p->n_fingerprint_headers; i++)
        fprintf(f, " h=%s", p->fingerprint_headers[i]);
    for (size_t i = 0; i < p->n_fingerprint_ignore; i++)
        fprintf(f, " i=%s", p->fingerprint_ignore[i]);
    for (size_t i = 0; i < p->n_release_statuses; i++)
        fprintf(f, " s=%d", p->release_statuses[i]);
    fputc('\n', f);
}

/* Everything in cfg as text, to compare two configs. */
static char *dump(const idem_config_t *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    fprintf(f, "%s %s %s %s %d %lld %llu %d %s %s %llu %lld %s\n", cfg->listen, cfg->admin,
            cfg->upstream, cfg->store, cfg->workers, (long long)cfg->upstream_timeout_ms,
            (unsigned long long)cfg->max_request_bytes, (int)cfg->on_store_error,
            cfg->replay_header, cfg->scope_header, (unsigned long long)cfg->local_cache,
            (long long)cfg->token_ttl_ms, cfg->log_format);
    dump_policy(f, &cfg->defaults);
    for (size_t r = 0; r < cfg->n_routes; r++) {
        const idem_route_t *rt = &cfg->routes[r];
        fprintf(f, "route %s %d", rt->path, (int)rt->mode);
        for (size_t i = 0; i < rt->n_methods; i++)
            fprintf(f, " %s", rt->methods[i]);
        fputc(' ', f);
        dump_policy(f, &rt->policy);
    }
    CHECK(fclose(f) == 0 && text != NULL);
    return text;
}

/* Load the file over fresh defaults; returns the loader's result. */
static int load(idem_config_t *cfg, char *err, size_t errlen)
{
    CHECK(idem__config_defaults(cfg) == 0);
    return idem__config_load_file(cfg, path, err, errlen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static idem_config_t cfg, cfg2;
    char err[512];

    if (memfd < 0) {
        memfd = memfd_create("idem-fuzz-config", MFD_CLOEXEC);
        CHECK(memfd >= 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
    }
    CHECK(ftruncate(memfd, 0) == 0);
    CHECK(size == 0 || pwrite(memfd, data, size, 0) == (ssize_t)size);

    int rc = load(&cfg, err, sizeof err);
    CHECK(rc == 0 || rc == -1);
    if (rc != 0) {
        CHECK(strncmp(err, path, strlen(path)) == 0);
        CHECK(strchr(err, '\n') == NULL);
        idem__config_cleanup(&cfg);
        return 0;
    }
    CHECK(err[0] == '\0');
    check_config(&cfg);
    char *first = dump(&cfg);

    /* The same file over its own result. */
    CHECK(idem__config_load_file(&cfg, path, err, sizeof err) == 0);
    char *second = dump(&cfg);
    CHECK(strcmp(first, second) == 0);
    free(second);
    idem__config_cleanup(&cfg);

    /* Out of memory at the Nth allocation. */
    CHECK(idem__config_defaults(&cfg2) == 0);
    idem_alloc_fail_after((long)(fuzz_hash(data, size) % 64) + 1);
    rc = idem__config_load_file(&cfg2, path, err, sizeof err);
    idem_alloc_fail_after(0);
    if (rc == 0) {
        char *third = dump(&cfg2);
        CHECK(strcmp(first, third) == 0);
        free(third);
    } else {
        CHECK(strstr(err, "out of memory") != NULL);
    }
    idem__config_cleanup(&cfg2);
    free(first);
    return 0;
}
