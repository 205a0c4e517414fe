"""idemctl conformance: the checks against the real idemd, and against servers that break them.

  idemctl conformance URL [--path P] [--method M] [--body JSON] [--marker NAME]
                          [--timeout S] [--json] [-H 'Name: v']...

prints one line per check ("PASS name", "FAIL name: ...", "SKIP name: ...")
and exits 0 when no check failed, 1 when one did, 2 on a usage error or a
URL that does not answer (docs/conformance.md).

IdemdConforms runs it against idemd in front of the harness's upstream, so
CI checks idemd against the draft on every run.  WrongServers runs it
against small Python servers written here, each wrong in one way (runs
duplicates twice, replays another body, has no replay marker, ...), and
requires the FAIL of the check that names the fault, and exit 1; a correct
one of them, which publishes a policy and links to it, passes every check,
so the policy and link checks are exercised before idemd serves them.

Verdicts depend on what was answered, never on timing: the wrong servers
are wrong on every request, not only when requests race.
"""

import json
import os
import subprocess
import threading
import time
import unittest
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    from . import harness as h
except ImportError:
    import harness as h

IDEMCTL = os.environ.get("IDEMCTL") or str(h.REPO / "build" / "idemctl")
CHECKS = ["missing-key", "concurrent", "replay", "replay-marker", "key-reuse", "problem-json",
          "policy", "policy-claims", "link"]
REQUIRED = {"missing-key", "concurrent", "replay", "key-reuse"}


class Run:
    def __init__(self, argv, rc, out, err):
        self.argv = argv
        self.rc = rc
        self.out = out.decode("utf-8", "replace")
        self.err = err.decode("utf-8", "replace")

    @property
    def verdicts(self):
        """{check: (PASS|FAIL|SKIP, detail)} from the lines on stdout."""
        out = {}
        for line in self.out.splitlines():
            word, _, rest = line.partition(" ")
            name, _, detail = rest.partition(": ")
            out[name] = (word, detail)
        return out

    def __repr__(self):
        return "<idemctl %r rc=%d out=%r err=%r>" % (self.argv[1:], self.rc, self.out,
                                                      self.err[-1500:])


class ConfTestCase(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        if not os.path.exists(IDEMCTL):
            self.fail("idemctl binary not found at %s (set $IDEMCTL)" % IDEMCTL)
        self.env = {k: v for k, v in os.environ.items()
                    if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}

    def conformance(self, url, *args, timeout=120.0):
        argv = [IDEMCTL, "conformance", url] + [str(a) for a in args]
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                           stdin=subprocess.DEVNULL, timeout=timeout)
        r = Run(argv, p.returncode, p.stdout, p.stderr)
        for marker in h.SANITIZER_MARKERS:
            self.assertNotIn(marker, r.err, "sanitizer report from %r" % (r,))
        self.assertGreaterEqual(r.rc, 0, "idemctl died of a signal: %r" % (r,))
        return r

    def assertLines(self, r):
        """Every check has exactly one line, in the documented order and form."""
        lines = r.out.splitlines()
        self.assertEqual([l.split(" ")[1].rstrip(":") for l in lines], CHECKS, repr(r))
        for line in lines:
            self.assertRegex(line, r"^(PASS [a-z-]+|(FAIL|SKIP) [a-z-]+: .+)$", repr(r))

    def assertVerdict(self, r, check, word):
        v = r.verdicts
        self.assertIn(check, v, repr(r))
        self.assertEqual(v[check][0], word, "%s: expected %s: %r" % (check, word, r))

    def assertFailsOnly(self, r, check):
        """The run failed on check, exit 1, the stderr line names it."""
        self.assertLines(r)
        self.assertVerdict(r, check, "FAIL")
        self.assertEqual(r.rc, 1, repr(r))
        self.assertEqual(len(r.err.splitlines()), 1, repr(r))
        self.assertTrue(r.err.startswith("idemctl: conformance: failed: "), repr(r))
        self.assertIn(check, r.err)


# --------------------------------------------------------------------------
# against idemd


