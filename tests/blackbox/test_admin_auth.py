"""SPEC section 19 (issue 22): who may use the admin listener, how many
workers idemd runs by default, and the route label of idem_requests_total.

  admin_token_file: FILE   every admin request, /healthz and unknown paths
                           included, needs Authorization: Bearer <token>;
                           else 401 problem+json with WWW-Authenticate: Bearer.
                           The file: trailing newline dropped; empty, unreadable
                           or readable by other users: no start (exit 2).
  admin: not loopback      and no admin_token_file: no start (exit 2, one line).
  idemctl keys ...         --admin-token-file F or $IDEM_ADMIN_TOKEN_FILE.
  workers: auto            the default: one worker per CPU idemd may run on
                           (affinity mask, cgroup CPU quota), seen as the
                           idem_workers gauge and in the start line of the log.
  idem_requests_total      labelled route="<name>" (a route's name:), its index
                           when it has none, "none" when no route matched.

A loopback admin without a token stays open: test_admin.py and
test_idemctl.py run that way.
"""

import math
import os
import re
import shutil
import stat
import subprocess
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

IDEMCTL = os.environ.get("IDEMCTL") or str(h.REPO / "build" / "idemctl")
TOKEN = "t0ken-Of-the-admin_4f9c2e1a7b"


class AuthIdemd(h.Idemd):
    """An Idemd whose admin needs a token: it waits for /healthz and reads
    the admin with the token."""

    token = None

    def auth(self):
        return {"Authorization": "Bearer " + self.token} if self.token else {}

    def wait_ready(self, timeout=h.READY_TIMEOUT):
        def ready():
            rc = self.proc.poll()
            if rc is not None:
                raise AssertionError("idemd exited with %d before it was ready:\n%s"
                                     % (rc, self.log_text()[-3000:]))
            try:
                return self.started_listening() and h.request(
                    self.admin_port, "GET", "/healthz", headers=self.auth(),
                    timeout=1.0).status == 200
            except OSError:
                return False
        h.wait_until(ready, timeout, what="idemd's /healthz with the token")

    def admin(self, method, path, timeout=10.0):
        return h.request(self.admin_port, method, path, headers=self.auth(), timeout=timeout)


class PinnedIdemd(h.Idemd):
    """An Idemd run under taskset: its affinity mask is the CPUs given."""

    cpus = "0"

    def argv(self):
        return ["taskset", "-c", self.cpus] + super().argv()


def write_token_file(directory, text, mode=0o600, name="admin.token"):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def cgroup_cpus():
    """The CPUs a cgroup v2 quota allows this process, rounded up, or None."""
    path = None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    rel = line[3:].strip()
                    path = "/sys/fs/cgroup%s/cpu.max" % ("" if rel == "/" else rel)
    except OSError:
        pass
    for p in (path, "/sys/fs/cgroup/cpu.max"):
        if not p:
            continue
        try:
            with open(p) as f:
                quota, period = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        if quota == "max":
            return None
        return math.ceil(int(quota) / int(period))
    return None


def expected_auto_workers():
    n = len(os.sched_getaffinity(0))
    q = cgroup_cpus()
    if q is not None and q < n:
        n = q
    return max(1, min(n, 64))


# Every admin endpoint, with the status it gives once the token is right
# (no record stored: the /keys lookups are 404).  GET /keys is the list of
# SPEC section 19; the test holds whatever it answers, as long as it is not
# 401 with the token.
ENDPOINTS = [
    ("GET", "/healthz", 200),
    ("HEAD", "/healthz", 200),
    ("GET", "/readyz", 200),
    ("GET", "/metrics", 200),
    ("GET", "/keys/nothing-here", 404),
    ("DELETE", "/keys/nothing-here", 404),
    ("GET", "/keys?state=held", None),
    ("GET", "/no-such-endpoint", 404),
    ("POST", "/healthz", 405),
]


