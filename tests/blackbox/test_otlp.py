"""Traces (SPEC section 19, docs/admin.md "Traces"): OTLP/HTTP JSON spans.

With `otlp_endpoint` set, idemd sends a server span for every request its
proxy handles, and a client span for the upstream call when one is sent, to
an OTLP/HTTP collector (POST /v1/traces, JSON).  A collector of our own
here (http.server) keeps what it receives:

  continued   a client's traceparent: the server span's parent is the
              client's span; the upstream gets a traceparent with the same
              trace id whose parent is idemd's client span; tracestate
              goes as it came; the attributes say method, path, status,
              outcome, route, fence and a hash of the key, never the key
  malformed   a traceparent that does not parse starts a new trace
  sampling    an unsampled traceparent is forwarded (flags 00) and no span
              is exported; otlp_sample_ratio: 0 exports no new trace
  down        a collector that refuses connections: every request is
              answered, the export failures and drops are counted
  slow        a collector that never answers: every request is answered,
              the queue fills and drops are counted, and SIGTERM still
              stops idemd (the POST in progress is cut short)
  off         without otlp_endpoint the client's traceparent goes upstream
              untouched

Every verdict waits on an event (a span received, a counter grown), never
on a sleep or a timing threshold.
"""

import hashlib
import json
import os
import re
import secrets
import subprocess
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    from . import harness as h
except ImportError:
    import harness as h

TP = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
SERVER, CLIENT = 2, 3


