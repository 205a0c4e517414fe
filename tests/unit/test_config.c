/* tests/unit/test_config.c - idemd's configuration (src/gateway/config.c).
 *
 * Each test writes its YAML into a fresh temporary directory as idem.yaml,
 * so that error messages can be compared whole: "<path>:<line>: <key>:
 * <problem>".  The configuration under test is one static idem_config_t
 * (it is large) filled with the defaults before each test and freed after.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gateway/config.h"
#include "idem/alloc.h"

static idem_config_t cfg;
static char dir[64];
static char path[128];
static char err[512];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/idem-config-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/idem.yaml", dir);
    err[0] = '\0';
    cr_assert_eq(idem__config_defaults(&cfg), 0);
}

static void teardown(void)
{
    idem__config_cleanup(&cfg);
    unlink(path);
    rmdir(dir);
}

TestSuite(config, .init = setup, .fini = teardown);

static void write_file(const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static int load(const char *text)
{
    write_file(text);
    return idem__config_load_file(&cfg, path, err, sizeof err);
}

/* Load text, expect failure with exactly "<path>:<line>: <rest>". */
static void expect_error(const char *text, int line, const char *rest)
{
    char want[512];
    cr_assert_eq(load(text), -1, "loaded although it should fail: %s", text);
    snprintf(want, sizeof want, "%s:%d: %s", path, line, rest);
    cr_assert_str_eq(err, want);
}

/* ---- defaults ------------------------------------------------------------ */

Test(config, defaults_of_the_limits_and_tls_keys)
{
    cr_expect_eq(cfg.max_queued_bytes, 64u * 1024 * 1024);
    cr_expect_eq(cfg.max_connections_per_address, 0);
    cr_expect_null(cfg.listen_tls_address);
    cr_expect_null(cfg.listen_tls_cert_file);
    cr_expect_null(cfg.listen_tls_key_file);
    cr_expect_null(cfg.listen_tls_client_ca_file);
    cr_expect_null(cfg.upstream_tls_ca_file);
    cr_expect_null(cfg.upstream_tls_cert_file);
    cr_expect_null(cfg.upstream_tls_key_file);
    cr_expect_null(cfg.upstream_tls_server_name);
    cr_expect(cfg.upstream_tls_verify);
}

Test(config, defaults_are_spec_section_10)
{
    cr_assert_str_eq(cfg.listen, "127.0.0.1:8080");
    cr_assert_str_eq(cfg.admin, "127.0.0.1:8081");
    cr_assert_str_eq(cfg.upstream, "http://127.0.0.1:9000");
    cr_assert_str_eq(cfg.store, "lmdb:./idem-data");
    cr_assert_eq(cfg.workers, IDEM_WORKERS_AUTO); /* issue 22: one per CPU */
    cr_assert_eq(cfg.upstream_timeout_ms, 60000);
    cr_assert_eq(cfg.max_request_bytes, 10u * 1024 * 1024);
    cr_assert_eq(cfg.on_store_error, IDEM_STORE_ERR_CLOSED);
    cr_assert_str_eq(cfg.replay_header, "X-Idempotent-Replay");
    cr_assert_str_eq(cfg.scope_header, "Authorization");
    cr_assert_eq(cfg.local_cache, 0);
    cr_assert_eq(cfg.token_ttl_ms, 300000);
    cr_assert_str_eq(cfg.log_format, "text");
}

static void assert_default_policy(const idem_policy_t *p)
{
    cr_assert_eq(p->key_ttl_ms, 24LL * 3600 * 1000);
    cr_assert_eq(p->failure_ttl_ms, 5 * 60 * 1000);
    cr_assert_eq(p->lease_ms, 30000);
    cr_assert_eq(p->on_conflict, IDEM_CONFLICT_REJECT);
    cr_assert_eq(p->on_unknown_outcome, IDEM_UNKNOWN_EXPIRE);
    cr_assert_eq(p->wait_timeout_ms, 10000);
    cr_assert_eq(p->fingerprint_body, IDEM_FPBODY_RAW);
    cr_assert_eq(p->n_fingerprint_headers, 0);
    cr_assert_eq(p->n_fingerprint_ignore, 0);
    cr_assert_eq(p->max_response_bytes, 1024 * 1024);
    cr_assert_eq(p->n_release_statuses, 2);
    cr_assert_eq(p->release_statuses[0], 429);
    cr_assert_eq(p->release_statuses[1], 503);
}

Test(config, default_policy_is_spec_section_10)
{
    assert_default_policy(&cfg.defaults);
}

Test(config, default_route_is_post_patch_on_root_required)
{
    cr_assert_eq(cfg.n_routes, 1);
    const idem_route_t *r = &cfg.routes[0];
    cr_assert_eq(r->n_methods, 2);
    cr_assert_str_eq(r->methods[0], "POST");
    cr_assert_str_eq(r->methods[1], "PATCH");
    cr_assert_str_eq(r->path, "/");
    cr_assert_eq(r->mode, IDEM_MODE_REQUIRED);
    assert_default_policy(&r->policy);
}

