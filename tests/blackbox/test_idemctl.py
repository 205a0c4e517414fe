"""docs/protocol.md section 15: idemctl, the retrying client, and its keys and token commands.

  idemctl request [-X METHOD] URL [-d DATA | --data-file F] [-H 'Name: v']...
                  [--key K] [--retries N] [--max-time S] [-i] [-v]
  idemctl keys get|delete KEY [--scope S | --scope-of V] [--admin URL]
  idemctl token [--url URL] [-H ...]

request sends a fresh UUIDv7 key (or --key) and the same key on every
attempt; it retries connection failures, timeouts, 408, 409 in-flight, 425,
429, 500, 502, 503, 504 with full-jitter backoff and Retry-After, never past
--max-time, never another 4xx; exit 0 on 2xx, 22 on another status, 7 when no
answer came, 2 on a usage error (one line on stderr).

The Request* classes run idemctl against a Python upstream directly (the
harness's Upstream), so that every answer and every timing is the test's to
choose; the ThroughIdemd classes run it against the real idemd.

Environment: IDEMCTL, the binary (default <repo>/build/idemctl); IDEMD as for
the rest of the suite.  Every run of idemctl is checked for sanitizer reports
on its stderr, so the suite is meaningful on the ASan/UBSan build too.
"""

import email.utils
import json
import os
import re
import socket
import subprocess
import time
import unittest
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

IDEMCTL = os.environ.get("IDEMCTL") or str(h.REPO / "build" / "idemctl")
# Seconds idemctl may take beyond what it waits on purpose: process start
# and exit, each attempt's round trip, under sanitizers on a busy machine.
# The decisions themselves (each delay, why it stopped) are read from -v,
# which does not depend on the machine's speed; the bounds that use SLACK
# only have to tell a wait that ends from one that does not, so every test
# makes the wrong behaviour take far longer than SLACK.
SLACK = 5.0
VERBOSE_LINE = re.compile(r"^idemctl: attempt (\d+): .*; (?:retrying in (\d+)\.(\d{3}) s"
                          r"( \(Retry-After\))?|done|giving up \((\w+)\))$")
FORM = "application/x-www-form-urlencoded"


def problem(status, ptype, detail="detail"):
    """An idem problem+json Reply."""
    body = json.dumps({"type": h.PROBLEM_PREFIX + ptype, "title": ptype, "status": status,
                       "detail": detail})
    return h.Reply(status, headers={"Content-Type": "application/problem+json"}, body=body)


class Run:
    """One finished run of idemctl."""

    def __init__(self, argv, rc, out, err, elapsed):
        self.argv = argv
        self.rc = rc
        self.out = out
        self.err = err.decode("utf-8", "replace")
        self.elapsed = elapsed

    @property
    def err_lines(self):
        return [line for line in self.err.splitlines() if line]

    @property
    def attempts(self):
        """What -v said of each attempt: (delay in s or None, by Retry-After,
        the give-up reason or None); the last one has no delay."""
        out = []
        for line in self.err_lines:
            m = VERBOSE_LINE.match(line)
            if m:
                delay = int(m.group(2)) + int(m.group(3)) / 1000.0 if m.group(2) else None
                out.append((delay, bool(m.group(4)), m.group(5)))
        return out

    def __repr__(self):
        return "<idemctl %r rc=%d %.2fs out=%r err=%r>" % (self.argv[1:], self.rc, self.elapsed,
                                                           self.out[:300], self.err[-1500:])


class CtlTestCase(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        if not os.path.exists(IDEMCTL):
            self.fail("idemctl binary not found at %s (set $IDEMCTL)" % IDEMCTL)
        # No proxy from the environment between idemctl and loopback.
        self.env = {k: v for k, v in os.environ.items()
                    if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}

    def ctl(self, *args, stdin=None, timeout=30.0):
        argv = [IDEMCTL] + [str(a) for a in args]
        t0 = time.monotonic()
        p = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=self.env, timeout=timeout,
                           stdin=None if stdin is not None else subprocess.DEVNULL)
        r = Run(argv, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)
        for marker in h.SANITIZER_MARKERS:
            self.assertNotIn(marker, r.err, "sanitizer report from %r" % (r,))
        self.assertGreaterEqual(r.rc, 0, "idemctl died of a signal: %r" % (r,))
        return r

    def assertExit(self, r, rc):
        self.assertEqual(r.rc, rc, "expected exit %d: %r" % (rc, r))
        if rc != 0:
            # Without -v, a failure is one line, "idemctl: ...".
            if "-v" not in r.argv:
                self.assertEqual(len(r.err_lines), 1, "expected one stderr line: %r" % (r,))
            self.assertTrue(r.err_lines and r.err_lines[-1].startswith("idemctl: "), repr(r))

    def upstream(self, *replies, then=None):
        up = self.start_upstream()
        if replies or then is not None:
            up.script(*replies, then=then or h.Reply())
        return up