class IdemdConforms(ConfTestCase):
    def start_idemd(self, config=None):
        up = h.Upstream()
        self.addCleanup(up.close)
        d = h.Idemd(self.tmp, up.url, config=config).start()
        self.addCleanup(d.stop)
        return up, d

    def policy_served(self, d):
        """Whether this idemd serves GET /_idem/policy (SPEC section 18)
        itself: a 200 JSON document with routes (before it does, the GET is
        forwarded to the upstream, whose 200 is no policy)."""
        r = d.request("GET", "/_idem/policy")
        try:
            return r.status == 200 and "routes" in r.json()
        except ValueError:
            return False

    def test_idemd_passes_the_checks_it_meets(self):
        up, d = self.start_idemd()
        r = self.conformance("http://%s:%d" % (h.HOST, d.port), "--path", "/pay")
        self.assertLines(r)
        for check in ("missing-key", "concurrent", "replay", "replay-marker", "key-reuse",
                      "problem-json"):
            self.assertVerdict(r, check, "PASS")
        # One execution for the key of the concurrent copies and its replay,
        # none for the keyless request and the reused key.
        ran = [s.key for s in up.requests() if s.method == "POST"]
        self.assertEqual(len(ran), 1, "the upstream ran %r" % (ran,))
        self.assertIsNotNone(ran[0])
        # idemd publishes its policy (SPEC section 18): the policy, its
        # claims and the Link on every problem hold.
        self.assertTrue(self.policy_served(d))
        for check in ("policy", "policy-claims", "link"):
            self.assertVerdict(r, check, "PASS")
        self.assertEqual(r.rc, 0, repr(r))
        self.assertEqual(r.err, "", repr(r))

    def test_json_report(self):
        up, d = self.start_idemd()
        r = self.conformance("http://%s:%d/pay" % (h.HOST, d.port), "--json")
        doc = json.loads(r.out)
        self.assertEqual([c["name"] for c in doc["checks"]], CHECKS)
        for c in doc["checks"]:
            self.assertEqual(c["level"], "required" if c["name"] in REQUIRED else "recommended")
            self.assertIn(c["result"], ("pass", "fail", "skip"))
        self.assertEqual(doc["url"], "http://%s:%d/pay" % (h.HOST, d.port))
        self.assertEqual(doc["passed"], r.rc == 0)
        self.assertTrue(all(c["result"] == "pass" for c in doc["checks"]
                            if c["name"] in REQUIRED), repr(r))

    def test_a_stripe_marker_is_asked_for_by_name(self):
        up, d = self.start_idemd()
        r = self.conformance("http://%s:%d" % (h.HOST, d.port), "--path", "/pay", "--marker",
                             "Idempotent-Replayed")
        # idemd marks replays with X-Idempotent-Replay unless replay_marker
        # says otherwise: the named marker is missing.
        self.assertFailsOnly(r, "replay-marker")
        self.assertIn("Idempotent-Replayed", r.verdicts["replay-marker"][1])
        self.assertVerdict(r, "replay", "PASS")

    def test_an_optional_route_is_not_required_to_refuse_a_keyless_request(self):
        up, d = self.start_idemd({"routes": [{"methods": ["POST"], "path": "/",
                                              "mode": "optional"}]})
        r = self.conformance("http://%s:%d/pay" % (h.HOST, d.port))
        # The published policy says the key is optional there: a keyless
        # request that runs is no failure.
        self.assertTrue(self.policy_served(d))
        self.assertVerdict(r, "missing-key", "SKIP")
        self.assertVerdict(r, "policy-claims", "PASS")

    def test_a_url_that_does_not_answer_is_exit_2(self):
        port = h.dead_port()
        r = self.conformance("http://%s:%d" % (h.HOST, port), "--timeout", "5")
        self.assertEqual(r.rc, 2, repr(r))
        self.assertEqual(r.out, "")
        self.assertEqual(len(r.err.splitlines()), 1, repr(r))
        self.assertIn("no answer", r.err)
        self.assertIn("connection refused", r.err)

    def test_usage_errors_are_exit_2(self):
        for args in ([], ["http://x", "--path", "pay"], ["http://x", "--timeout", "0"],
                     ["http://x", "--marker", "a b"], ["http://x", "--max-time", "1"],
                     ["ftp://x"], ["http://x", "-H", "Idempotency-Key: k"]):
            argv = [IDEMCTL, "conformance"] + args
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=self.env, timeout=30)
            self.assertEqual(p.returncode, 2, "%r: %r" % (args, p))
            self.assertEqual(len(p.stderr.splitlines()), 1, "%r: %r" % (args, p))
            self.assertEqual(p.stdout, b"")


