/* src/gateway/policy.c - the published policy document (policy.h).
 *
 * Built with jansson, as the admin's JSON and the problems are, so every
 * string (a path, a header name, a pointer) is escaped by one writer.  The
 * document is built on each request: it is small (a few hundred bytes a
 * route, 256 routes at most) and rarely asked for, and building it from the
 * configuration each time keeps one source of truth.
 *
 * THREADING: reads the configuration only, which no thread changes once
 * idemd runs.
 */
#include <limits.h>
#include <stdlib.h>

#include <jansson.h>

#include "gateway/policy.h"

static const char *const mode_names[] = {"required", "optional", "token", "off"};
static const char *const conflict_names[] = {"reject", "wait"};
static const char *const fpbody_names[] = {"raw", "json"};

/* Milliseconds as seconds: an integer when whole, else a fraction. */
static json_t *seconds(int64_t ms)
{
    if (ms % 1000 == 0)
        return json_integer((json_int_t)(ms / 1000));
    return json_real((double)ms / 1000.0);
}

static json_t *bytes(uint64_t n)
{
    return json_integer(n > (uint64_t)LLONG_MAX ? LLONG_MAX : (json_int_t)n);
}

/* Set key of obj to v (stolen); false when v is NULL or the set fails. */
static bool put(json_t *obj, const char *key, json_t *v)
{
    return v != NULL && json_object_set_new(obj, key, v) == 0;
}

static json_t *route_object(const idem_route_t *r)
{
    const idem_policy_t *p = &r->policy;
    char key_from[300]; /* config.c: key_from is at most 256 characters */
    json_t *o = json_object(), *methods = json_array(), *statuses = json_array();
    bool ok = o != NULL && methods != NULL && statuses != NULL;
    for (size_t i = 0; ok && i < r->n_methods; i++)
        ok = json_array_append_new(methods, json_string(r->methods[i])) == 0;
    for (size_t i = 0; ok && i < p->n_release_statuses; i++)
        ok = json_array_append_new(statuses, json_integer(p->release_statuses[i])) == 0;
    if (ok) {
        ok = put(o, "methods", methods);
        methods = NULL;
    }
    ok = ok && put(o, "path", json_string(r->path)) &&
         put(o, "mode", json_string(mode_names[r->mode])) &&
         put(o, "key_from",
             json_string(idem__config_key_from_text(p, key_from, sizeof key_from))) &&
         put(o, "key_ttl", seconds(p->key_ttl_ms)) &&
         put(o, "failure_ttl", seconds(p->failure_ttl_ms)) &&
         put(o, "lease", seconds(p->lease_ms)) &&
         put(o, "on_conflict", json_string(conflict_names[p->on_conflict])) &&
         put(o, "fingerprint_body", json_string(fpbody_names[p->fingerprint_body])) &&
         put(o, "max_response_bytes", bytes(p->max_response_bytes));
    if (ok) {
        ok = put(o, "release_statuses", statuses);
        statuses = NULL;
    }
    json_decref(methods);
    json_decref(statuses);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *idem__policy_document(const idem_config_t *cfg)
{
    json_t *doc = json_object(), *routes = json_array();
    bool ok = doc != NULL && routes != NULL;
    for (size_t i = 0; ok && i < cfg->n_routes; i++) {
        json_t *r = route_object(&cfg->routes[i]);
        ok = r != NULL && json_array_append_new(routes, r) == 0;
    }
    char *text = NULL;
    if (ok && json_object_set_new(doc, "routes", routes) == 0) {
        routes = NULL;
        text = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_decref(routes);
    json_decref(doc);
    return text;
}