class AdminToken(h.IdemTestCase):
    def start_with_token(self, token_text=TOKEN + "\n", config=None, **kw):
        cfg = {"admin_token_file": write_token_file(self.tmp, token_text)}
        cfg.update(config or {})
        up = self.start_upstream()
        d = self.make_idemd(up, cfg, **kw)
        d.__class__ = AuthIdemd
        d.token = TOKEN
        d.start()
        return up, d

    def assertUnauthorized(self, r, invalid_token):
        self.assertEqual(r.status, 401, r)
        www = r.header("WWW-Authenticate") or ""
        self.assertTrue(www.startswith("Bearer "), "WWW-Authenticate of %r" % r)
        self.assertEqual('error="invalid_token"' in www, invalid_token, www)
        if r.body:  # HEAD has the head alone
            self.assertProblem(r, 401, "unauthorized")

    def test_every_endpoint_needs_the_token(self):
        up, d = self.start_with_token()
        wrong = [
            ("Bearer " + TOKEN[:-1], True),            # one byte short
            ("Bearer " + TOKEN + "x", True),           # one byte more
            ("Bearer " + TOKEN[:-1] + "X", True),      # same length, last byte differs
            ("Bearer X" + TOKEN[1:], True),            # same length, first byte differs
            ("Basic " + TOKEN, False),                 # another scheme
            ("Bearer", False),                         # no token
            (TOKEN, False),                            # no scheme
        ]
        for method, path, want in ENDPOINTS:
            with self.subTest(method=method, path=path):
                r = h.request(d.admin_port, method, path)
                self.assertUnauthorized(r, invalid_token=False)
                for value, invalid in wrong:
                    r = h.request(d.admin_port, method, path,
                                  headers={"Authorization": value})
                    self.assertUnauthorized(r, invalid_token=invalid)
                # the token twice: which one counts is not for idemd to guess
                r = h.request(d.admin_port, method, path,
                              headers=[("Authorization", "Bearer " + TOKEN),
                                       ("Authorization", "Bearer " + TOKEN)])
                self.assertUnauthorized(r, invalid_token=False)
                for scheme in ("Bearer", "bearer", "BEARER"):
                    r = h.request(d.admin_port, method, path,
                                  headers={"Authorization": "%s %s" % (scheme, TOKEN)})
                    self.assertNotEqual(r.status, 401, r)
                    if want is not None:
                        self.assertEqual(r.status, want, r)

    def test_refusals_are_counted(self):
        up, d = self.start_with_token()
        before = h.metric_sum(d.metrics(), "idem_admin_unauthorized_total")
        for _ in range(3):
            self.assertEqual(h.request(d.admin_port, "GET", "/metrics").status, 401)
        after = h.metric_sum(d.metrics(), "idem_admin_unauthorized_total")
        self.assertEqual(after - before, 3)

    def test_the_public_listener_needs_no_admin_token(self):
        up, d = self.start_with_token()
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 200)
        self.assertEqual(d.post(key=k).status, 200)
        self.assertEqual(up.count(), 1)
        r = d.get_key(k)  # with the token
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["state"], "completed")
        self.assertEqual(h.request(d.admin_port, "GET", d.key_path(k)).status, 401)

    def test_the_start_line_says_a_token_is_required(self):
        up, d = self.start_with_token()
        self.assertIn("(token required)", d.log_text())