Test(config, defaults_are_valid)
{
    cr_assert_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

Test(config, defaults_fail_cleanly_when_memory_runs_out)
{
    static idem_config_t c2;
    for (long n = 1;; n++) {
        idem_alloc_fail_after(n);
        int rc = idem__config_defaults(&c2);
        idem_alloc_fail_after(0);
        if (rc == 0)
            break;
        cr_assert_eq(rc, -1);
        cr_assert_null(c2.listen); /* cleaned up, nothing left to leak */
        cr_assert_eq(c2.n_routes, 0);
        cr_assert_lt(n, 100);
    }
    idem__config_cleanup(&c2);
}

/* ---- files that load ----------------------------------------------------- */

Test(config, empty_file_keeps_defaults)
{
    cr_assert_eq(load(""), 0, "%s", err);
    cr_assert_str_eq(cfg.listen, "127.0.0.1:8080");
    cr_assert_eq(cfg.n_routes, 1);
    assert_default_policy(&cfg.routes[0].policy);
}

Test(config, comments_and_bare_document_marker_keep_defaults)
{
    cr_assert_eq(load("# nothing here\n---\n"), 0, "%s", err);
    cr_assert_str_eq(cfg.store, "lmdb:./idem-data");
    cr_assert_eq(cfg.n_routes, 1);
}

static const char full_file[] =
    "listen: 0.0.0.0:18080\n"
    "admin: '[::1]:18081'\n"
    "upstream: https://backend.local:9100/\n"
    "max_queued_bytes: 16MiB\n"
    "max_connections_per_address: 64\n"
    "listen_tls:\n"
    "  address: 0.0.0.0:18443\n"
    "  cert_file: server.pem\n"
    "  key_file: server.key\n"
    "  client_ca_file: clients.pem\n"
    "upstream_tls:\n"
    "  ca_file: ca.pem\n"
    "  cert_file: me.pem\n"
    "  key_file: me.key\n"
    "  server_name: backend.local\n"
    "  verify: true\n"
    "store: redis://cache:6379/2\n"
    "workers: 8\n"
    "upstream_timeout: 15s\n"
    "max_request_bytes: 2MiB\n"
    "on_store_error: open\n"
    "replay_header: X-Replayed\n"
    "scope_header: X-Tenant\n"
    "local_cache: 5000\n"
    "token_ttl: 2m\n"
    "log_format: json\n"
    "defaults:\n"
    "  key_ttl: 48h\n"
    "  failure_ttl: 1m\n"
    "  lease: 45s\n"
    "  on_conflict: wait\n"
    "  on_unknown_outcome: hold\n"
    "  wait_timeout: 2500ms\n"
    "  fingerprint_body: json\n"
    "  fingerprint_headers: [Content-Type, X-Api-Version]\n"
    "  fingerprint_ignore: [/client_time, \"\", /a~1b]\n"
    "  max_response_bytes: 64KiB\n"
    "  release_statuses: [429, 503, 409]\n"
    "routes:\n"
    "  - methods: [POST]\n"
    "    path: /payments\n"
    "    mode: token\n"
    "  - methods: [PUT, DELETE]\n"
    "    path: /orders/\n"
    "    mode: optional\n"
    "    lease: 5s\n";

Test(config, full_file_sets_every_top_level_key)
{
    cr_assert_eq(load(full_file), 0, "%s", err);
    cr_assert_str_eq(cfg.listen, "0.0.0.0:18080");
    cr_assert_str_eq(cfg.admin, "[::1]:18081");
    cr_assert_str_eq(cfg.upstream, "https://backend.local:9100/");
    cr_assert_eq(cfg.max_queued_bytes, 16u * 1024 * 1024);
    cr_assert_eq(cfg.max_connections_per_address, 64);
    cr_assert_str_eq(cfg.listen_tls_address, "0.0.0.0:18443");
    cr_assert_str_eq(cfg.listen_tls_cert_file, "server.pem");
    cr_assert_str_eq(cfg.listen_tls_key_file, "server.key");
    cr_assert_str_eq(cfg.listen_tls_client_ca_file, "clients.pem");
    cr_assert_str_eq(cfg.upstream_tls_ca_file, "ca.pem");
    cr_assert_str_eq(cfg.upstream_tls_cert_file, "me.pem");
    cr_assert_str_eq(cfg.upstream_tls_key_file, "me.key");
    cr_assert_str_eq(cfg.upstream_tls_server_name, "backend.local");
    cr_assert(cfg.upstream_tls_verify);
    cr_assert_str_eq(cfg.store, "redis://cache:6379/2");
    cr_assert_eq(cfg.workers, 8);
    cr_assert_eq(cfg.upstream_timeout_ms, 15000);
    cr_assert_eq(cfg.max_request_bytes, 2u * 1024 * 1024);
    cr_assert_eq(cfg.on_store_error, IDEM_STORE_ERR_OPEN);
    cr_assert_str_eq(cfg.replay_header, "X-Replayed");
    cr_assert_str_eq(cfg.scope_header, "X-Tenant");
    cr_assert_eq(cfg.local_cache, 5000);
    cr_assert_eq(cfg.token_ttl_ms, 120000);
    cr_assert_str_eq(cfg.log_format, "json");
    cr_assert_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

Test(config, full_file_sets_every_defaults_key)
{
    cr_assert_eq(load(full_file), 0, "%s", err);
    const idem_policy_t *p = &cfg.defaults;
    cr_assert_eq(p->key_ttl_ms, 48LL * 3600 * 1000);
    cr_assert_eq(p->failure_ttl_ms, 60000);
    cr_assert_eq(p->lease_ms, 45000);
    cr_assert_eq(p->on_conflict, IDEM_CONFLICT_WAIT);
    cr_assert_eq(p->on_unknown_outcome, IDEM_UNKNOWN_HOLD);
    cr_assert_eq(p->wait_timeout_ms, 2500);
    cr_assert_eq(p->fingerprint_body, IDEM_FPBODY_JSON);
    cr_assert_eq(p->n_fingerprint_headers, 2);
    cr_assert_str_eq(p->fingerprint_headers[0], "content-type");
    cr_assert_str_eq(p->fingerprint_headers[1], "x-api-version");
    cr_assert_eq(p->n_fingerprint_ignore, 3);
    cr_assert_str_eq(p->fingerprint_ignore[0], "/client_time");
    cr_assert_str_eq(p->fingerprint_ignore[1], "");
    cr_assert_str_eq(p->fingerprint_ignore[2], "/a~1b");
    cr_assert_eq(p->max_response_bytes, 64 * 1024);
    cr_assert_eq(p->n_release_statuses, 3);
    cr_assert_eq(p->release_statuses[2], 409);
}

Test(config, full_file_routes_replace_the_default_route)
{
    cr_assert_eq(load(full_file), 0, "%s", err);
    cr_assert_eq(cfg.n_routes, 2);
    cr_assert_eq(cfg.routes[0].n_methods, 1);
    cr_assert_str_eq(cfg.routes[0].methods[0], "POST");
    cr_assert_str_eq(cfg.routes[0].path, "/payments");
    cr_assert_eq(cfg.routes[0].mode, IDEM_MODE_TOKEN);
    cr_assert_eq(cfg.routes[1].n_methods, 2);
    cr_assert_str_eq(cfg.routes[1].methods[1], "DELETE");
    cr_assert_str_eq(cfg.routes[1].path, "/orders/");
    cr_assert_eq(cfg.routes[1].mode, IDEM_MODE_OPTIONAL);
}

Test(config, quoted_numbers_are_accepted)
{
    cr_assert_eq(load("workers: '4'\n"), 0, "%s", err);
    cr_assert_eq(cfg.workers, 4);
}

Test(config, empty_routes_list_leaves_no_route)
{
    cr_assert_eq(load("routes: []\n"), 0, "%s", err);
    cr_assert_eq(cfg.n_routes, 0);
    cr_assert_null(idem__config_match(&cfg, "POST", 4, "/x", 2));
}

Test(config, route_without_methods_path_or_mode_takes_the_default_route_values)
{
    cr_assert_eq(load("routes:\n  - lease: 1s\n"), 0, "%s", err);
    cr_assert_eq(cfg.n_routes, 1);
    cr_assert_eq(cfg.routes[0].n_methods, 2);
    cr_assert_str_eq(cfg.routes[0].methods[0], "POST");
    cr_assert_str_eq(cfg.routes[0].methods[1], "PATCH");
    cr_assert_str_eq(cfg.routes[0].path, "/");
    cr_assert_eq(cfg.routes[0].mode, IDEM_MODE_REQUIRED);
}

/* ---- inheritance --------------------------------------------------------- */

Test(config, routes_inherit_defaults_written_before_them)
{
    cr_assert_eq(load("defaults:\n"
                      "  lease: 7s\n"
                      "  fingerprint_headers: [X-A]\n"
                      "routes:\n"
                      "  - path: /a\n"),
                 0, "%s", err);
    cr_assert_eq(cfg.routes[0].policy.lease_ms, 7000);
    cr_assert_eq(cfg.routes[0].policy.n_fingerprint_headers, 1);
    cr_assert_str_eq(cfg.routes[0].policy.fingerprint_headers[0], "x-a");
    cr_assert_eq(cfg.routes[0].policy.key_ttl_ms, 24LL * 3600 * 1000); /* untouched default */
}

Test(config, routes_inherit_defaults_written_after_them)
{
    cr_assert_eq(load("routes:\n"
                      "  - path: /a\n"
                      "defaults:\n"
                      "  lease: 7s\n"
                      "  on_conflict: wait\n"
                      "  fingerprint_ignore: [/t]\n"),
                 0, "%s", err);
    const idem_policy_t *p = &cfg.routes[0].policy;
    cr_assert_eq(p->lease_ms, 7000);
    cr_assert_eq(p->on_conflict, IDEM_CONFLICT_WAIT);
    cr_assert_eq(p->n_fingerprint_ignore, 1);
    cr_assert_str_eq(p->fingerprint_ignore[0], "/t");
}

Test(config, route_overrides_only_the_keys_it_sets)
{
    cr_assert_eq(load("routes:\n"
                      "  - path: /a\n"
                      "    lease: 2s\n"
                      "    release_statuses: []\n"
                      "    fingerprint_headers: [X-Own]\n"
                      "defaults:\n"
                      "  lease: 7s\n"
                      "  wait_timeout: 3s\n"
                      "  release_statuses: [500]\n"
                      "  fingerprint_headers: [X-Default]\n"),
                 0, "%s", err);
    const idem_policy_t *p = &cfg.routes[0].policy;
    cr_assert_eq(p->lease_ms, 2000);
    cr_assert_eq(p->n_release_statuses, 0);
    cr_assert_eq(p->n_fingerprint_headers, 1);
    cr_assert_str_eq(p->fingerprint_headers[0], "x-own");
    cr_assert_eq(p->wait_timeout_ms, 3000);
}

Test(config, routes_do_not_share_policy_between_each_other)
{
    cr_assert_eq(load("routes:\n"
                      "  - path: /a\n"
                      "    fingerprint_body: json\n"
                      "  - path: /b\n"),
                 0, "%s", err);
    cr_assert_eq(cfg.routes[0].policy.fingerprint_body, IDEM_FPBODY_JSON);
    cr_assert_eq(cfg.routes[1].policy.fingerprint_body, IDEM_FPBODY_RAW);
}

Test(config, defaults_without_routes_apply_to_the_default_route)
{
    cr_assert_eq(load("defaults:\n  key_ttl: 1h\n"), 0, "%s", err);
    cr_assert_eq(cfg.n_routes, 1);
    cr_assert_str_eq(cfg.routes[0].path, "/");
    cr_assert_eq(cfg.routes[0].policy.key_ttl_ms, 3600000);
}

Test(config, a_list_in_the_file_replaces_the_default_list)
{
    cr_assert_eq(load("defaults:\n  release_statuses: [502]\n"), 0, "%s", err);
    cr_assert_eq(cfg.defaults.n_release_statuses, 1);
    cr_assert_eq(cfg.defaults.release_statuses[0], 502);
}

Test(config, yaml_aliases_are_followed)
{
    cr_assert_eq(load("defaults:\n"
                      "  fingerprint_headers: &h [X-A, X-B]\n"
                      "routes:\n"
                      "  - path: /a\n"
                      "    fingerprint_headers: *h\n"),
                 0, "%s", err);
    cr_assert_eq(cfg.routes[0].policy.n_fingerprint_headers, 2);
    cr_assert_str_eq(cfg.routes[0].policy.fingerprint_headers[1], "x-b");
}

Test(config, load_fails_cleanly_when_memory_runs_out)
{
    write_file(full_file);
    for (long n = 1;; n++) {
        idem_alloc_fail_after(n);
        int rc = idem__config_load_file(&cfg, path, err, sizeof err);
        idem_alloc_fail_after(0);
        if (rc == 0)
            break;
        cr_assert(strstr(err, "out of memory") != NULL, "%s", err);
        cr_assert_lt(n, 1000);
        /* cfg must stay valid: start over from a fresh one (ASan checks leaks) */
        idem__config_cleanup(&cfg);
        cr_assert_eq(idem__config_defaults(&cfg), 0);
    }
    cr_assert_eq(cfg.n_routes, 2);
}

/* ---- errors -------------------------------------------------------------- */

Test(config, bad_duration_names_file_line_and_key)
{
    expect_error("workers: 2\n"
                 "defaults:\n"
                 "  key_ttl: 1h\n"
                 "  lease: 3x\n",
                 4, "defaults.lease: not a duration: '3x'");
}

Test(config, duration_of_zero_is_refused_for_a_lease)
{
    expect_error("defaults:\n  lease: 0s\n", 2, "defaults.lease: must be longer than 0");
}

Test(config, bad_size_is_refused)
{
    expect_error("max_request_bytes: 10 MB\n", 1, "max_request_bytes: not a size: '10 MB'");
}

Test(config, zero_request_limit_is_refused_but_zero_response_limit_is_not)
{
    expect_error("max_request_bytes: 0\n", 1, "max_request_bytes: must be at least 1 byte");
    cr_assert_eq(load("defaults:\n  max_response_bytes: 0\n"), 0, "%s", err);
    cr_assert_eq(cfg.defaults.max_response_bytes, 0);
}

Test(config, bad_route_mode_names_the_route_index)
{
    expect_error("routes:\n"
                 "  - path: /a\n"
                 "    mode: off\n"
                 "  - path: /b\n"
                 "    mode: sometimes\n",
                 5, "routes[1].mode: must be one of required, optional, token, off");
}

Test(config, bad_enums_are_refused)
{
    expect_error("on_store_error: maybe\n", 1, "on_store_error: must be one of closed, open");
    expect_error("defaults:\n  on_conflict: queue\n", 2,
                 "defaults.on_conflict: must be one of reject, wait");
    expect_error("defaults:\n  on_unknown_outcome: retry\n", 2,
                 "defaults.on_unknown_outcome: must be one of expire, hold, reconcile");
    expect_error("defaults:\n  fingerprint_body: xml\n", 2,
                 "defaults.fingerprint_body: must be one of raw, json");
    expect_error("log_format: yaml\n", 1, "log_format: must be one of json, text");
}

Test(config, unknown_top_level_key_is_refused)
{
    expect_error("listen: 127.0.0.1:1234\nlisten_addr: x\n", 2, "listen_addr: unknown key");
}

Test(config, unknown_key_in_defaults_is_refused)
{
    expect_error("defaults:\n  leese: 3s\n", 2, "defaults.leese: unknown key");
}

Test(config, unknown_key_in_a_route_is_refused)
{
    expect_error("routes:\n  - path: /a\n    methdos: [POST]\n", 3, "routes[0].methdos: unknown key");
}

Test(config, key_given_twice_is_refused)
{
    expect_error("workers: 2\nworkers: 3\n", 2, "workers: key given twice");
}

Test(config, list_where_a_value_belongs_is_refused)
{
    expect_error("store: [a, b]\n", 1, "store: expected a single value, found a list");
}

Test(config, mapping_where_a_value_belongs_is_refused)
{
    expect_error("defaults:\n  lease:\n    s: 3\n", 3,
                 "defaults.lease: expected a single value, found a mapping");
}

Test(config, value_where_a_list_belongs_is_refused)
{
    expect_error("defaults:\n  release_statuses: 429\n", 2,
                 "defaults.release_statuses: expected a list, found a single value");
}

Test(config, empty_value_is_refused)
{
    expect_error("store:\n", 1, "store: missing value");
    /* Quoted, it is a value, but an empty store URL (found by fuzz_config:
     * the loader took it and validation refused it). */
    expect_error("workers: 2\nstore: \"\"\n", 2, "store: must not be empty");
    expect_error("defaults:\n  fingerprint_headers:\n", 2,
                 "defaults.fingerprint_headers: expected a list (write [] for none)");
}

Test(config, defaults_must_be_a_mapping)
{
    expect_error("defaults: [1]\n", 1, "defaults: expected a mapping of keys, found a list");
}

Test(config, workers_out_of_range_are_refused)
{
    expect_error("workers: 0\n", 1, "workers: must be auto or a whole number from 1 to 64");
    expect_error("workers: 65\n", 1, "workers: must be auto or a whole number from 1 to 64");
    expect_error("workers: -1\n", 1, "workers: must be auto or a whole number from 1 to 64");
}

Test(config, workers_auto_or_a_number)
{
    cr_assert_eq(load("workers: 3\n"), 0, "%s", err);
    cr_assert_eq(cfg.workers, 3);
    cr_assert_eq(load("workers: auto\n"), 0, "%s", err);
    cr_assert_eq(cfg.workers, IDEM_WORKERS_AUTO);
    expect_error("workers: Auto\n", 1, "workers: must be auto or a whole number from 1 to 64");
}

/* issue 22: admin_token_file is a file name; a non-loopback admin needs it. */
Test(config, admin_token_file_and_a_non_loopback_admin)
{
    cr_assert_eq(load("admin_token_file: /run/idem/token\n"), 0, "%s", err);
    cr_assert_str_eq(cfg.admin_token_file, "/run/idem/token");
    expect_error("admin_token_file: \"\"\n", 1, "admin_token_file: must not be empty");
    idem__config_cleanup(&cfg);
    cr_assert_eq(idem__config_defaults(&cfg), 0);
    const char *loopback[] = {"127.0.0.1:1", "127.9.9.9:1", "[::1]:1", "localhost:1",
                              "LocalHost:1"};
    for (size_t i = 0; i < sizeof loopback / sizeof *loopback; i++) {
        cr_assert_eq(idem__config_set_string(&cfg.admin, loopback[i]), 0);
        cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s: %s", loopback[i], err);
    }
    const char *open_to_all[] = {"0.0.0.0:1", "[::]:1", "10.0.0.1:1", "admin.example:1",
                                 "[::ffff:127.0.0.1]:1"};
    for (size_t i = 0; i < sizeof open_to_all / sizeof *open_to_all; i++) {
        cr_assert_eq(idem__config_set_string(&cfg.admin, open_to_all[i]), 0);
        cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), -1, "%s", open_to_all[i]);
        cr_expect(strstr(err, "not a loopback address: set admin_token_file") != NULL, "%s", err);
    }
    cr_assert_eq(idem__config_set_string(&cfg.admin_token_file, "/run/idem/token"), 0);
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

/* issue 22: a route's name is its metrics label: unique, never an index or "none". */
Test(config, route_names)
{
    cr_assert_eq(load("routes:\n  - path: /a\n    name: pay-v1.x\n  - path: /b\n"), 0, "%s",
                 err);
    cr_assert_str_eq(cfg.routes[0].name, "pay-v1.x");
    cr_assert_null(cfg.routes[1].name);
    char buf[24];
    cr_assert_str_eq(idem__config_route_label(&cfg, 0, buf, sizeof buf), "pay-v1.x");
    cr_assert_str_eq(idem__config_route_label(&cfg, 1, buf, sizeof buf), "1");
    expect_error("routes:\n  - path: /a\n    name: p\n  - path: /b\n    name: p\n", 5,
                 "routes[1].name: routes[0] has this name already: 'p'");
    expect_error("routes:\n  - name: none\n", 2, "routes[0].name: must be 1 to 64 of A-Z a-z 0-9 _ . -, not only digits and not 'none': 'none'");
    expect_error("routes:\n  - name: '12'\n", 2, "routes[0].name: must be 1 to 64 of A-Z a-z 0-9 _ . -, not only digits and not 'none': '12'");
    expect_error("routes:\n  - name: 'a\"b'\n", 2, "routes[0].name: must be 1 to 64 of A-Z a-z 0-9 _ . -, not only digits and not 'none': 'a\"b'");
}

Test(config, release_status_outside_100_599_is_refused)
{
    expect_error("defaults:\n  release_statuses: [429,\n    600]\n", 3,
                 "defaults.release_statuses[1]: must be a whole number from 100 to 599");
}

Test(config, lowercase_method_is_refused)
{
    expect_error("routes:\n  - methods: [POST, post]\n", 2,
                 "routes[0].methods[1]: not an uppercase method name: 'post'");
}

Test(config, empty_method_list_is_refused)
{
    expect_error("routes:\n  - methods: []\n", 2,
                 "routes[0].methods: must list at least one method");
}

Test(config, path_without_leading_slash_is_refused)
{
    expect_error("routes:\n  - path: payments\n", 2,
                 "routes[0].path: must start with '/': 'payments'");
}

Test(config, bad_fingerprint_header_name_is_refused)
{
    expect_error("defaults:\n  fingerprint_headers: ['X A']\n", 2,
                 "defaults.fingerprint_headers[0]: not a header name: 'X A'");
}

Test(config, bad_json_pointer_is_refused)
{
    expect_error("defaults:\n  fingerprint_ignore: [client_time]\n", 2,
                 "defaults.fingerprint_ignore[0]: not a JSON pointer (\"\" or starting with /): "
                 "'client_time'");
    expect_error("defaults:\n  fingerprint_ignore: [/a~2]\n", 2,
                 "defaults.fingerprint_ignore[0]: not a JSON pointer (\"\" or starting with /): "
                 "'/a~2'");
}

Test(config, list_longer_than_the_limit_is_refused)
{
    char text[1024];
    size_t used = (size_t)snprintf(text, sizeof text, "defaults:\n  fingerprint_headers: [");
    for (int i = 0; i <= IDEM_CONFIG_MAX_LIST; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%sh%d", i ? ", " : "", i);
    snprintf(text + used, sizeof text - used, "]\n");
    char want[128];
    snprintf(want, sizeof want, "defaults.fingerprint_headers: too many entries (at most %d)",
             IDEM_CONFIG_MAX_LIST);
    expect_error(text, 2, want);
}

Test(config, more_routes_than_the_limit_are_refused)
{
    static char text[64 * 1024];
    size_t used = (size_t)snprintf(text, sizeof text, "routes:\n");
    for (int i = 0; i <= IDEM_CONFIG_MAX_ROUTES; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "  - path: /r%d\n", i);
    char want[128];
    snprintf(want, sizeof want, "routes: too many routes (at most %d)", IDEM_CONFIG_MAX_ROUTES);
    expect_error(text, 2, want);
}

Test(config, exactly_the_route_limit_is_accepted)
{
    static char text[64 * 1024];
    size_t used = (size_t)snprintf(text, sizeof text, "routes:\n");
    for (int i = 0; i < IDEM_CONFIG_MAX_ROUTES; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "  - path: /r%d\n", i);
    cr_assert_eq(load(text), 0, "%s", err);
    cr_assert_eq(cfg.n_routes, IDEM_CONFIG_MAX_ROUTES);
}

Test(config, bad_listen_address_in_the_file_is_refused)
{
    expect_error("listen: localhost\n", 1,
                 "listen: not HOST:PORT (port 1-65535, IPv6 in brackets): 'localhost'");
}

Test(config, https_upstream_is_accepted_with_its_port)
{
    cr_assert_eq(load("upstream: https://api.internal:8443\n"), 0, "%s", err);
    cr_expect_str_eq(cfg.upstream, "https://api.internal:8443");
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
    /* As for http, the port is written: no default 443. */
    expect_error("\nupstream: https://api\n", 2,
                 "upstream: must be http(s)://HOST:PORT (the port written, 1-65535; IPv6 in "
                 "brackets): 'https://api'");
    expect_error("upstream: ftp://api:1\n", 1,
                 "upstream: must be http://HOST:PORT or https://HOST:PORT: 'ftp://api:1'");
}

Test(config, bad_replay_header_is_refused)
{
    expect_error("replay_header: 'X Replay'\n", 1, "replay_header: not a header name: 'X Replay'");
}

Test(config, yaml_syntax_error_gives_its_line)
{
    cr_assert_eq(load("listen: 127.0.0.1:1\nadmin: 127.0.0.1:2\nstore: [a\nworkers: 2\n"), -1);
    char want[256];
    snprintf(want, sizeof want, "%s:", path);
    cr_assert(strncmp(err, want, strlen(want)) == 0, "%s", err);
    cr_assert(strstr(err, "YAML syntax error") != NULL, "%s", err);
    /* the unclosed flow list is detected where the file ends or the next key is */
    long line = strtol(err + strlen(want), NULL, 10);
    cr_assert(line >= 3 && line <= 5, "%s", err);
}

Test(config, yaml_syntax_error_mid_file_points_at_its_line)
{
    expect_error("workers: 2\nlisten: a: b\n", 2,
                 "YAML syntax error: mapping values are not allowed in this context");
}

Test(config, top_level_list_is_refused)
{
    expect_error("- a\n- b\n", 1, "the top level must be a mapping of keys");
}

Test(config, second_document_is_refused)
{
    expect_error("workers: 2\n---\nworkers: 3\n", 3, "only one YAML document is allowed");
}

Test(config, missing_file_is_reported_with_strerror)
{
    char want[256];
    cr_assert_eq(idem__config_load_file(&cfg, path, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s: cannot read: No such file or directory", path);
    cr_assert_str_eq(err, want);
}

Test(config, file_over_one_mebibyte_is_refused)
{
    static char text[1024 * 1024 + 16];
    memset(text, '#', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    char want[256];
    cr_assert_eq(load(text), -1);
    snprintf(want, sizeof want, "%s: larger than 1 MiB", path);
    cr_assert_str_eq(err, want);
}

/* ---- addresses ----------------------------------------------------------- */

Test(config, parse_addr_accepts_ipv4_ipv6_and_names)
{
    char host[64];
    int port;
    cr_assert_eq(idem__config_parse_addr("127.0.0.1:8080", host, sizeof host, &port), 0);
    cr_assert_str_eq(host, "127.0.0.1");
    cr_assert_eq(port, 8080);
    cr_assert_eq(idem__config_parse_addr("[::1]:1", host, sizeof host, &port), 0);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(port, 1);
    cr_assert_eq(idem__config_parse_addr("localhost:65535", host, sizeof host, &port), 0);
    cr_assert_str_eq(host, "localhost");
    cr_assert_eq(port, 65535);
}

Test(config, parse_addr_refuses_bad_ports)
{
    char host[64];
    int port;
    const char *bad[] = {"localhost", "localhost:", "localhost:0", "localhost:65536",
                         "localhost:80x", "localhost:+80", "localhost:000080"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(idem__config_parse_addr(bad[i], host, sizeof host, &port), -1, "%s", bad[i]);
}

Test(config, parse_addr_refuses_bad_hosts)
{
    char host[64];
    int port;
    const char *bad[] = {":80", "::1:80", "[::1]80", "[zz]:80", "[]:80", "a b:80",
                         "999.1.1.1:80", "[::1:80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(idem__config_parse_addr(bad[i], host, sizeof host, &port), -1, "%s", bad[i]);
        cr_assert_str_eq(host, "");
        cr_assert_eq(port, 0);
    }
}

Test(config, parse_addr_refuses_a_host_longer_than_the_buffer)
{
    char host[5];
    int port;
    cr_assert_eq(idem__config_parse_addr("abcd:80", host, sizeof host, &port), 0);
    cr_assert_eq(idem__config_parse_addr("abcde:80", host, sizeof host, &port), -1);
}

Test(config, parse_upstream_takes_host_and_port)
{
    char host[64];
    int port;
    cr_assert_eq(idem__config_parse_upstream("HTTP://[::1]:9000/", host, sizeof host, &port), 0);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(port, 9000);
    cr_assert_eq(idem__config_parse_upstream("http://api:80/v1", host, sizeof host, &port), -1);
    cr_assert_eq(idem__config_parse_upstream("http://api", host, sizeof host, &port), -1);
    /* The plain-HTTP wrapper refuses https. */
    cr_assert_eq(idem__config_parse_upstream("https://api:443", host, sizeof host, &port), -1);
}

Test(config, parse_upstream_url_says_tls)
{
    char host[64];
    int port;
    bool tls = true;
    cr_assert_eq(idem__config_parse_upstream_url("http://api:80", host, sizeof host, &port, &tls),
                 0);
    cr_expect_not(tls);
    cr_assert_eq(idem__config_parse_upstream_url("HTTPS://[::1]:8443/", host, sizeof host, &port,
                                                 &tls),
                 0);
    cr_expect(tls);
    cr_expect_str_eq(host, "::1");
    cr_expect_eq(port, 8443);
    cr_assert_eq(idem__config_parse_upstream_url("https://api:443", host, sizeof host, &port,
                                                 NULL),
                 0);
    static const char *const bad[] = {"https://api",    "https://api:443/x", "https://u@api:443",
                                      "httpss://api:1", "https:/api:1",      NULL};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tls = true;
        cr_expect_eq(idem__config_parse_upstream_url(bad[i], host, sizeof host, &port, &tls), -1,
                     "%s", bad[i] ? bad[i] : "NULL");
        cr_expect_not(tls);
    }
}

/* ---- validate ------------------------------------------------------------ */

static void expect_invalid(const char *want_prefix)
{
    cr_assert_eq(idem__config_validate(&cfg, err, sizeof err), -1);
    cr_assert(strncmp(err, want_prefix, strlen(want_prefix)) == 0, "got '%s', want '%s...'", err,
              want_prefix);
}

Test(config, validate_refuses_a_bad_listen_address)
{
    idem__config_set_string(&cfg.listen, "8080");
    expect_invalid("listen: not HOST:PORT");
}

Test(config, validate_refuses_a_bad_admin_address)
{
    idem__config_set_string(&cfg.admin, "[::1]");
    expect_invalid("admin: not HOST:PORT");
}

Test(config, validate_refuses_admin_on_the_listen_address)
{
    idem__config_set_string(&cfg.admin, cfg.listen);
    expect_invalid("admin: must not be the same address as listen");
}

Test(config, validate_refuses_upstreams_other_than_http_host_port)
{
    const char *bad[] = {"https://a",    "ftp://a:1", "http://a", "http://a:1/x", "http://a:1?q",
                         "http://u@a:1", "a:1",       "",         "https://a:1/x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        idem__config_set_string(&cfg.upstream, bad[i]);
        expect_invalid("upstream: ");
    }
}

Test(config, validate_accepts_upstream_with_a_trailing_slash)
{
    idem__config_set_string(&cfg.upstream, "http://[::1]:9000/");
    cr_assert_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

Test(config, validate_refuses_an_empty_store)
{
    idem__config_set_string(&cfg.store, "");
    expect_invalid("store: must not be empty");
}

Test(config, validate_refuses_bad_header_names)
{
    idem__config_set_string(&cfg.replay_header, "X-Replay:");
    expect_invalid("replay_header: not a header name");
    idem__config_set_string(&cfg.replay_header, "X-Replay");
    idem__config_set_string(&cfg.scope_header, "");
    expect_invalid("scope_header: not a header name");
}

Test(config, validate_refuses_workers_out_of_range)
{
    cfg.workers = 65;
    expect_invalid("workers: must be auto or a whole number from 1 to 64");
}

Test(config, validate_refuses_an_unknown_log_format)
{
    idem__config_set_string(&cfg.log_format, "xml");
    expect_invalid("log_format: must be one of json, text");
}

/* ---- what a client may hold (docs/protocol.md section 11) ------------------ */

Test(config, limits_default_to_spec_section_8)
{
    cr_assert_eq(cfg.header_timeout_ms, 10000);
    cr_assert_eq(cfg.body_timeout_ms, 30000);
    cr_assert_eq(cfg.idle_timeout_ms, 60000);
    cr_assert_eq(cfg.max_connections, 10000);
    cr_assert_not(cfg.max_connections_set);
    cr_assert_eq(cfg.max_buffered_bytes, 256u * 1024 * 1024);
    cr_assert_eq(cfg.n_admin_hosts, 0);
}

Test(config, limits_file_sets_every_limit_key)
{
    cr_assert_eq(load("header_timeout: 1500ms\n"
                      "body_timeout: 2s\n"
                      "idle_timeout: 5m\n"
                      "max_connections: 2\n"
                      "max_buffered_bytes: 64MiB\n"
                      "admin_hosts: [Admin.Example, 10.0.0.7, '[fd00::1]', mgmt_host]\n"),
                 0, "%s", err);
    cr_assert_eq(cfg.header_timeout_ms, 1500);
    cr_assert_eq(cfg.body_timeout_ms, 2000);
    cr_assert_eq(cfg.idle_timeout_ms, 300000);
    cr_assert_eq(cfg.max_connections, 2);
    cr_assert(cfg.max_connections_set);
    cr_assert_eq(cfg.max_buffered_bytes, 64u * 1024 * 1024);
    cr_assert_eq(cfg.n_admin_hosts, 4);
    cr_assert_str_eq(cfg.admin_hosts[0], "admin.example"); /* compared without case */
    cr_assert_str_eq(cfg.admin_hosts[1], "10.0.0.7");
    cr_assert_str_eq(cfg.admin_hosts[2], "[fd00::1]");
    cr_assert_str_eq(cfg.admin_hosts[3], "mgmt_host");
    cr_assert_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

Test(config, zero_timeouts_are_refused)
{
    expect_error("header_timeout: 0s\n", 1, "header_timeout: must be longer than 0");
    expect_error("body_timeout: 0ms\n", 1, "body_timeout: must be longer than 0");
    expect_error("idle_timeout: 0s\n", 1, "idle_timeout: must be longer than 0");
    expect_error("header_timeout: 10\n", 1, "header_timeout: not a duration: '10'");
}

Test(config, max_connections_out_of_range_is_refused)
{
    expect_error("max_connections: 0\n", 1,
                 "max_connections: must be a whole number from 1 to 1000000");
    expect_error("max_connections: 1000001\n", 1,
                 "max_connections: must be a whole number from 1 to 1000000");
    expect_error("max_connections: many\n", 1,
                 "max_connections: must be a whole number from 1 to 1000000");
}

Test(config, zero_buffered_bytes_is_refused)
{
    expect_error("max_buffered_bytes: 0\n", 1, "max_buffered_bytes: must be at least 1 byte");
}

Test(config, admin_hosts_refuses_ports_and_junk)
{
    expect_error("admin_hosts: [localhost:8081]\n", 1,
                 "admin_hosts[0]: not a host name or [IPv6] address without a port: "
                 "'localhost:8081'");
    expect_error("admin_hosts: [ok, 'a b']\n", 1,
                 "admin_hosts[1]: not a host name or [IPv6] address without a port: 'a b'");
    expect_error("admin_hosts: ['[fd00::1]:80']\n", 1,
                 "admin_hosts[0]: not a host name or [IPv6] address without a port: "
                 "'[fd00::1]:80'");
    expect_error("admin_hosts: ['[zz::1]']\n", 1,
                 "admin_hosts[0]: not a host name or [IPv6] address without a port: '[zz::1]'");
    expect_error("admin_hosts: example.com\n", 1,
                 "admin_hosts: expected a list, found a single value");
}

Test(config, validate_refuses_a_body_budget_below_one_body)
{
    cfg.max_request_bytes = 2048;
    cfg.max_buffered_bytes = 2047;
    expect_invalid("max_buffered_bytes: must be at least max_request_bytes (2048 bytes)");
    cfg.max_buffered_bytes = 2048;
    cr_assert_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

Test(config, validate_refuses_max_connections_out_of_range)
{
    cfg.max_connections = 0;
    expect_invalid("max_connections: must be a whole number from 1 to 1000000");
}

/* ---- matching ------------------------------------------------------------ */

static const idem_route_t *match(const char *method, const char *target)
{
    return idem__config_match(&cfg, method, strlen(method), target, strlen(target));
}

Test(config, default_route_matches_post_and_patch_only)
{
    cr_assert_eq(match("POST", "/anything"), &cfg.routes[0]);
    cr_assert_eq(match("PATCH", "/"), &cfg.routes[0]);
    cr_assert_null(match("GET", "/anything"));
    cr_assert_null(match("PUT", "/anything"));
}

Test(config, method_match_is_case_sensitive)
{
    cr_assert_null(match("post", "/anything"));
}

Test(config, first_matching_route_wins)
{
    cr_assert_eq(load("routes:\n"
                      "  - {methods: [POST], path: /payments/refunds, mode: off}\n"
                      "  - {methods: [POST], path: /payments, mode: token}\n"
                      "  - {methods: [POST, PUT], path: /, mode: optional}\n"),
                 0, "%s", err);
    cr_assert_eq(match("POST", "/payments/refunds/7"), &cfg.routes[0]);
    cr_assert_eq(match("POST", "/payments/7"), &cfg.routes[1]);
    cr_assert_eq(match("PUT", "/payments/7"), &cfg.routes[2]);
    cr_assert_eq(match("POST", "/other"), &cfg.routes[2]);
    cr_assert_null(match("PATCH", "/other"));
}

Test(config, path_is_a_plain_byte_prefix)
{
    cr_assert_eq(load("routes:\n  - {methods: [POST], path: /pay}\n"), 0, "%s", err);
    cr_assert_not_null(match("POST", "/pay"));
    cr_assert_not_null(match("POST", "/payments"));
    cr_assert_null(match("POST", "/pa"));
    cr_assert_null(match("POST", "/Pay"));
}

Test(config, query_string_is_not_part_of_the_path)
{
    cr_assert_eq(load("routes:\n  - {methods: [POST], path: /a/b}\n"), 0, "%s", err);
    cr_assert_null(match("POST", "/a?/b"));
    cr_assert_not_null(match("POST", "/a/b?x=1"));
}

Test(config, only_a_normalised_origin_form_path_matches)
{
    /* The server normalises every target first (idem__http_target_normalize);
     * what is left here never matches by accident. */
    cr_assert_eq(load("routes:\n  - {methods: [POST], path: /}\n"), 0, "%s", err);
    cr_assert_null(match("POST", "http://example.com/a/1?x"));
    cr_assert_null(match("POST", "http:/a"));
    cr_assert_null(match("POST", "*"));
    cr_assert_null(match("POST", ""));
    cr_assert_not_null(match("POST", "/"));
}

Test(config, escapes_match_what_they_decode_to)
{
    cr_assert_eq(load("routes:\n  - {methods: [POST], path: '/v1/orders:cancel'}\n"), 0, "%s",
                 err);
    cr_assert_not_null(match("POST", "/v1/orders:cancel"));
    cr_assert_not_null(match("POST", "/v1/orders%3Acancel/7"));
    cr_assert_null(match("POST", "/v1/orders%3Bcancel"));
}

Test(config, route_path_is_kept_normalised)
{
    cr_assert_eq(load("routes:\n  - {methods: [POST], path: '/v1/%70ay%3a'}\n"), 0, "%s", err);
    cr_assert_str_eq(cfg.routes[0].path, "/v1/pay%3A");
    cr_assert_not_null(match("POST", "/v1/pay:x"));
    cr_assert_eq(load("routes:\n  - {methods: [POST], path: /a/.}\n"), 0,
                 "a prefix may end in a partial segment: %s", err);
    cr_assert_not_null(match("POST", "/a/.well-known"));
}

Test(config, route_path_that_no_request_can_have_is_refused)
{
    expect_error("routes:\n  - path: /a/../b\n", 2,
                 "routes[0].path: has a '.' or '..' segment, which no request path can have: "
                 "'/a/../b'");
    expect_error("routes:\n  - path: /a/%2e/\n", 2,
                 "routes[0].path: has a '.' or '..' segment, which no request path can have: "
                 "'/a/%2e/'");
    expect_error("routes:\n  - path: //a\n", 2,
                 "routes[0].path: has an empty segment ('//'), which no request path can have: "
                 "'//a'");
    expect_error("routes:\n  - path: /a%2Fb\n", 2,
                 "routes[0].path: has an encoded '/' or a '\\', which no request path can have: "
                 "'/a%2Fb'");
    expect_error("routes:\n  - path: /a;b\n", 2,
                 "routes[0].path: has a ';' (path parameters), which no request path can have: "
                 "'/a;b'");
    expect_error("routes:\n  - path: /a%zz\n", 2,
                 "routes[0].path: has a '%' not followed by two hex digits, which no request "
                 "path can have: '/a%zz'");
    expect_error("routes:\n  - path: /a%00\n", 2,
                 "routes[0].path: has an encoded NUL (%00), which no request path can have: "
                 "'/a%00'");
}

Test(config, method_length_is_respected)
{
    /* the method slice is not NUL-terminated in a request buffer */
    cr_assert_null(idem__config_match(&cfg, "POSTX", 5, "/", 1));
    cr_assert_not_null(idem__config_match(&cfg, "POSTX", 4, "/", 1));
}

/* ---- scope sources and scope_rate_limit ------------------------------------ */

Test(config, scope_is_empty_and_rate_limit_off_by_default)
{
    cr_expect_eq(cfg.n_scope, 0);
    cr_expect_str_eq(cfg.scope_header, "Authorization");
    cr_expect_eq(cfg.scope_rate_limit.count, 0);
}

Test(config, scope_list_is_read_in_order)
{
    cr_assert_eq(load("scope: [header:X-Org, cookie:sid, authorization]\n"), 0, "%s", err);
    cr_assert_eq(cfg.n_scope, 3);
    cr_expect_eq(cfg.scope[0].kind, IDEM_SCOPE_SRC_HEADER);
    cr_expect_str_eq(cfg.scope[0].name, "X-Org");
    cr_expect_eq(cfg.scope[1].kind, IDEM_SCOPE_SRC_COOKIE);
    cr_expect_str_eq(cfg.scope[1].name, "sid");
    cr_expect_eq(cfg.scope[2].kind, IDEM_SCOPE_SRC_AUTHORIZATION);
}

Test(config, scope_errors_name_the_entry)
{
    expect_error("scope: []\n", 1,
                 "scope: must list at least one source ([authorization] is the default)");
    expect_error("scope: authorization\n", 1, "scope: expected a list, found a single value");
    expect_error("scope:\n  - authorization\n  - bearer\n", 3,
                 "scope[1]: not a scope source (authorization, header:NAME, cookie:NAME, "
                 "jwt:CLAIM, client_cert): 'bearer'");
    expect_error("scope: [\"header:a b\"]\n", 1, "scope[0]: not a header name: 'header:a b'");
    expect_error("scope: [cookie:sid, cookie:sid]\n", 1, "scope[1]: source given twice: 'cookie:sid'");
    expect_error("scope: [header:X-A, header:x-a]\n", 1, "scope[1]: source given twice: 'header:x-a'");
    expect_error("scope: [authorization, header:Authorization]\n", 1,
                 "scope[1]: source given twice: 'header:Authorization'");
    expect_error("scope: [a, b, c, d, e, f, g, h, i]\n", 1, "scope: too many entries (at most 8)");
}

Test(config, cookie_names_differing_in_case_are_two_sources)
{
    cr_expect_eq(load("scope: [cookie:sid, cookie:SID]\n"), 0, "%s", err);
    cr_expect_eq(cfg.n_scope, 2);
}

Test(config, jwt_needs_jwt_keys_or_jwt_secret_file)
{
    cr_assert_eq(load("scope: [jwt:org.id]\n"), 0, "%s", err);
    cr_expect_eq(cfg.scope[0].kind, IDEM_SCOPE_SRC_JWT);
    expect_invalid("scope: jwt:org.id needs jwt_keys or jwt_secret_file");
    cr_assert_eq(load("scope: [jwt:sub]\njwt_keys: /etc/idem/jwks.json\n"), 0, "%s", err);
    cr_expect_str_eq(cfg.jwt_keys, "/etc/idem/jwks.json");
    cr_expect_null(cfg.jwt_secret_file);
    cr_assert_eq(load("scope: [jwt:sub]\njwt_secret_file: hs\n"), 0, "%s", err);
    cr_expect_str_eq(cfg.jwt_secret_file, "hs");
}

Test(config, jwt_key_files_must_not_be_empty)
{
    cr_expect_eq(load("jwt_keys: ''\n"), -1);
    cr_expect_not_null(strstr(err, "jwt_keys: must not be empty"), "%s", err);
}

Test(config, scope_missing_is_fallback_or_reject)
{
    cr_assert_eq(load("scope: [header:X-User]\n"), 0, "%s", err);
    cr_expect_eq(cfg.scope_missing, IDEM_SCOPE_MISSING_FALLBACK);
    cr_assert_eq(load("scope: [header:X-User]\nscope_missing: reject\n"), 0, "%s", err);
    cr_expect_eq(cfg.scope_missing, IDEM_SCOPE_MISSING_REJECT);
    cr_expect_eq(load("scope_missing: drop\n"), -1);
    cr_expect_not_null(strstr(err, "scope_missing: must be one of fallback, reject"), "%s", err);
}

Test(config, client_cert_needs_listen_tls_client_ca_file)
{
    cr_assert_eq(load("scope:\n  - authorization\n  - client_cert\n"), 0, "%s", err);
    cr_expect_eq(cfg.scope[1].kind, IDEM_SCOPE_SRC_CLIENT_CERT);
    expect_invalid("scope: client_cert needs listen_tls.client_ca_file");
    cr_expect_str_eq(err, "scope: client_cert needs listen_tls.client_ca_file");
    /* A TLS listener that asks for no client certificate is not enough. */
    cr_assert_eq(load("listen_tls: {address: '127.0.0.1:8443', cert_file: s.pem, "
                      "key_file: s.key}\n"),
                 0, "%s", err);
    expect_invalid("scope: client_cert needs listen_tls.client_ca_file");
    cr_assert_eq(load("listen_tls: {address: '127.0.0.1:8443', cert_file: s.pem, "
                      "key_file: s.key, client_ca_file: ca.pem}\n"),
                 0, "%s", err);
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

/* ---- limits and TLS (issue 19) ---------------------------------------------- */

Test(config, max_queued_bytes_and_max_connections_per_address_are_read)
{
    cr_assert_eq(load("max_queued_bytes: 8MiB\nmax_connections_per_address: 32\n"), 0, "%s", err);
    cr_expect_eq(cfg.max_queued_bytes, 8u * 1024 * 1024);
    cr_expect_eq(cfg.max_connections_per_address, 32);
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(load("max_connections_per_address: 0\n"), 0, "%s", err);
    cr_expect_eq(cfg.max_connections_per_address, 0);
    expect_error("max_queued_bytes: 0\n", 1, "max_queued_bytes: must be at least 1 byte");
    expect_error("max_queued_bytes: lots\n", 1, "max_queued_bytes: not a size: 'lots'");
    expect_error("max_connections_per_address: -1\n", 1,
                 "max_connections_per_address: must be a whole number from 0 to 1000000");
    cfg.max_queued_bytes = 0;
    expect_invalid("max_queued_bytes: must be at least 1 byte");
}

Test(config, listen_tls_is_read)
{
    cr_assert_eq(load("listen_tls:\n"
                      "  address: '[::1]:8443'\n"
                      "  cert_file: /etc/idem/server.pem\n"
                      "  key_file: /etc/idem/server.key\n"
                      "  client_ca_file: /etc/idem/clients.pem\n"),
                 0, "%s", err);
    cr_expect_str_eq(cfg.listen_tls_address, "[::1]:8443");
    cr_expect_str_eq(cfg.listen_tls_cert_file, "/etc/idem/server.pem");
    cr_expect_str_eq(cfg.listen_tls_key_file, "/etc/idem/server.key");
    cr_expect_str_eq(cfg.listen_tls_client_ca_file, "/etc/idem/clients.pem");
    /* The files are the TLS loader's to open: missing ones pass here. */
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
}

Test(config, listen_tls_needs_address_cert_and_key)
{
    /* Reported at the mapping's first line. */
    expect_error("listen_tls:\n  address: '127.0.0.1:8443'\n  cert_file: s.pem\n", 2,
                 "listen_tls: needs address, cert_file and key_file (key_file missing)");
    expect_error("listen_tls:\n  cert_file: s.pem\n  key_file: s.key\n", 2,
                 "listen_tls: needs address, cert_file and key_file (address missing)");
    expect_error("listen_tls:\n  address: 8443\n", 2,
                 "listen_tls.address: not HOST:PORT (port 1-65535, IPv6 in brackets): '8443'");
    expect_error("listen_tls:\n  port: 8443\n", 2, "listen_tls.port: unknown key");
    expect_error("listen_tls: 127.0.0.1:8443\n", 1,
                 "listen_tls: expected a mapping of keys, found a single value");
    expect_error("listen_tls:\n  address: '127.0.0.1:8443'\n  cert_file: ''\n", 3,
                 "listen_tls.cert_file: must not be empty");
}

Test(config, validate_checks_listen_tls)
{
    idem__config_set_string(&cfg.listen_tls_address, "127.0.0.1:8443");
    expect_invalid("listen_tls: needs cert_file and key_file with address");
    idem__config_set_string(&cfg.listen_tls_cert_file, "s.pem");
    idem__config_set_string(&cfg.listen_tls_key_file, "s.key");
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
    idem__config_set_string(&cfg.listen_tls_address, cfg.listen);
    expect_invalid("listen_tls.address: must not be the same address as listen or admin");
    idem__config_set_string(&cfg.listen_tls_address, cfg.admin);
    expect_invalid("listen_tls.address: must not be the same address as listen or admin");
    idem__config_set_string(&cfg.listen_tls_address, "nope");
    expect_invalid("listen_tls.address: not HOST:PORT");
    idem__config_set_string(&cfg.listen_tls_address, NULL);
    expect_invalid("listen_tls: needs address");
}

Test(config, upstream_tls_is_read)
{
    cr_assert_eq(load("upstream: https://api.internal:8443\n"
                      "upstream_tls:\n"
                      "  ca_file: /etc/idem/ca.pem\n"
                      "  cert_file: /etc/idem/me.pem\n"
                      "  key_file: /etc/idem/me.key\n"
                      "  server_name: api.internal\n"
                      "  verify: false\n"),
                 0, "%s", err);
    cr_expect_str_eq(cfg.upstream_tls_ca_file, "/etc/idem/ca.pem");
    cr_expect_str_eq(cfg.upstream_tls_cert_file, "/etc/idem/me.pem");
    cr_expect_str_eq(cfg.upstream_tls_key_file, "/etc/idem/me.key");
    cr_expect_str_eq(cfg.upstream_tls_server_name, "api.internal");
    cr_expect_not(cfg.upstream_tls_verify);
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(load("upstream_tls: {verify: true}\n"), 0, "%s", err);
    cr_expect(cfg.upstream_tls_verify);
}

Test(config, upstream_tls_refusals)
{
    expect_error("upstream_tls:\n  cert_file: me.pem\n", 2,
                 "upstream_tls: cert_file and key_file go together (a client certificate and "
                 "its key): write both or neither");
    expect_error("upstream_tls:\n  verify: no\n", 2,
                 "upstream_tls.verify: must be one of false, true");
    expect_error("upstream_tls:\n  server_name: 'a b'\n", 2,
                 "upstream_tls.server_name: not a host name or [IPv6] address without a port: "
                 "'a b'");
    expect_error("upstream_tls:\n  sni: a\n", 2, "upstream_tls.sni: unknown key");
    /* upstream_tls beside a plain upstream would be silently unused.  (A
     * failed load leaves cfg partly updated: start again.) */
    idem__config_cleanup(&cfg);
    cr_assert_eq(idem__config_defaults(&cfg), 0);
    cr_assert_eq(load("upstream_tls: {ca_file: ca.pem}\n"), 0, "%s", err);
    expect_invalid("upstream_tls: written, but the upstream is not https://");
    idem__config_set_string(&cfg.upstream_tls_ca_file, NULL);
    cfg.upstream_tls_verify = false;
    expect_invalid("upstream_tls: written, but the upstream is not https://");
    cfg.upstream_tls_verify = true;
    cr_expect_eq(idem__config_validate(&cfg, err, sizeof err), 0, "%s", err);
    idem__config_set_string(&cfg.upstream, "https://a:1");
    idem__config_set_string(&cfg.upstream_tls_key_file, "me.key");
    expect_invalid("upstream_tls: cert_file and key_file go together");
}

Test(config, scope_and_scope_header_together_are_refused)
{
    expect_error("scope_header: X-Api-Key\nscope: [cookie:sid]\n", 2,
                 "scope: scope and scope_header both name the caller; write scope_header: X "
                 "as scope: [header:X]");
    expect_error("scope: [cookie:sid]\nscope_header: X-Api-Key\n", 1,
                 "scope: scope and scope_header both name the caller; write scope_header: X "
                 "as scope: [header:X]");
}

Test(config, scope_rate_limit_is_read)
{
    cr_assert_eq(load("scope_rate_limit: 200/s\n"), 0, "%s", err);
    cr_expect_eq(cfg.scope_rate_limit.count, 200);
    cr_expect_eq(cfg.scope_rate_limit.period_ms, 1000);
    cr_assert_eq(load("scope_rate_limit: off\n"), 0, "%s", err);
    cr_expect_eq(cfg.scope_rate_limit.count, 0);
    expect_error("scope_rate_limit: 200\n", 1,
                 "scope_rate_limit: not a rate (N/s, N/m or N/h with N from 1 to 1000000, or "
                 "off): '200'");
    expect_error("scope_rate_limit: 0/s\n", 1,
                 "scope_rate_limit: not a rate (N/s, N/m or N/h with N from 1 to 1000000, or "
                 "off): '0/s'");
}

/* ---- the table of keys, and what SIGHUP keeps ---------------------------- */

Test(config, the_key_list_names_every_key_once_with_its_sighup_behaviour)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    idem__config_list_keys(f);
    fclose(f);
    static const char *const want[] = {
        "listen\trestart\t127.0.0.1:8080\t", "workers\trestart\tauto\t",
        "defaults.key_ttl\tyes\t24h\t", "routes[].methods\tyes\t[POST, PATCH]\t",
        "listen_tls.address\trestart\tnone\t", "listen_tls.cert_file\tyes\tnone\t",
        "upstream_tls.verify\trestart\ttrue\t", "routes\tyes\t-\t",
        "listen_tls\tpartly\tnone\t", "scope\tyes\t[authorization]\t",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char line[128];
        snprintf(line, sizeof line, "\n%s", want[i]);
        const char *at = strstr(text, line);
        if (strncmp(text, want[i], strlen(want[i])) != 0)
            cr_assert_not_null(at, "no line %s in:\n%s", want[i], text);
        if (at != NULL)
            cr_assert_null(strstr(at + 1, line), "%s listed twice", want[i]);
    }
    free(text);
}

Test(config, keep_restart_keys_keeps_the_running_values_and_names_them)
{
    static idem_config_t next;
    char changed[256];
    cr_assert_eq(idem__config_defaults(&next), 0);
    idem__config_set_string(&next.listen, "127.0.0.1:9999");
    next.workers = 4;
    next.defaults.key_ttl_ms = 1000;
    idem__config_set_string(&next.log_format, "json");
    idem__config_set_string(&next.admin_hosts[0], "example.com");
    next.n_admin_hosts = 1;
    cr_assert_eq(idem__config_keep_restart_keys(&next, &cfg, changed, sizeof changed), 0);
    cr_assert_str_eq(changed, "listen, workers, admin_hosts");
    cr_assert_str_eq(next.listen, "127.0.0.1:8080");
    cr_assert_eq(next.workers, IDEM_WORKERS_AUTO); /* the running (default) value */
    cr_assert_eq(next.n_admin_hosts, 0);
    /* what SIGHUP applies stays as the file said */
    cr_assert_eq(next.defaults.key_ttl_ms, 1000);
    cr_assert_str_eq(next.log_format, "json");
    cr_assert_eq(idem__config_keep_restart_keys(&next, &cfg, changed, sizeof changed), 0);
    cr_assert_str_eq(changed, "", "nothing left to keep");
    idem__config_cleanup(&next);
}

Test(config, a_shared_config_is_freed_by_its_last_holder)
{
    idem_config_t *c = idem__config_new();
    cr_assert_not_null(c);
    cr_assert_str_eq(c->listen, "127.0.0.1:8080");
    cr_assert_eq(idem__config_ref(c), c);
    idem__config_unref(c);
    cr_assert_str_eq(c->listen, "127.0.0.1:8080", "one holder left: still there");
    idem__config_unref(c); /* the last: freed (ASan sees a leak or a double free) */
    idem__config_unref(NULL);
}