# --------------------------------------------------------------------------
# retries against a programmable upstream


class RequestRetries(CtlTestCase):
    def test_503_twice_then_200_one_key_on_all_attempts(self):
        up = self.upstream(h.Reply(503, body=b"busy"), h.Reply(503, body=b"busy"),
                           then=h.Reply(200, body=b"paid"))
        before = time.time()
        r = self.ctl("request", up.url + "/pay", "-d", '{"amount":100}', "--max-time", "20")
        self.assertExit(r, 0)
        self.assertEqual(r.out, b"paid")
        seen = up.requests()
        self.assertEqual(len(seen), 3)
        keys = {s.key for s in seen}
        self.assertEqual(len(keys), 1, "the key changed between attempts: %r" % seen)
        u = uuid.UUID(seen[0].key)
        self.assertEqual(str(u), seen[0].key, "not a lowercase 8-4-4-4-12 UUID")
        self.assertEqual(u.version, 7)
        self.assertEqual(u.variant, uuid.RFC_4122)
        ts = int(seen[0].key.replace("-", "")[:12], 16) / 1000.0
        self.assertLess(abs(ts - before), 10.0, "UUIDv7 time is not now")
        for s in seen:
            self.assertEqual(s.method, "POST")
            self.assertEqual(s.path, "/pay")
            self.assertEqual(s.body, b'{"amount":100}')

    def test_every_run_gets_a_fresh_key(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", up.url), 0)
        self.assertExit(self.ctl("request", up.url), 0)
        k1, k2 = [s.key for s in up.requests()]
        self.assertNotEqual(k1, k2)

    def test_key_flag_is_sent_on_every_attempt(self):
        up = self.upstream(h.Reply(500), then=h.Reply(201))
        r = self.ctl("request", up.url, "--key", "order-42")
        self.assertExit(r, 0)
        self.assertEqual([s.key for s in up.requests()], ["order-42", "order-42"])

    def test_key_with_a_space_is_sent_as_a_quoted_string(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", up.url, "--key", '"a b\\"c"'), 0)
        self.assertEqual(up.requests()[0].key, '"a b\\"c"')

    def test_quoted_key_without_space_is_sent_bare(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", up.url, "--key", '"abc"'), 0)
        self.assertEqual(up.requests()[0].key, "abc")

    def test_400_is_not_retried(self):
        up = self.upstream(then=h.Reply(400, body=b"bad amount"))
        r = self.ctl("request", up.url, "-d", "x")
        self.assertExit(r, 22)
        self.assertEqual(r.out, b"bad amount", "the body of an error is printed")
        self.assertIn("400", r.err)
        self.assertEqual(up.count(), 1)

    def test_other_4xx_are_not_retried(self):
        for status in (401, 403, 404, 422):
            up = self.upstream(then=h.Reply(status))
            r = self.ctl("request", up.url)
            self.assertExit(r, 22)
            self.assertEqual(up.count(), 1, "status %d was retried" % status)

    def test_409_token_used_is_not_retried(self):
        up = self.upstream(then=problem(409, "token-used", "this token was used"))
        r = self.ctl("request", up.url)
        self.assertExit(r, 22)
        self.assertEqual(up.count(), 1)
        self.assertIn("this token was used", r.err)
        self.assertEqual(json.loads(r.out)["type"], h.PROBLEM_PREFIX + "token-used")

    def test_409_in_flight_is_retried(self):
        up = self.upstream(problem(409, "in-flight"), then=h.Reply(200, body=b"done"))
        r = self.ctl("request", up.url)
        self.assertExit(r, 0)
        self.assertEqual(r.out, b"done")
        self.assertEqual(up.count(), 2)
        self.assertEqual(len({s.key for s in up.requests()}), 1)

    def test_retryable_statuses_are_retried(self):
        for status in (408, 425, 429, 500, 502, 504):
            up = self.upstream(h.Reply(status), then=h.Reply(200, body=b"ok"))
            r = self.ctl("request", up.url)
            self.assertExit(r, 0)
            self.assertEqual(up.count(), 2, "status %d was not retried" % status)

    def test_connection_closed_without_answer_is_retried(self):
        up = self.upstream(h.Reply(action="close"), h.Reply(action="partial", body=b"x" * 100),
                           then=h.Reply(200, body=b"ok"))
        r = self.ctl("request", up.url, "-d", "a=1")
        self.assertExit(r, 0)
        self.assertEqual(r.out, b"ok")
        self.assertEqual(up.count(), 3)
        self.assertEqual(len({s.key for s in up.requests()}), 1)

    def test_gives_up_after_the_retries(self):
        up = self.upstream(then=h.Reply(503, body=b"still busy"))
        r = self.ctl("request", up.url, "--retries", "2")
        self.assertExit(r, 22)
        self.assertEqual(up.count(), 3)
        self.assertEqual(r.out, b"still busy", "the last answer is printed")
        self.assertRegex(r.err, r"gave up after 3 attempts")
        self.assertIn(up.requests()[0].key, r.err, "the key to resume with is named")

    def test_retries_zero_is_one_attempt(self):
        up = self.upstream(then=h.Reply(503))
        r = self.ctl("request", up.url, "--retries", "0")
        self.assertExit(r, 22)
        self.assertEqual(up.count(), 1)

    def test_default_is_four_retries(self):
        # 0.2 s doubling with full jitter: the four waits are at most 0.2, 0.4,
        # 0.8 and 1.6 s (-v says which it chose), and each was waited.
        up = self.upstream(then=h.Reply(502))
        r = self.ctl("request", up.url, "-v")
        self.assertExit(r, 22)
        self.assertEqual(up.count(), 5)
        att = r.attempts
        self.assertEqual(len(att), 5, r)
        self.assertEqual(att[-1], (None, False, "attempts"), r)
        seen = up.requests()
        for i, (delay, by_server, _) in enumerate(att[:-1]):
            self.assertIsNotNone(delay, r)
            self.assertFalse(by_server)
            self.assertLessEqual(delay, 0.2 * 2 ** i, "wait %d: %r" % (i, r))
            self.assertGreaterEqual(seen[i + 1].t - seen[i].t, delay - 0.01,
                                    "attempt %d came before its wait: %r" % (i + 2, r))
        self.assertLess(r.elapsed, 3.0 + SLACK)

    def test_last_answer_is_kept_when_a_later_attempt_gets_none(self):
        up = self.upstream(h.Reply(503, body=b"first"), then=h.Reply(action="close"))
        r = self.ctl("request", up.url, "--retries", "2")
        self.assertExit(r, 22)
        self.assertEqual(r.out, b"first")
        self.assertEqual(up.count(), 3)


class RequestDeadline(CtlTestCase):
    def test_nothing_listening_exits_7_within_max_time(self):
        port = h.dead_port()
        r = self.ctl("request", "http://127.0.0.1:%d/pay" % port, "--max-time", "2",
                     "--retries", "99", "-v")
        self.assertExit(r, 7)
        # The deadline ended it, and the waits it chose fit in it (99
        # retries with the backoff's growth would take minutes).
        att = r.attempts
        self.assertEqual(att[-1][2], "deadline", r)
        self.assertLess(sum(a[0] for a in att[:-1]), 2.0, r)
        self.assertLess(r.elapsed, 2 + SLACK)
        self.assertIn("connection refused", r.err)
        self.assertEqual(r.out, b"")

    def test_server_that_never_answers_exits_7_near_max_time(self):
        # A listening socket that never accepts: the kernel completes the
        # handshake and takes the request; no answer ever comes.
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.bind((h.HOST, 0))
        s.listen(16)
        r = self.ctl("request", "http://127.0.0.1:%d/" % s.getsockname()[1],
                     "--max-time", "1.5")
        self.assertExit(r, 7)
        # It waited its whole --max-time (the elapsed time seen from here
        # includes it), and the wait ended (without a deadline it would
        # never end: ctl's timeout).
        self.assertGreaterEqual(r.elapsed, 1.4)
        self.assertLess(r.elapsed, 1.5 + SLACK)
        self.assertIn("timed out", r.err)

    def test_slow_answer_within_max_time_is_taken(self):
        up = self.upstream(then=h.Reply(200, body=b"slow", delay=0.5))
        r = self.ctl("request", up.url, "--max-time", "5")
        self.assertExit(r, 0)
        self.assertEqual(r.out, b"slow")

    def test_retry_after_seconds_is_observed(self):
        up = self.upstream(h.Reply(503, headers={"Retry-After": "1"}), then=h.Reply(200))
        r = self.ctl("request", up.url, "--max-time", "30", "-v")
        self.assertExit(r, 0)
        self.assertEqual(r.attempts, [(1.0, True, None), (None, False, None)], r)
        a, b = up.requests()
        self.assertGreaterEqual(b.t - a.t, 1.0, "retried before Retry-After")
        self.assertLess(b.t - a.t, 1.0 + SLACK)

    def test_retry_after_http_date_is_observed(self):
        def pick(seen):
            if seen.seq == 1:
                # Two seconds ahead, in whole seconds: a wait of more than one.
                when = email.utils.formatdate(time.time() + 2, usegmt=True)
                return h.Reply(429, headers={"Retry-After": when})
            return h.Reply(200, body=b"ok")
        up = self.upstream()
        up.behaviour = pick
        r = self.ctl("request", up.url, "--max-time", "30", "-v")
        self.assertExit(r, 0)
        att = r.attempts
        self.assertEqual(len(att), 2, r)
        delay, by_server, _ = att[0]
        self.assertTrue(by_server, r)
        self.assertLessEqual(delay, 2.0, r)  # the date is at most 2 s after it was written
        a, b = up.requests()
        self.assertGreaterEqual(b.t - a.t, 0.9, "retried before the Retry-After date")
        self.assertLess(b.t - a.t, 2.0 + SLACK)

    def test_retry_after_beyond_the_deadline_gives_up_at_once(self):
        up = self.upstream(then=h.Reply(503, headers={"Retry-After": "3600"}, body=b"later"))
        # A deadline far beyond SLACK: sleeping until it would show.
        r = self.ctl("request", up.url, "--max-time", "30", "-v", timeout=60)
        self.assertExit(r, 22)
        self.assertEqual(r.attempts, [(None, False, "deadline")], r)
        self.assertLess(r.elapsed, 1.0 + SLACK, "slept instead of giving up")
        self.assertEqual(up.count(), 1)
        self.assertEqual(r.out, b"later")
        self.assertIn("deadline", r.err)

    def test_deadline_bounds_the_backoff(self):
        up = self.upstream(then=h.Reply(503))
        r = self.ctl("request", up.url, "--max-time", "1", "--retries", "99", "-v")
        self.assertExit(r, 22)
        att = r.attempts
        self.assertEqual(att[-1][2], "deadline", r)
        self.assertLess(sum(a[0] for a in att[:-1]), 1.0, r)
        self.assertLess(r.elapsed, 1.0 + SLACK)


class RequestShape(CtlTestCase):
    def test_data_is_sent_as_is_and_labelled_form_like_curl(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", up.url + "/p?q=1", "-d", "a=1 &b=@x"), 0)
        s = up.requests()[0]
        self.assertEqual(s.method, "POST")
        self.assertEqual(s.path, "/p?q=1")
        self.assertEqual(s.body, b"a=1 &b=@x")
        self.assertEqual(s.header("Content-Type"), FORM)

    def test_repeated_data_is_joined_with_ampersand(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", up.url, "-d", "a=1", "-d", "b=2"), 0)
        self.assertEqual(up.requests()[0].body, b"a=1&b=2")

    def test_header_content_type_replaces_the_form_label(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", up.url, "-d", "{}", "-H",
                                 "Content-Type: application/json", "-H", "X-Trace: t1"), 0)
        s = up.requests()[0]
        self.assertEqual(s.header_all("Content-Type"), ["application/json"])
        self.assertEqual(s.header("X-Trace"), "t1")

    def test_bare_post_sends_an_empty_body_without_content_type(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", up.url), 0)
        s = up.requests()[0]
        self.assertEqual(s.method, "POST")
        self.assertEqual(s.header("Content-Length"), "0")
        self.assertIsNone(s.header("Content-Type"))
        self.assertIsNone(s.header("Expect"))
        self.assertRegex(s.header("User-Agent") or "", r"^idemctl/")

    def test_data_file_and_stdin(self):
        up = self.upstream()
        path = os.path.join(self.tmp, "body.bin")
        data = bytes(range(256)) * 1000
        with open(path, "wb") as f:
            f.write(data)
        self.assertExit(self.ctl("request", up.url, "--data-file", path), 0)
        self.assertExit(self.ctl("request", up.url, "--data-file", "-", stdin=b"from stdin"), 0)
        a, b = up.requests()
        self.assertEqual(a.body, data)
        self.assertEqual(b.body, b"from stdin")

    def test_method_flag(self):
        up = self.upstream()
        self.assertExit(self.ctl("request", "-X", "PUT", up.url, "-d", "v"), 0)
        self.assertExit(self.ctl("request", "-XDELETE", up.url), 0)
        self.assertExit(self.ctl("request", "--request=PATCH", up.url), 0)
        put, delete, patch = up.requests()
        self.assertEqual((put.method, put.body), ("PUT", b"v"))
        self.assertEqual((delete.method, delete.body), ("DELETE", b""))
        self.assertIsNone(delete.header("Content-Length"))
        self.assertEqual((patch.method, patch.header("Content-Length")), ("PATCH", "0"))

    def test_include_prints_the_head_first(self):
        up = self.upstream(then=h.Reply(201, headers={"X-Order": "42"}, body=b"created"))
        r = self.ctl("request", up.url, "-i")
        self.assertExit(r, 0)
        head, _, body = r.out.partition(b"\r\n\r\n")
        self.assertRegex(head.split(b"\r\n")[0], rb"^HTTP/1\.1 201")
        self.assertIn(b"X-Order: 42", head)
        self.assertEqual(body, b"created")

    def test_answer_over_64_mib_is_refused_not_retried(self):
        big = b"x" * (64 * 1024 * 1024 + 1)
        up = self.upstream(then=h.Reply(200, body=big))
        r = self.ctl("request", up.url, timeout=60)
        self.assertExit(r, 63)
        self.assertIn("64 MiB", r.err)
        self.assertEqual(r.out, b"")
        self.assertEqual(up.count(), 1)

    def test_answer_of_64_mib_is_printed(self):
        body = b"y" * (64 * 1024 * 1024)
        up = self.upstream(then=h.Reply(200, body=body))
        r = self.ctl("request", up.url, timeout=60)
        self.assertExit(r, 0)
        self.assertEqual(len(r.out), len(body))

    def test_unwritable_output_exits_23(self):
        if not os.path.exists("/dev/full"):
            self.skipTest("no /dev/full")
        up = self.upstream(then=h.Reply(200, body=b"z" * 100000))
        with open("/dev/full", "wb") as full:
            p = subprocess.run([IDEMCTL, "request", up.url], stdout=full,
                               stderr=subprocess.PIPE, env=self.env, timeout=30)
        err = p.stderr.decode()
        for marker in h.SANITIZER_MARKERS:
            self.assertNotIn(marker, err)
        self.assertEqual(p.returncode, 23, err)
        self.assertRegex(err, r"^idemctl: writing the output: ")

    def test_redirects_are_not_followed(self):
        up = self.upstream(then=h.Reply(302, headers={"Location": "/elsewhere"}))
        r = self.ctl("request", up.url)
        self.assertExit(r, 22)
        self.assertEqual(up.count(), 1)

    def test_verbose_shows_each_attempt_and_its_delay(self):
        up = self.upstream(h.Reply(503), h.Reply(503, headers={"Retry-After": "0"}),
                           then=h.Reply(200))
        r = self.ctl("request", up.url, "-v")
        self.assertExit(r, 0)
        key = up.requests()[0].key
        lines = r.err_lines
        self.assertEqual(len(lines), 3, r.err)
        self.assertRegex(lines[0], r"^idemctl: attempt 1: 503 \(key %s\); retrying in "
                         r"\d+\.\d{3} s$" % re.escape(key))
        self.assertRegex(lines[1], r"^idemctl: attempt 2: 503 .*retrying in 0\.000 s "
                         r"\(Retry-After\)$")
        self.assertRegex(lines[2], r"^idemctl: attempt 3: 200; done$")

    def test_verbose_names_connection_failures(self):
        r = self.ctl("request", "http://127.0.0.1:%d/" % h.dead_port(), "-v", "--retries", "1")
        self.assertExit(r, 7)
        self.assertRegex(r.err_lines[0], r"^idemctl: attempt 1: connection refused \(key "
                         r"[0-9a-f-]{36}\); retrying in \d+\.\d{3} s$")
        self.assertRegex(r.err_lines[1], r"^idemctl: attempt 2: connection refused; giving up")
        self.assertRegex(r.err_lines[2], r"^idemctl: gave up after 2 attempts")


class Usage(CtlTestCase):
    def usage_error(self, *args, contains=None, stdin=None):
        r = self.ctl(*args, stdin=stdin)
        self.assertExit(r, 2)
        self.assertEqual(r.out, b"")
        if contains:
            self.assertIn(contains, r.err)
        return r

    def test_help_and_version(self):
        r = self.ctl("--help")
        self.assertExit(r, 0)
        self.assertIn(b"idemctl request", r.out)
        self.assertIn(b"Idempotency-Key", r.out)
        self.assertExit(self.ctl("request", "--help"), 0)
        r = self.ctl("--version")
        self.assertExit(r, 0)
        self.assertRegex(r.out.decode(), r"^idemctl \d+\.\d+\.\d+")

    def test_usage_errors_exit_2_with_one_line(self):
        url = "http://127.0.0.1:%d/" % h.free_port()
        self.usage_error()
        self.usage_error("frobnicate", contains="unknown command")
        self.usage_error("request", contains="needs a URL")
        self.usage_error("request", url, url, contains="unexpected argument")
        self.usage_error("request", url, "--bogus", contains="unknown option --bogus")
        self.usage_error("request", url, "-Q", contains="unknown option -Q")
        self.usage_error("request", url, "--retries", contains="needs a value")
        self.usage_error("request", url, "--retries", "100", contains="--retries")
        self.usage_error("request", url, "--retries", "-1", contains="--retries")
        self.usage_error("request", url, "--retries", "2x", contains="--retries")
        self.usage_error("request", url, "--max-time", "0", contains="--max-time")
        self.usage_error("request", url, "--max-time", "86401", contains="--max-time")
        self.usage_error("request", url, "--max-time", "1e3", contains="--max-time")
        self.usage_error("request", url, "-X", "PO ST", contains="-X")
        self.usage_error("request", url, "--key", "", contains="--key")
        self.usage_error("request", url, "--key", "a b", contains="--key")
        self.usage_error("request", url, "--key", "k" * 256, contains="--key")
        self.usage_error("request", url, "-H", "NoColon", contains="-H")
        self.usage_error("request", url, "-H", "Bad Name: v", contains="-H")
        self.usage_error("request", url, "-H", "X: a\r\nInjected: 1", contains="-H")
        self.usage_error("request", url, "-H", "Idempotency-Key: k", contains="use --key")
        self.usage_error("request", url, "-H", "content-length: 3", contains="-H")
        self.usage_error("request", url, "-d", "a", "--data-file", "-", contains="give one")
        self.usage_error("request", url, "--data-file", os.path.join(self.tmp, "missing"),
                         contains="missing")
        self.usage_error("request", "ftp://127.0.0.1/", contains="http")
        self.usage_error("request", "http://", contains="URL")
        self.usage_error("request", "http://exa mple/", contains="URL")
        self.usage_error("request", url, "--scope", "anonymous", contains="not an option")
        self.usage_error("keys", contains="get, delete or list")
        self.usage_error("keys", "frob", contains="not get, delete or list")
        self.usage_error("keys", "list", "extra", contains="takes no KEY")
        self.usage_error("keys", "get", contains="KEY")
        self.usage_error("keys", "get", "k", "--scope", "ABC", contains="--scope")
        self.usage_error("keys", "get", "k", "--scope", "anonymous", "--scope-of", "x",
                         contains="give one")
        self.usage_error("keys", "get", "k", "--admin", "http://h/?q=1", contains="query")
        self.usage_error("token", "extra", contains="unexpected argument")
        self.usage_error("token", "--url", "gopher://h/", contains="http")

    def test_at_most_100_headers(self):
        # Python's HTTP server takes 100 header lines; idemctl adds its own.
        import http.client
        saved = http.client._MAXHEADERS
        http.client._MAXHEADERS = 200
        self.addCleanup(setattr, http.client, "_MAXHEADERS", saved)
        up = self.upstream()
        hs = []
        for i in range(100):
            hs += ["-H", "X-H%d: %d" % (i, i)]
        self.assertExit(self.ctl("request", up.url, *hs), 0)
        self.assertEqual(up.requests()[0].header("X-H99"), "99")
        self.usage_error("request", up.url, *(hs + ["-H", "X-Last: 1"]), contains="100")
        self.assertEqual(up.count(), 1)

    def test_data_file_over_64_mib_is_refused(self):
        path = os.path.join(self.tmp, "big")
        with open(path, "wb") as f:
            f.truncate(64 * 1024 * 1024 + 1)  # sparse: cheap to make
        up = self.upstream()
        self.usage_error("request", up.url, "--data-file", path, contains="64 MiB")
        self.assertEqual(up.count(), 0)

    def test_data_file_of_exactly_64_mib_is_sent(self):
        path = os.path.join(self.tmp, "max")
        with open(path, "wb") as f:
            f.truncate(64 * 1024 * 1024)
        up = self.upstream(then=h.Reply(200, body=b"ok"))
        r = self.ctl("request", up.url, "--data-file", path, timeout=60)
        self.assertExit(r, 0)
        self.assertEqual(len(up.requests()[0].body), 64 * 1024 * 1024)


# --------------------------------------------------------------------------
# against the real idemd


class ThroughIdemd(CtlTestCase):
    def test_same_key_twice_executes_once_and_replays(self):
        up, d = self.setup_pair()
        url = "http://127.0.0.1:%d/pay" % d.port
        k = h.new_key()
        r1 = self.ctl("request", url, "--key", k, "-d", '{"amount":5}', "-H",
                      "Content-Type: application/json")
        self.assertExit(r1, 0)
        r2 = self.ctl("request", url, "--key", k, "-d", '{"amount":5}', "-H",
                      "Content-Type: application/json", "-i")
        self.assertExit(r2, 0)
        self.assertEqual(up.count(key=k), 1, "the upstream ran the operation twice")
        head, _, body = r2.out.partition(b"\r\n\r\n")
        self.assertEqual(body, r1.out, "the second answer is not the first one's replay")
        self.assertIn(b"x-idempotent-replay: true", head.lower())

    def test_generated_key_is_accepted_by_idemd(self):
        up, d = self.setup_pair()
        r = self.ctl("request", "http://127.0.0.1:%d/pay" % d.port, "-d", "x")
        self.assertExit(r, 0)
        s = up.requests()[0]
        self.assertEqual(uuid.UUID(s.key).version, 7)
        self.assertEqual(json.loads(r.out)["key"], s.key)

    def test_keys_get_then_delete(self):
        up, d = self.setup_pair()
        k = h.new_key("ctl key/+%")  # needs percent-encoding in the admin path
        k = k.replace(" ", "-")
        self.assertExit(self.ctl("request", "http://127.0.0.1:%d/pay" % d.port, "--key", k), 0)
        admin = "http://127.0.0.1:%d" % d.admin_port
        r = self.ctl("keys", "get", k, "--admin", admin)
        self.assertExit(r, 0)
        rec = json.loads(r.out)
        self.assertEqual(rec["key"], k)
        self.assertEqual(rec["scope"], "anonymous")
        self.assertEqual(rec["state"], "completed")
        self.assertEqual(rec["status"], 200)
        self.assertExit(self.ctl("keys", "delete", k, "--admin", admin + "/"), 0)
        r = self.ctl("keys", "get", k, "--admin", admin)
        self.assertExit(r, 22)
        self.assertIn("404", r.err)
        self.assertIn("no record", r.err, "the problem's detail is shown")
        self.assertEqual(r.out, b"")
        self.assertExit(self.ctl("keys", "delete", k, "--admin", admin), 22)

    def test_keys_of_a_caller_scope(self):
        up, d = self.setup_pair()
        k = h.new_key()
        auth = "Bearer s3cret"
        self.assertExit(self.ctl("request", "http://127.0.0.1:%d/pay" % d.port, "--key", k,
                                 "-H", "Authorization: " + auth), 0)
        admin = "http://127.0.0.1:%d" % d.admin_port
        self.assertExit(self.ctl("keys", "get", k, "--admin", admin), 22)  # not anonymous
        r = self.ctl("keys", "get", k, "--admin", admin, "--scope-of", auth)
        self.assertExit(r, 0)
        self.assertEqual(json.loads(r.out)["scope"], h.scope_of(auth))
        r = self.ctl("keys", "get", k, "--admin", admin, "--scope", h.scope_of(auth))
        self.assertExit(r, 0)

    def test_quoted_key_with_space_round_trips(self):
        up, d = self.setup_pair()
        k = "a b " + uuid.uuid4().hex
        quoted = '"%s"' % k
        self.assertExit(self.ctl("request", "http://127.0.0.1:%d/pay" % d.port, "--key",
                                 quoted), 0)
        r = self.ctl("keys", "get", quoted, "--admin", "http://127.0.0.1:%d" % d.admin_port)
        self.assertExit(r, 0)
        self.assertEqual(json.loads(r.out)["key"], k)

    def test_keys_with_no_admin_listening_exit_7(self):
        r = self.ctl("keys", "get", "k", "--admin", "http://127.0.0.1:%d" % h.dead_port())
        self.assertExit(r, 7)

    def test_in_flight_is_retried_until_the_first_completes(self):
        # The first request is held at the upstream; a second idemctl with the
        # same key gets 409 in-flight and retries until the first is stored,
        # then receives the replay: the upstream ran it once.
        import threading
        gate = threading.Event()
        up = self.start_upstream()
        up.script(h.Reply(200, wait=gate))
        # A short lease: 409 in-flight carries Retry-After up to the lease's end.
        d = self.start_idemd(up, {"defaults": {"lease": "3s"}})
        url = "http://127.0.0.1:%d/pay" % d.port
        k = h.new_key()
        first = h.Background(lambda: self.ctl("request", url, "--key", k))
        up.wait_seen(1)
        # The gate opens once idemd has answered the second one 409 (not
        # after a fixed second, which a slow start of idemctl can outlast).
        before = d.outcome("in_flight")
        second = h.Background(lambda: self.ctl("request", url, "--key", k, "-v",
                                               "--max-time", "20"))
        d.outcome_reaches("in_flight", before + 1)
        gate.set()
        second = second.result(60)
        self.assertExit(second, 0)
        self.assertIn("409 in-flight", second.err)
        self.assertExit(first.result(), 0)
        self.assertEqual(up.count(key=k), 1)
        self.assertEqual(second.out, first.result().out)

    def test_token(self):
        up, d = self.setup_pair()
        r = self.ctl("token", "--url", "http://127.0.0.1:%d" % d.port)
        self.assertExit(r, 0)
        tok = r.out.decode()
        self.assertTrue(tok.endswith("\n"))
        self.assertRegex(tok.strip(), r"^[A-Za-z0-9_-]{32}$")
        r2 = self.ctl("token", "--url", "http://127.0.0.1:%d" % d.port, "-H",
                      "Authorization: Bearer t")
        self.assertExit(r2, 0)
        self.assertNotEqual(r2.out, r.out)

    def test_token_spent_once_through_request(self):
        # docs/protocol.md section 8, idemctl on both sides: a token from idemctl token, spent by
        # idemctl request on a mode: token route; the second use is 409
        # token-used, which waiting cannot change, so it is not retried.
        cfg = {"routes": [{"methods": ["POST"], "path": "/t", "mode": "token"},
                          {"methods": ["POST"], "path": "/", "mode": "required"}]}
        up, d = self.setup_pair(cfg)
        base = "http://127.0.0.1:%d" % d.port
        auth = "Authorization: Bearer t-%s" % uuid.uuid4().hex
        r = self.ctl("token", "--url", base, "-H", auth)
        self.assertExit(r, 0)
        tok = r.out.decode().strip()
        first = self.ctl("request", base + "/t/pay", "-H", auth, "-H",
                         "Idempotency-Token: " + tok, "-d", "cart=42")
        self.assertExit(first, 0)
        again = self.ctl("request", base + "/t/pay", "-H", auth, "-H",
                         "Idempotency-Token: " + tok, "-d", "cart=42")
        self.assertExit(again, 22)
        self.assertIn("token-used", again.err)
        self.assertEqual(up.count(path="/t/pay"), 1)


if __name__ == "__main__":
    unittest.main()