class AdminTokenStart(h.IdemTestCase):
    """What idemd refuses at start: one line on stderr, exit 2."""

    def refused(self, config, extra_args=(), tag="refused"):
        d = self.make_idemd(None, config, extra_args=extra_args)
        log = d.spawn(tag)
        self.assertEqual(d.wait_exit(20), 2)
        with open(log) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        self.assertEqual(len(lines), 1, lines)
        return lines[0]

    def test_a_non_loopback_admin_without_a_token_is_refused(self):
        # the check comes before any socket is bound: nothing listens beyond loopback
        for admin in ("0.0.0.0:18081", "[::]:18081", "192.0.2.10:18081"):
            with self.subTest(admin=admin):
                line = self.refused({}, extra_args=["--admin", admin], tag="nonloop")
                self.assertIn("admin: '%s' is not a loopback address" % admin, line)
                self.assertIn("admin_token_file", line)

    def test_a_non_loopback_admin_with_a_token_passes_the_check(self):
        path = write_token_file(self.tmp, TOKEN)
        with open(os.path.join(self.tmp, "c.yaml"), "w") as f:
            f.write("admin: 0.0.0.0:18081\nadmin_token_file: %s\n" % path)
        p = subprocess.run([h.IDEMD, "--config", os.path.join(self.tmp, "c.yaml"), "-t"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("configuration OK", p.stdout)

    def test_bad_token_files_are_refused(self):
        cases = [
            ("", 0o600, "is empty"),
            ("\n", 0o600, "is empty"),
            ("two words\n", 0o600, "holds a space"),
            (TOKEN + "\n", 0o644, "can be read or written by other users"),
            (TOKEN + "\n", 0o602, "can be read or written by other users"),
        ]
        for i, (text, mode, why) in enumerate(cases):
            with self.subTest(text=text, mode=oct(mode)):
                path = write_token_file(self.tmp, text, mode, name="tok%d" % i)
                line = self.refused({"admin_token_file": path}, tag="tok%d" % i)
                self.assertIn("admin_token_file: '%s' %s" % (path, why), line)
        line = self.refused({"admin_token_file": os.path.join(self.tmp, "absent")},
                            tag="absent")
        self.assertIn("admin_token_file: cannot open", line)

    def test_group_readable_is_allowed(self):
        """0640 root:idem is how a package hands a token to a service."""
        path = write_token_file(self.tmp, TOKEN + "\r\n", 0o640)
        up = self.start_upstream()
        d = self.make_idemd(up, {"admin_token_file": path})
        d.__class__ = AuthIdemd
        d.token = TOKEN  # CR LF dropped as well
        d.start()
        self.assertEqual(d.admin("GET", "/readyz").status, 200)


class IdemctlToken(h.IdemTestCase):
    def idemctl(self, args, env_extra=None):
        env = dict(os.environ)
        env.pop("IDEM_ADMIN_TOKEN_FILE", None)
        env.update(env_extra or {})
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
            env.pop(k, None)
        p = subprocess.run([IDEMCTL] + args, capture_output=True, text=True, env=env,
                           timeout=60)
        for marker in h.SANITIZER_MARKERS:
            self.assertNotIn(marker, p.stderr)
        return p

    def test_keys_with_the_token_file(self):
        path = write_token_file(self.tmp, TOKEN + "\n")
        up = self.start_upstream()
        d = self.make_idemd(up, {"admin_token_file": path})
        d.__class__ = AuthIdemd
        d.token = TOKEN
        d.start()
        k = h.new_key()
        self.assertEqual(d.post(key=k).status, 200)
        admin = "http://127.0.0.1:%d" % d.admin_port

        p = self.idemctl(["keys", "get", k, "--admin", admin])
        self.assertEqual(p.returncode, 22, p.stderr)
        self.assertIn("401", p.stderr)

        p = self.idemctl(["keys", "get", k, "--admin", admin, "--admin-token-file", path])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('"state":"completed"', p.stdout)

        p = self.idemctl(["keys", "get", k, "--admin", admin],
                         env_extra={"IDEM_ADMIN_TOKEN_FILE": path})
        self.assertEqual(p.returncode, 0, p.stderr)

        # keys in bulk (GET /keys) is behind the token as well
        p = self.idemctl(["keys", "list", "--admin", admin])
        self.assertEqual(p.returncode, 22, p.stderr)
        self.assertIn("401", p.stderr)
        p = self.idemctl(["keys", "list", "--admin", admin, "--admin-token-file", path])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(k, p.stdout)

        wrong = write_token_file(self.tmp, "not-the-token\n", name="wrong")
        p = self.idemctl(["keys", "delete", k, "--admin", admin, "--admin-token-file", wrong])
        self.assertEqual(p.returncode, 22, p.stderr)
        self.assertIn("401", p.stderr)
        self.assertEqual(d.get_key(k).status, 200)  # still there

        # the flag wins over the environment
        p = self.idemctl(["keys", "delete", k, "--admin", admin, "--admin-token-file", path],
                         env_extra={"IDEM_ADMIN_TOKEN_FILE": wrong})
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(d.get_key(k).status, 404)

    def test_an_unreadable_token_file_is_a_usage_error(self):
        p = self.idemctl(["keys", "get", "k", "--admin", "http://127.0.0.1:1",
                          "--admin-token-file", os.path.join(self.tmp, "absent")])
        self.assertEqual(p.returncode, 2)
        self.assertIn("--admin-token-file: cannot open", p.stderr)
        empty = write_token_file(self.tmp, "\n")
        p = self.idemctl(["keys", "get", "k", "--admin", "http://127.0.0.1:1"],
                         env_extra={"IDEM_ADMIN_TOKEN_FILE": empty})
        self.assertEqual(p.returncode, 2)
        self.assertIn("IDEM_ADMIN_TOKEN_FILE: '%s' is empty" % empty, p.stderr)


class Workers(h.IdemTestCase):
    def workers(self, d):
        return h.metric_sum(d.metrics(), "idem_workers")

    def test_default_is_one_per_cpu(self):
        up, d = self.setup_pair()
        n = expected_auto_workers()
        self.assertEqual(self.workers(d), n)
        self.assertIn("%d worker(s) (auto: one per CPU)" % n, d.log_text())
        self.assertEqual(d.post(key=h.new_key()).status, 200)

    def test_auto_follows_the_affinity_mask(self):
        if shutil.which("taskset") is None:
            self.skipTest("no taskset")
        cpus = sorted(os.sched_getaffinity(0))
        up = self.start_upstream()
        d = self.make_idemd(up, {"workers": "auto"})
        d.__class__ = PinnedIdemd
        d.cpus = str(cpus[0])
        d.start()
        self.assertEqual(self.workers(d), 1)
        if len(cpus) >= 2 and expected_auto_workers() >= 2:
            d2 = self.make_idemd(up, None, extra_args=["--workers", "auto"])
            d2.__class__ = PinnedIdemd
            d2.cpus = "%d,%d" % (cpus[0], cpus[1])
            d2.start()
            self.assertEqual(self.workers(d2), 2)

    def test_a_number_still_works(self):
        up, d = self.setup_pair({"workers": 3})
        self.assertEqual(self.workers(d), 3)
        self.assertIn("3 worker(s)", d.log_text())
        self.assertNotIn("(auto", d.log_text())

    def test_bad_values_are_refused(self):
        for args, cfg, want in ((["--workers", "0"], {}, "--workers: must be auto or"),
                                ([], {"workers": "many"}, "workers: must be auto or")):
            d = self.make_idemd(None, cfg, extra_args=args)
            log = d.spawn("bad")
            self.assertEqual(d.wait_exit(20), 2)
            with open(log) as f:
                self.assertIn(want, f.read())


class RouteLabel(h.IdemTestCase):
    CONFIG = {"routes": [
        {"methods": ["POST"], "path": "/pay", "name": "payments"},
        {"methods": ["POST"], "path": "/orders"},
        {"methods": ["PUT"], "path": "/items", "mode": "off", "name": "items.v2"},
    ]}

    def test_requests_are_labelled_by_route(self):
        up, d = self.setup_pair(self.CONFIG)
        k = h.new_key()
        self.assertEqual(d.post("/pay/1", key=k).status, 200)
        self.assertEqual(d.post("/pay/1", key=k).status, 200)       # replay
        self.assertEqual(d.post("/orders/7", key=h.new_key()).status, 200)
        self.assertEqual(d.post("/orders/7").status, 400)           # missing key
        self.assertEqual(d.request("PUT", "/items/3", body=b"x").status, 200)
        for i in range(3):                                          # no route
            self.assertEqual(d.request("GET", "/raw/path/%d?q=%d" % (i, i)).status, 200)
        m = d.counted_metrics()
        s = lambda **l: h.metric_sum(m, "idem_requests_total", **l)
        self.assertEqual(s(outcome="new", route="payments"), 1)
        self.assertEqual(s(outcome="replay", route="payments"), 1)
        self.assertEqual(s(outcome="new", route="1"), 1)
        self.assertEqual(s(outcome="missing_key", route="1"), 1)
        self.assertEqual(s(route="items.v2"), 1)
        self.assertEqual(s(route="none"), 3)
        # the label's values are the routes' names or indexes and none:
        # never a request's path
        routes = {l.get("route") for n, l, v in m["samples"] if n == "idem_requests_total"}
        self.assertEqual(routes, {"payments", "1", "items.v2", "none"})
        for n, l, v in m["samples"]:
            if n == "idem_requests_total":
                self.assertEqual(set(l), {"outcome", "route", "proto"})

    def test_default_route_is_index_0(self):
        up, d = self.setup_pair()
        self.assertEqual(d.post(key=h.new_key()).status, 200)
        m = d.counted_metrics()
        self.assertEqual(h.metric_sum(m, "idem_requests_total", outcome="new", route="0"), 1)


if __name__ == "__main__":
    unittest.main()