class Collector:
    """An OTLP/HTTP collector on loopback.  mode "ok" answers 200 and keeps
    every span; "hang" reads the request and never answers until closed."""

    def __init__(self, mode="ok"):
        self.mode = mode
        self.spans = []
        self.bodies = []
        self.paths = []
        self.types = []
        self.cond = threading.Condition()
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                with outer.cond:
                    outer.paths.append(self.path)
                    outer.types.append(self.headers.get("Content-Type"))
                if outer.mode == "hang":
                    with outer.cond:
                        outer.bodies.append(body)
                        outer.cond.notify_all()
                    outer.closing.wait(120)
                    return
                doc = json.loads(body)
                with outer.cond:
                    outer.bodies.append(body)
                    for rs in doc["resourceSpans"]:
                        res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
                        for ss in rs["scopeSpans"]:
                            for s in ss["spans"]:
                                s["_resource"] = res
                                outer.spans.append(s)
                    outer.cond.notify_all()
                out = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # idemd closing its keep-alive connection at exit

        self.server = Server((h.HOST, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = "http://%s:%d" % (h.HOST, self.port)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_spans(self, pred, n=1, timeout=30.0):
        """The spans pred accepts, once there are at least n of them."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [s for s in self.spans if pred(s)]
                if len(got) >= n:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("collector: %d matching span(s) of %d after %.0fs; "
                                         "has %r" % (len(got), n, timeout, self.spans[-5:]))
                self.cond.wait(left)

    def wait_posts(self, n, timeout=30.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.bodies) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("collector: fewer than %d POSTs" % n)
                self.cond.wait(left)

    def of_trace(self, trace_id):
        with self.cond:
            return [s for s in self.spans if s["traceId"] == trace_id]


def attrs(span):
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = int(v["intValue"]) if "intValue" in v else v.get("stringValue")
    return out


def traceparent(trace_id=None, parent=None, flags="01"):
    return "00-%s-%s-%s" % (trace_id or secrets.token_hex(16), parent or secrets.token_hex(8),
                            flags)


class Traces(h.IdemTestCase):

    def collector(self, mode="ok"):
        c = Collector(mode)
        self.addCleanup(c.close)
        return c

    def test_traceparent_continued_forwarded_and_attributes(self):
        col = self.collector()
        up, d = self.setup_pair({"otlp_endpoint": col.url, "otlp_service_name": "idem-test"})
        tid, pid = secrets.token_hex(16), secrets.token_hex(8)
        key = h.new_key("otlp")
        r = d.post(key=key, headers={"traceparent": traceparent(tid, pid),
                                     "tracestate": "vendor=abc,other=1"})
        self.assertEqual(r.status, 200)
        seen = up.requests(key=key)
        self.assertEqual(len(seen), 1)
        # The upstream's traceparent: the same trace, idemd's client span as parent.
        self.assertEqual(len(seen[0].header_all("traceparent")), 1)
        m = TP.match(seen[0].header("traceparent"))
        self.assertIsNotNone(m, seen[0].header("traceparent"))
        self.assertEqual(m.group(1), tid)
        self.assertNotEqual(m.group(2), pid)
        self.assertEqual(m.group(3), "01")
        self.assertEqual(seen[0].header("tracestate"), "vendor=abc,other=1")

        spans = col.wait_spans(lambda s: s["traceId"] == tid, n=2)
        server = [s for s in spans if s["kind"] == SERVER]
        client = [s for s in spans if s["kind"] == CLIENT]
        self.assertEqual((len(server), len(client)), (1, 1), spans)
        server, client = server[0], client[0]
        self.assertEqual(server["parentSpanId"], pid)
        self.assertEqual(client["parentSpanId"], server["spanId"])
        self.assertEqual(client["spanId"], m.group(2))
        self.assertRegex(server["spanId"], r"^[0-9a-f]{16}$")
        for s in (server, client):
            self.assertEqual(s["_resource"]["service.name"], {"stringValue": "idem-test"})
            self.assertLessEqual(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
        self.assertLessEqual(int(server["startTimeUnixNano"]), int(client["startTimeUnixNano"]))
        self.assertLessEqual(int(client["endTimeUnixNano"]), int(server["endTimeUnixNano"]))
        a = attrs(server)
        self.assertEqual(a["http.request.method"], "POST")
        self.assertEqual(a["url.path"], "/pay")
        self.assertEqual(a["http.response.status_code"], 200)
        self.assertEqual(a["idem.outcome"], "new")
        self.assertEqual(a["idem.route"], "0")
        self.assertEqual(a["idem.fence"], seen[0].fence)
        scope = h.scope_of(None)
        self.assertEqual(a["idem.key_hash"],
                         hashlib.sha256(scope.encode() + b"\0" + key.encode()).hexdigest())
        self.assertIn("idem.store_time_us", a)
        self.assertIn("idem.upstream_time_us", a)
        self.assertEqual(server["name"], "idem POST /")
        ca = attrs(client)
        self.assertEqual(ca["http.request.method"], "POST")
        self.assertEqual(ca["http.response.status_code"], 200)
        self.assertEqual(ca["server.address"], h.HOST)
        # The POSTs went to /v1/traces (appended to a bare endpoint), as JSON.
        self.assertEqual(set(col.paths), {"/v1/traces"})
        self.assertEqual(set(col.types), {"application/json"})

        # A replay: a span of its own, no upstream call, so no client span.
        tid2 = secrets.token_hex(16)
        r = d.post(key=key, headers={"traceparent": traceparent(tid2)})
        self.assertEqual(r.status, 200)
        self.assertTrue(r.replayed)
        spans = col.wait_spans(lambda s: s["traceId"] == tid2)
        self.assertEqual(attrs(spans[0])["idem.outcome"], "replay")
        # Neither the key nor anything but its hash was sent.
        with col.cond:
            everything = b"".join(col.bodies)
        self.assertNotIn(key.encode(), everything)
        # The replay never went upstream: no client span.
        self.assertEqual([s["kind"] for s in col.of_trace(tid2)], [SERVER])
        self.assertEqual(up.count(key=key), 1)

    def test_malformed_traceparent_starts_a_new_trace(self):
        col = self.collector()
        up, d = self.setup_pair({"otlp_endpoint": col.url + "/v1/traces"})
        tid, pid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        bad = [
            "00-%s-%s-01" % (tid.upper(), pid),             # uppercase hex
            "01-%s-%s-01" % (tid, pid),                     # another version
            "00-%s-%s-01" % ("0" * 32, pid),                # all-zero trace id
            "00-%s-%s-01" % (tid, "0" * 16),                # all-zero parent id
            "00-%s-%s-1" % (tid, pid),                      # short flags
            "00-%s-%s-01-extra" % (tid, pid),               # trailing data
            "00_%s_%s_01" % (tid, pid),                     # wrong separators
            "00-%s-%s-0g" % (tid, pid),                     # not hex
        ]
        for i, value in enumerate(bad):
            with self.subTest(traceparent=value):
                key = h.new_key("bad%d" % i)
                r = d.post(key=key, headers={"traceparent": value})
                self.assertEqual(r.status, 200)
                seen = up.requests(key=key)[0]
                m = TP.match(seen.header("traceparent") or "")
                self.assertIsNotNone(m, seen.header("traceparent"))
                self.assertNotEqual(m.group(1), tid)
                self.assertEqual(m.group(3), "01")  # a new trace, sampled (ratio 1)
                spans = col.wait_spans(lambda s, t=m.group(1): s["traceId"] == t, n=2)
                server = [s for s in spans if s["kind"] == SERVER][0]
                self.assertNotIn("parentSpanId", server)
        # Two traceparent fields are one too many: a new trace as well.
        key = h.new_key("two")
        r = d.post(key=key, headers=[("traceparent", traceparent(tid, pid)),
                                     ("traceparent", traceparent(tid, pid))])
        self.assertEqual(r.status, 200)
        seen = up.requests(key=key)[0]
        self.assertEqual(len(seen.header_all("traceparent")), 1)
        self.assertNotEqual(TP.match(seen.header("traceparent")).group(1), tid)
        self.assertEqual(col.of_trace(tid), [])
        with col.cond:
            self.assertEqual(set(col.paths), {"/v1/traces"})

    def test_sampled_flag_and_sample_ratio(self):
        col = self.collector()
        up, d = self.setup_pair({"otlp_endpoint": col.url, "otlp_sample_ratio": "0"})
        # An unsampled parent: forwarded with flags 00, no span exported.
        quiet = secrets.token_hex(16)
        key = h.new_key("quiet")
        self.assertEqual(d.post(key=key, headers={"traceparent": traceparent(quiet, flags="00")})
                         .status, 200)
        m = TP.match(up.requests(key=key)[0].header("traceparent"))
        self.assertEqual((m.group(1), m.group(3)), (quiet, "00"))
        # A new trace at ratio 0: a traceparent upstream, flags 00, no span.
        key = h.new_key("fresh")
        self.assertEqual(d.post(key=key).status, 200)
        m = TP.match(up.requests(key=key)[0].header("traceparent"))
        self.assertIsNotNone(m)
        self.assertEqual(m.group(3), "00")
        fresh = m.group(1)
        # A sampled parent is recorded whatever the ratio.  Spans leave in
        # the order requests end, so once its spans are in, any of the two
        # requests before would be too.
        loud = secrets.token_hex(16)
        self.assertEqual(d.post(key=h.new_key("loud"),
                                headers={"traceparent": traceparent(loud)}).status, 200)
        col.wait_spans(lambda s: s["traceId"] == loud, n=2)
        self.assertEqual(col.of_trace(quiet), [])
        self.assertEqual(col.of_trace(fresh), [])
        with col.cond:
            self.assertEqual({s["traceId"] for s in col.spans}, {loud})

    def test_collector_down_requests_unaffected(self):
        dead = "http://%s:%d" % (h.HOST, h.dead_port())
        up, d = self.setup_pair({"otlp_endpoint": dead})
        for i in range(20):
            key = h.new_key("down%d" % i)
            r = d.post(key=key, headers={"traceparent": traceparent()})
            self.assertEqual(r.status, 200, r)
            self.assertEqual(d.post(key=key).status, 200)
        self.assertEqual(up.count(), 20)

        def counted():
            m = d.metrics()
            return (h.metric_sum(m, "idem_otlp_export_failures_total") >= 1 and
                    h.metric_sum(m, "idem_otlp_spans_dropped_total") >= 1)
        h.wait_until(counted, 30, what="export failures and dropped spans counted")
        self.assertEqual(h.metric_sum(d.metrics(), "idem_otlp_spans_exported_total"), 0)
        self.assertEqual(d.stop(), 0)

    def test_collector_that_never_answers_requests_unaffected(self):
        col = self.collector("hang")
        up, d = self.setup_pair({"otlp_endpoint": col.url, "otlp_queue_spans": 4,
                                 "otlp_timeout": "60s"})
        n = 40
        for i in range(n):
            key = h.new_key("slow%d" % i)
            r = d.post(key=key)
            self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(), n)
        # The exporter sits in one POST that never ends; the queue holds 4:
        # of 80 spans, most are dropped, and counted.
        col.wait_posts(1)
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_otlp_spans_dropped_total") >= 1,
                     30, what="dropped spans counted")
        self.assertEqual(h.metric_sum(d.counted_metrics(), "idem_requests_total",
                                      outcome="new"), n)
        # SIGTERM cuts the POST short: idemd exits, and cleanly.
        self.assertEqual(d.stop(timeout=20), 0)

    def test_without_otlp_endpoint_traceparent_passes_untouched(self):
        up, d = self.setup_pair()
        value = traceparent()
        key = h.new_key("off")
        self.assertEqual(d.post(key=key, headers={"traceparent": value,
                                                  "tracestate": "a=1"}).status, 200)
        seen = up.requests(key=key)[0]
        self.assertEqual(seen.header_all("traceparent"), [value])
        self.assertEqual(seen.header("tracestate"), "a=1")
        m = d.metrics()
        for name in ("idem_otlp_spans_exported_total", "idem_otlp_spans_dropped_total",
                     "idem_otlp_export_failures_total"):
            self.assertEqual(h.metric_sum(m, name), 0, name)

    def test_config_errors(self):
        for text in ("otlp_endpoint: ftp://127.0.0.1:4318\n",
                     "otlp_endpoint: http://\n",
                     "otlp_endpoint: 127.0.0.1:4318\n",
                     "otlp_sample_ratio: 1.5\n",
                     "otlp_sample_ratio: half\n",
                     "otlp_queue_spans: 0\n",
                     "otlp_timeout: 0s\n",
                     "otlp_service_name: \"\"\n"):
            with self.subTest(config=text):
                path = os.path.join(self.tmp, "bad.yaml")
                with open(path, "w") as f:
                    f.write(text)
                p = subprocess.run([h.IDEMD, "--config", path, "-t"],
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=20,
                                   cwd=self.tmp)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(text.split(":")[0], p.stderr.decode())

if __name__ == "__main__":
    unittest.main()
