"""The upstream of the chaos harness: a service that records every execution.

One RecordingUpstream listens on one loopback port per idemd instance (so
that it knows which instance forwarded each request) and keeps, in memory and
under one lock, every execution it ran: key, fence, instance, arrival and end
times, a nonce (1, 2, 3 ... across its life) and the outcome.  GET /history
serves the same list as JSON, for a look at a run by hand.

A request is POST /plain/... or POST /fenced/... with a JSON body
{"op": KEY, "work_ms": N}: the execution "works" for N ms (the client chooses,
so that every duplicate of a key has the same body and so the same
fingerprint) and then writes its effect.  Only the first execution of a key
works that long; a later one (a takeover's) works at most RETRY_WORK_MS: the
first attempt is the one that got stuck, as a stale owner's request is in
real life, so the takeover's write can land before the stale one:

  /plain/   the write is always applied: a stale owner's late write lands
            after a newer owner's (counted afterwards as a stale write)
  /fenced/  the upstream remembers, per key, the highest Idempotency-Fence it
            has received; a request whose fence is lower than that, on
            arrival or at the moment of the write, is refused: nothing is
            applied, and the answer is 409 {"refused": "stale-fence"}

The answer is JSON naming the execution: {"nonce", "key", "fence", "applied"},
200 when applied.  The execution is recorded and its effect applied whether or
not idemd is still there to read the answer (a killed owner's request runs
to its end, as it would in a real service).
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"
MAX_WORK_MS = 60000
MAX_BODY = 64 * 1024
RETRY_WORK_MS = 50


class QuietServer(ThreadingHTTPServer):
    """A loopback listener of the harness (also chaos_ledger's tap): threads
    per request, no noise when idemd breaks a connection."""
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass  # idemd killed mid-request: its connection breaks, that is normal


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive, no access log: the base of the harness's handlers."""
    protocol_version = "HTTP/1.1"
    timeout = 120

    def log_message(self, fmt, *args):
        pass


def serve_instances(handler, instances, **attrs):
    """Start one QuietServer per idemd instance on a free loopback port, each
    served by a daemon thread; every server gets the attributes attrs and
    `instance` (its number).  Returns the servers, in instance order."""
    servers = []
    for i in range(instances):
        srv = QuietServer((HOST, 0), handler)
        for name, value in attrs.items():
            setattr(srv, name, value)
        srv.instance = i
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        servers.append(srv)
    return servers


def close_servers(servers):
    """Stop and close the servers serve_instances started."""
    for srv in servers:
        srv.shutdown()
        srv.server_close()


class Recorder:
    """The common part of the recording upstream and chaos_ledger's tap: one
    listener per idemd instance, served by handler (each server's attribute
    attr is the recorder), and one history under one lock.  A subclass sets
    its own fields first, then calls this __init__ (which starts serving)."""

    def __init__(self, handler, instances, attr):
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._execs = []
        self._keys = set()      # keys executed (forwarded) at least once
        self.servers = serve_instances(handler, instances, **{attr: self})

    def url(self, instance):
        return "http://%s:%d" % (HOST, self.servers[instance].server_address[1])

    def executions(self):
        """A copy of the history (entries still under way have t_end None)."""
        with self.lock:
            return [dict(e) for e in self._execs]

    def close(self):
        self.stopping.set()
        close_servers(self.servers)


class _Handler(QuietHandler):

    def _answer(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        if self.path == "/history":
            self._answer(200, self.server.up.executions())
        else:
            self._answer(404, {"error": "not found"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            self._answer(413, {"error": "body too large"})
            return
        body = self.rfile.read(n)
        mode = "fenced" if self.path.startswith("/fenced/") else "plain"
        try:
            work_ms = min(max(int(json.loads(body or b"{}").get("work_ms", 0)), 0), MAX_WORK_MS)
        except (ValueError, AttributeError, TypeError):
            work_ms = 0
        fence_raw = self.headers.get("Idempotency-Fence")
        fence = int(fence_raw) if fence_raw is not None and fence_raw.strip().isdigit() else None
        key = self.headers.get("Idempotency-Key")
        status, doc = self.server.up.execute(self.server.instance, mode, key, fence, work_ms)
        try:
            self._answer(status, doc)
        except OSError:
            self.close_connection = True


class RecordingUpstream(Recorder):
    """The recording upstream: instances listeners, one history."""

    def __init__(self, instances=2):
        self._max_seen = {}     # key -> highest fence received (fenced mode)
        super().__init__(_Handler, instances, "up")

    def execute(self, instance, mode, key, fence, work_ms):
        """Run one execution: record it, work, apply (or refuse) its write."""
        with self.lock:
            e = {"nonce": len(self._execs) + 1, "key": key, "fence": fence, "mode": mode,
                 "instance": instance, "t_arr": time.monotonic(), "t_end": None,
                 "outcome": None, "status": None}
            self._execs.append(e)
            refused = False
            if key in self._keys:
                work_ms = min(work_ms, RETRY_WORK_MS)
            self._keys.add(key)
            if mode == "fenced" and key is not None and fence is not None:
                top = self._max_seen.get(key)
                refused = top is not None and fence < top
                if top is None or fence > top:
                    self._max_seen[key] = fence
        if not refused and work_ms:
            self.stopping.wait(work_ms / 1000.0)
        with self.lock:
            if mode == "fenced" and not refused and key is not None and fence is not None:
                refused = fence < self._max_seen.get(key, fence)
            e["outcome"] = "refused" if refused else "applied"
            e["status"] = 409 if refused else 200
            e["t_end"] = time.monotonic()
        doc = {"nonce": e["nonce"], "key": key, "fence": fence, "applied": not refused}
        if refused:
            doc["refused"] = "stale-fence"
        return e["status"], doc