# --------------------------------------------------------------------------
# against servers that are wrong on purpose


class FakeApi:
    """An idempotent POST API in a few lines, with switches that break it.

    Correct: a keyless POST is 400 problem+json; a key's first request runs
    (a counter makes every execution's body different) and is stored; a
    repeat is answered the stored answer with the marker, a repeat with
    another body 422, a repeat while the first runs 409.  Each switch makes
    it wrong on every request it touches, so no verdict depends on which
    copy of the concurrent check comes first."""

    def __init__(self, faults=(), marker="X-Idempotent-Replay", policy=None, link=None,
                 policy_path="/_idem/policy"):
        self.faults = set(faults)
        self.marker = marker
        self.policy = policy
        self.policy_path = policy_path
        self.link = policy is not None if link is None else link
        self.lock = threading.Lock()
        self.records = {}  # key -> ("running", body) | ("done", body, status, headers, data)
        self.executions = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def send(self, status, body, headers=()):
                self.send_response(status)
                for n, v in headers:
                    self.send_header(n, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def problem(self, status, ptype):
                headers = [("Content-Type", "application/problem+json")]
                if api.link:
                    headers.append(("Link", '<%s>; rel="describedby"; type="application/json"'
                                    % api.policy_path))
                body = json.dumps({"type": "urn:fake:" + ptype, "title": ptype,
                                   "status": status}).encode()
                if "text-errors" in api.faults:
                    headers[0] = ("Content-Type", "text/plain")
                    body = ptype.encode()
                self.send(status, body, headers)

            def do_GET(self):
                if self.path == api.policy_path and api.policy is not None:
                    self.send(200, json.dumps(api.policy).encode(),
                              [("Content-Type", "application/json")])
                else:
                    self.send(404, b"not found", [("Content-Type", "text/plain")])

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                key = self.headers.get("Idempotency-Key")
                if key is None and "no-missing-key" not in api.faults:
                    return self.problem(400, "missing-key")
                run = True
                with api.lock:
                    rec = api.records.get(key) if key else None
                    if "run-twice" in api.faults:
                        rec = None
                    if rec is not None:
                        run = False
                        if rec[1] != body and "no-fingerprint" not in api.faults:
                            state = "reuse"
                        elif rec[0] == "running":
                            state = "running"
                        else:
                            state = "done"
                    elif key:
                        api.records[key] = ("running", body)
                    api.executions += run
                    n_exec = api.executions
                if not run:
                    if state == "reuse":
                        return self.problem(422, "key-reused")
                    if state == "running":
                        return self.problem(409, "in-flight")
                    _, _, status, headers, data = rec
                    if "replay-other-body" in api.faults:
                        data = data + b" (replayed)"
                    if "no-marker" not in api.faults:
                        headers = headers + [(api.marker, "true")]
                    return self.send(status, data, headers)
                data = json.dumps({"execution": n_exec, "id": uuid.uuid4().hex}).encode()
                headers = [("Content-Type", "application/json"), ("X-Order", str(n_exec))]
                if key:
                    with api.lock:
                        api.records[key] = ("done", body, 201, headers, data)
                self.send(201, data, headers)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server((h.HOST, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = "http://%s:%d" % (h.HOST, self.port)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def policy(mode="required", **extra):
    route = {"methods": ["POST", "PATCH"], "path": "/", "mode": mode,
             "key_from": "header:Idempotency-Key", "key_ttl": 86400, "failure_ttl": 300,
             "lease": 30, "on_conflict": "reject", "fingerprint_body": "raw",
             "max_response_bytes": 1048576, "release_statuses": [429, 503]}
    route.update(extra)
    return {"routes": [route]}


class WrongServers(ConfTestCase):
    def api(self, **kw):
        api = FakeApi(**kw)
        self.addCleanup(api.close)
        return api

    def test_a_correct_server_with_a_policy_passes_every_check(self):
        api = self.api(policy=policy())
        r = self.conformance(api.url + "/orders")
        self.assertLines(r)
        for check in CHECKS:
            self.assertVerdict(r, check, "PASS")
        self.assertEqual(r.rc, 0, repr(r))
        self.assertEqual(api.executions, 1)

    def test_duplicates_run_twice(self):
        api = self.api(faults={"run-twice"})
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "concurrent")
        self.assertIn("two different answers", r.verdicts["concurrent"][1])
        self.assertVerdict(r, "replay", "FAIL")

    def test_a_replay_with_another_body(self):
        api = self.api(faults={"replay-other-body"})
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "replay")
        self.assertIn("another body", r.verdicts["replay"][1])

    def test_no_replay_marker(self):
        api = self.api(faults={"no-marker"})
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "replay-marker")
        self.assertEqual([c for c, v in r.verdicts.items() if v[0] == "FAIL"],
                         ["replay-marker"], repr(r))

    def test_another_marker_named_with_the_flag(self):
        api = self.api(marker="Idempotent-Replayed")
        r = self.conformance(api.url + "/orders", "--marker", "Idempotent-Replayed")
        self.assertVerdict(r, "replay-marker", "PASS")
        self.assertEqual(r.rc, 0, repr(r))
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "replay-marker")

    def test_a_keyless_request_runs(self):
        api = self.api(faults={"no-missing-key"})
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "missing-key")
        self.assertIn("ran without a key", r.verdicts["missing-key"][1])

    def test_a_reused_key_is_answered_the_first_answer(self):
        api = self.api(faults={"no-fingerprint"})
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "key-reuse")
        self.assertIn("first answer replayed", r.verdicts["key-reuse"][1])

    def test_errors_that_are_not_problem_json(self):
        api = self.api(faults={"text-errors"})
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "problem-json")

    def test_a_policy_whose_claims_do_not_hold(self):
        api = self.api(policy=policy(mode="optional"))
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "policy-claims")
        self.assertIn("mode optional", r.verdicts["policy-claims"][1])

    def test_a_policy_without_key_ttl(self):
        doc = policy()
        del doc["routes"][0]["key_ttl"]
        api = self.api(policy=doc)
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "policy")
        self.assertIn("key_ttl", r.verdicts["policy"][1])

    def test_a_policy_but_problems_without_the_link(self):
        api = self.api(policy=policy(), link=False)
        r = self.conformance(api.url + "/orders")
        self.assertFailsOnly(r, "link")

    def test_a_policy_found_only_through_the_link(self):
        # Nothing at /_idem/policy: the problem responses link to it.
        api = self.api(policy=policy(mode="optional"), policy_path="/docs/idempotency.json")
        r = self.conformance(api.url + "/orders")
        self.assertVerdict(r, "link", "PASS")
        self.assertVerdict(r, "policy", "PASS")
        doc = json.loads(self.conformance(api.url + "/orders", "--json").out)
        self.assertIn("/docs/idempotency.json",
                      [c["detail"] for c in doc["checks"] if c["name"] == "policy"][0])
        # ... and its claims are checked: it says optional, the keyless
        # request got 400.
        self.assertFailsOnly(r, "policy-claims")

    def test_no_policy_and_no_link_skips_the_published_checks(self):
        api = self.api(link=False)
        r = self.conformance(api.url + "/orders")
        self.assertLines(r)
        for check in ("policy", "policy-claims", "link"):
            self.assertVerdict(r, check, "SKIP")
        self.assertEqual(r.rc, 0, repr(r))


if __name__ == "__main__":
    unittest.main()
