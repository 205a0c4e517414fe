"""Shared machinery of idem's black-box tests: a real idemd, a Python upstream.

Every test starts its own idemd (the binary at $IDEMD, default
<repo>/build/idemd) on free loopback ports, with a fresh store in a temporary
directory, in front of its own Python upstream.  The upstream is an HTTP/1.1
keep-alive server that records every request it is sent (so a test can count
executions per Idempotency-Key and read the Idempotency-Fence it saw) and
answers as the test programs it: any status, headers and body, after a delay,
after waiting for an event, or not at all (closing the connection).

Nothing here knows how idemd works inside; it only speaks HTTP to it, sends
it signals and looks at its exit status, as docs/protocol.md describes.

Environment:
  IDEMD          path of the idemd binary (default <repo>/build/idemd)
  IDEM_BB_STORE  "lmdb" (default): lmdb:<tmpdir>/data for each test;
                 "rocksdb": rocksdb:<tmpdir>/data for each test;
                 "memory": memory:;  anything else is used as the store URL
                 as given (e.g. redis://127.0.0.1:6379/0), shared by all tests,
                 which is safe because every test uses fresh random keys.
  IDEM_BB_KEEP   set to 1 to keep the temporary directories.

When a test fails, the stderr of every idemd it started is printed, so the
failure can be read without running it again.
"""

import atexit
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IDEMD = os.environ.get("IDEMD") or str(REPO / "build" / "idemd")
STORE = os.environ.get("IDEM_BB_STORE", "lmdb")
KEEP = os.environ.get("IDEM_BB_KEEP") == "1"

HOST = "127.0.0.1"
_LIVE = set()  # idemd processes not yet reaped: killed at exit even after ^C
READY_TIMEOUT = 10.0
# How long idemd may take to count a request it answered (idem_requests_total
# is bumped when idemd is done with a request, which can be just after the
# answer was written).  Generous: a busy 2-core machine under ASan; reached
# only when a count is really missing.
COUNT_TIMEOUT = 30.0
PROBLEM_PREFIX = "urn:idem:problem:"
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer")


# --------------------------------------------------------------------------
# small utilities


def new_key(prefix="k"):
    """A fresh key nobody has used: tests never share state through the store."""
    return "%s-%s" % (prefix, uuid.uuid4().hex)


def scope_of(value):
    """The scope idemd derives from an Authorization (or scope_header) value."""
    if value is None:
        return "anonymous"
    if isinstance(value, str):
        value = value.encode("latin-1")
    return hashlib.sha256(value).hexdigest()


def free_ports(n=1):
    """n distinct loopback ports that were free a moment ago (bound to port 0)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    return free_ports(1)[0]


_DEAD = {}  # port -> its bound, never-listening socket (see dead_port)


def dead_port():
    """A loopback port where nothing listens, for as long as this process
    runs: a connection to it is refused.  A port that was merely free a
    moment ago (free_port) may meanwhile be taken by another test running
    at the same time (make test runs several), and the "dead" upstream then
    answers; this one is held by a socket bound to it without listening, so
    no other socket can take it.  Upstream(port=dead_port()) listens on
    that very socket."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    _DEAD[port] = s
    return port


def wait_until(pred, timeout, interval=0.05, what="condition"):
    """Poll pred() until it returns a true value; return it, or raise on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def store_is_persistent():
    """Whether records survive an idemd restart (not memory:)."""
    return not STORE.startswith("memory")


def store_is_shared():
    """Whether two idemd processes can share the store (lmdb dir, redis, postgres;
    a rocksdb directory admits one process)."""
    return not STORE.startswith("memory") and not store_is_rocksdb()


def store_is_rocksdb():
    return STORE == "rocksdb" or STORE.startswith("rocksdb:")


def store_is_lmdb():
    return STORE == "lmdb" or STORE.startswith("lmdb:")


def parse_time(v):
    """A timestamp from admin JSON as seconds since the epoch.

    docs/protocol.md section 13 says RFC 3339; accept epoch milliseconds, epoch seconds
    (int or float) or an RFC 3339 string."""
    if isinstance(v, bool) or v is None:
        raise AssertionError("not a timestamp: %r" % (v,))
    if isinstance(v, (int, float)):
        return v / 1000.0 if v > 1e11 else float(v)
    if isinstance(v, str):
        s = v.strip()
        if re.fullmatch(r"\d+(\.\d+)?", s):
            return parse_time(float(s))
        from datetime import datetime
        s = s.replace("Z", "+00:00")
        return datetime.fromisoformat(s).timestamp()
    raise AssertionError("not a timestamp: %r" % (v,))


# --------------------------------------------------------------------------
# YAML (a small emitter: the config is dicts, lists and scalars)

_PLAIN = re.compile(r"^[A-Za-z0-9_./@+\-][A-Za-z0-9_./:@+\-]*$")


def _yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    s = str(v)
    if _PLAIN.match(s) and not s.endswith(":"):
        return s
    return json.dumps(s)


def to_yaml(obj, indent=0):
    pad = "  " * indent
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, dict):
                if v:
                    out.append("%s%s:" % (pad, k))
                    out.append(to_yaml(v, indent + 1))
                else:
                    out.append("%s%s: {}" % (pad, k))
            elif isinstance(v, list):
                if not v:
                    out.append("%s%s: []" % (pad, k))
                elif all(not isinstance(x, (dict, list)) for x in v):
                    out.append("%s%s: [%s]" % (pad, k, ", ".join(_yaml_scalar(x) for x in v)))
                else:
                    out.append("%s%s:" % (pad, k))
                    out.append(to_yaml(v, indent + 1))
            else:
                out.append("%s%s: %s" % (pad, k, _yaml_scalar(v)))
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, dict):
                sub = to_yaml(item, indent + 1).split("\n")
                first = sub[0].lstrip()
                out.append("%s- %s" % (pad, first))
                out.extend(sub[1:])
            else:
                out.append("%s- %s" % (pad, _yaml_scalar(item)))
    return "\n".join(line for line in out if line != "")


# --------------------------------------------------------------------------
# HTTP client side


class Response:
    """One HTTP response: status, headers (ordered, duplicates kept), body."""

    def __init__(self, status, reason, headers, body, elapsed=0.0):
        self.status = status
        self.reason = reason
        self.headers = list(headers)
        self.body = body
        self.elapsed = elapsed

    def header(self, name):
        name = name.lower()
        for n, v in self.headers:
            if n.lower() == name:
                return v
        return None

    def header_all(self, name):
        name = name.lower()
        return [v for n, v in self.headers if n.lower() == name]

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")

    @property
    def replayed(self):
        return self.header("X-Idempotent-Replay") is not None

    def __repr__(self):
        return "<Response %d %s %r>" % (self.status, self.headers, self.body[:300])


def _norm_headers(headers):
    if headers is None:
        return []
    if isinstance(headers, dict):
        return list(headers.items())
    return list(headers)


_ANSWERED = {}  # port -> answers read from it (see Idemd.counted_metrics)
_ANSWERED_LOCK = threading.Lock()


def answered(port):
    """How many answers request() has read from port since it was reset."""
    with _ANSWERED_LOCK:
        return _ANSWERED.get(port, 0)


def request(port, method, path, body=None, headers=None, key=None, timeout=15.0,
            host=HOST, conn=None):
    """Send one request on a new connection (or on conn) and read the answer.

    key: the Idempotency-Key header value as sent (None: no header).
    headers: dict or list of (name, value); values may be bytes.
    A body of None on POST/PATCH/PUT is sent as an empty body."""
    hdrs = _norm_headers(headers)
    if key is not None:
        hdrs.append(("Idempotency-Key", key))
    if isinstance(body, str):
        body = body.encode("utf-8")
    if body is None and method in ("POST", "PATCH", "PUT"):
        body = b""
    if body is not None and not any(n.lower() in ("content-length", "transfer-encoding")
                                    for n, _ in hdrs):
        hdrs.append(("Content-Length", str(len(body))))
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for n, v in hdrs:
            conn.putheader(n, v)
        conn.endheaders(body)
        r = conn.getresponse()
        data = r.read()
        with _ANSWERED_LOCK:
            _ANSWERED[port] = _ANSWERED.get(port, 0) + 1
        return Response(r.status, r.reason, r.getheaders(), data, time.monotonic() - t0)
    finally:
        if own:
            conn.close()


def connect(port, timeout, host=HOST):
    """A TCP connection to host:port with TCP_NODELAY (each send goes at
    once), its operations bounded by timeout."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_until_closed(s, timeout):
    """Read from s until the peer closes it (a reset counts) or timeout:
    (data, closed)."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return data, False
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk


def send_then_read_until_closed(s, data, timeout, shut_write=False):
    """Send data on s (the peer may close before it has all of it, which is
    what the caller checks), read until the peer closes or timeout, and
    close s: (received, closed)."""
    try:
        try:
            s.sendall(data)
            if shut_write:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        return read_until_closed(s, timeout)
    finally:
        s.close()


def raw_exchange(port, data, timeout=5.0, host=HOST, shut_write=False):
    """Send raw bytes, read until the server closes (or timeout); return bytes.

    Returns (received, closed) where closed says whether the server closed
    the connection before the timeout."""
    s = socket.create_connection((host, port), timeout=timeout)
    return send_then_read_until_closed(s, data, timeout, shut_write)


def parse_responses(data, head_only_statuses=(204, 304)):
    """Parse the HTTP/1.1 responses in data (bytes) into a list of Response.

    Bodies are framed by Content-Length or chunked encoding; a response with
    neither takes the rest of the data.  Incomplete trailing data is ignored."""
    out = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        head = data[pos:end].decode("latin-1").split("\r\n")
        m = re.match(r"HTTP/1\.[01] (\d{3})(?: (.*))?$", head[0])
        if not m:
            raise AssertionError("not an HTTP response: %r" % data[pos:pos + 200])
        status = int(m.group(1))
        headers = []
        for line in head[1:]:
            n, _, v = line.partition(":")
            headers.append((n.strip(), v.strip()))
        resp = Response(status, m.group(2) or "", headers, b"")
        pos = end + 4
        te = (resp.header("Transfer-Encoding") or "").lower()
        cl = resp.header("Content-Length")
        if status in head_only_statuses or 100 <= status < 200:
            pass
        elif "chunked" in te:
            body = b""
            while True:
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    return out
                size = int(data[pos:nl].split(b";")[0], 16)
                pos = nl + 2
                if size == 0:
                    # trailers up to an empty line
                    e = data.find(b"\r\n", pos)
                    while e >= 0 and e != pos:
                        pos = e + 2
                        e = data.find(b"\r\n", pos)
                    pos = (e + 2) if e >= 0 else len(data)
                    break
                body += data[pos:pos + size]
                pos += size + 2
            resp.body = body
        elif cl is not None:
            n = int(cl)
            resp.body = data[pos:pos + n]
            pos += n
        else:
            resp.body = data[pos:]
            pos = len(data)
        out.append(resp)
    return out


# --------------------------------------------------------------------------
# the upstream


class Seen:
    """One request as the upstream received it."""

    def __init__(self, seq, method, path, headers, body, t):
        self.seq = seq          # 1, 2, 3 ... across the upstream's life
        self.method = method
        self.path = path
        self.headers = headers  # list of (name, value) as received
        self.body = body
        self.t = t              # time.monotonic() at arrival

    def header(self, name):
        name = name.lower()
        for n, v in self.headers:
            if n.lower() == name:
                return v
        return None

    def header_all(self, name):
        name = name.lower()
        return [v for n, v in self.headers if n.lower() == name]

    @property
    def key(self):
        return self.header("Idempotency-Key")

    @property
    def fence(self):
        v = self.header("Idempotency-Fence")
        return int(v) if v is not None and v.strip().isdigit() else v

    def __repr__(self):
        return "<Seen #%d %s %s key=%r fence=%r>" % (self.seq, self.method, self.path,
                                                      self.key, self.fence)


class Reply:
    """What the upstream does with one request.

    action: "respond" (default), "close" (close without answering),
            "partial" (send the head and half the body, then close).
    delay: seconds to wait before acting.  wait: a threading.Event to wait for
    before acting (bounded by 60 s and by the upstream closing).
    body None: a JSON body naming the execution ({"exec": seq, ...}), so every
    execution's answer is different and a replay can be told from a re-run."""

    def __init__(self, status=200, headers=None, body=None, delay=0.0, action="respond",
                 chunked=False, wait=None, reason=None):
        self.status = status
        self.headers = _norm_headers(headers)
        self.body = body
        self.delay = delay
        self.action = action
        self.chunked = chunked
        self.wait = wait
        self.reason = reason


class _UpstreamHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass  # connections idemd closes mid-way are normal here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120

    def log_message(self, fmt, *args):
        pass

    def _read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            body = b""
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline(65537)
        n = self.headers.get("Content-Length")
        if n is None:
            return b""
        return self.rfile.read(int(n))

    def _handle(self):
        up = self.server.upstream
        body = self._read_body()
        seen = up._record(self.command, self.path, list(self.headers.items()), body)
        try:
            reply = up.behaviour(seen)
        except Exception as e:  # a bug in a test's behaviour: answer 599 so it shows
            reply = Reply(599, body=("behaviour raised %r" % (e,)).encode())
        if reply is None:
            reply = up.default_reply(seen)
        if reply.wait is not None:
            deadline = time.monotonic() + 60
            while not reply.wait.is_set() and not up.stopping.is_set() \
                    and time.monotonic() < deadline:
                reply.wait.wait(0.05)
        if reply.delay:
            up.stopping.wait(reply.delay)
        if up.stopping.is_set() and reply.action == "respond" and up._hard_stop:
            reply.action = "close"
        body = reply.body
        if body is None:
            body = json.dumps({"exec": seen.seq, "key": seen.key, "fence": seen.fence,
                               "method": seen.method, "path": seen.path}).encode()
        if isinstance(body, str):
            body = body.encode()
        if reply.action == "close":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        head = ["HTTP/1.1 %d %s" % (reply.status, reply.reason or
                                    http.client.responses.get(reply.status, "Status"))]
        names = {n.lower() for n, _ in reply.headers}
        for n, v in reply.headers:
            head.append("%s: %s" % (n, v))
        if reply.chunked:
            if "transfer-encoding" not in names:
                head.append("Transfer-Encoding: chunked")
        elif "content-length" not in names and reply.status not in (204, 304):
            head.append("Content-Length: %d" % len(body))
        raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        if reply.action == "partial":
            self.wfile.write(raw + body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if reply.chunked:
            step = max(1, len(body) // 3) if body else 1
            for i in range(0, len(body), step):
                part = body[i:i + step]
                raw += b"%x\r\n%s\r\n" % (len(part), part)
            raw += b"0\r\n\r\n"
        else:
            raw += body
        self.wfile.write(raw)
        self.wfile.flush()
        if (self.headers.get("Connection") or "").lower() == "close":
            self.close_connection = True
        up._answered(seen)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _handle

    def do_HEAD(self):  # never used with a body
        self._handle()


class Upstream:
    """A programmable HTTP/1.1 upstream that records what it is sent.

    Set .behaviour to a function Seen -> Reply (or None for the default
    answer: 200 with a JSON body naming the execution)."""

    def __init__(self, port=0):
        held = _DEAD.pop(port, None)
        if held is None:
            self.server = _UpstreamHTTPServer((HOST, port), _Handler)
        else:
            # The port dead_port() held: listen on its own socket, so that
            # nothing can take the port between "dead" and "up".
            self.server = _UpstreamHTTPServer((HOST, port), _Handler, bind_and_activate=False)
            self.server.socket.close()
            self.server.socket = held
            self.server.server_address = held.getsockname()
            self.server.server_activate()
        self.server.upstream = self
        self.port = self.server.server_address[1]
        self.url = "http://%s:%d" % (HOST, self.port)
        self.seen = []
        self.answered = []
        self.cond = threading.Condition()
        self.stopping = threading.Event()
        self._hard_stop = False
        self.behaviour = lambda seen: None
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def default_reply(self, seen):
        return Reply()

    def _record(self, method, path, headers, body):
        with self.cond:
            s = Seen(len(self.seen) + 1, method, path, headers, body, time.monotonic())
            self.seen.append(s)
            self.cond.notify_all()
            return s

    def _answered(self, seen):
        with self.cond:
            self.answered.append(seen)
            self.cond.notify_all()

    def set_reply(self, reply=None, **kw):
        """Answer every request with one Reply (or Reply(**kw))."""
        r = reply if reply is not None else Reply(**kw)
        self.behaviour = lambda seen: r

    def script(self, *replies, then=None):
        """Answer the n-th request with the n-th reply, later ones with then."""
        lst = list(replies)
        lock = threading.Lock()

        def pick(seen):
            with lock:
                return lst.pop(0) if lst else then
        self.behaviour = pick

    def requests(self, key=None, path=None):
        """The requests seen, optionally only those with this raw key or path."""
        with self.cond:
            out = list(self.seen)
        if key is not None:
            out = [s for s in out if s.key == key]
        if path is not None:
            out = [s for s in out if s.path == path]
        return out

    def count(self, key=None, path=None):
        return len(self.requests(key, path))

    def wait_seen(self, n, timeout=10.0, key=None):
        """Wait until n requests (with this raw key, if given) have arrived."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                have = [s for s in self.seen if key is None or s.key == key]
                if len(have) >= n:
                    return have
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("upstream saw %d of %d requests%s within %.1fs"
                                         % (len(have), n, "" if key is None else
                                            " for key %r" % key, timeout))
                self.cond.wait(left)

    def wait_answered(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.answered) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("upstream answered %d of %d requests" %
                                         (len(self.answered), n))
                self.cond.wait(left)

    def close(self):
        self.stopping.set()
        self._hard_stop = True
        try:
            self.server.shutdown()
        finally:
            self.server.server_close()


# --------------------------------------------------------------------------
# a PostgreSQL server of a test's own (test_shared_stores, test_pg_tls)


def running_as_root():
    return hasattr(os, "geteuid") and os.geteuid() == 0


def pg_bin():
    """The directory of PostgreSQL's initdb and pg_ctl, or None."""
    base = "/usr/lib/postgresql"
    try:
        versions = sorted((d for d in os.listdir(base) if d.isdigit()), key=int)
    except OSError:
        versions = []
    for v in reversed(versions):
        b = os.path.join(base, v, "bin")
        if os.path.exists(os.path.join(b, "initdb")) and os.path.exists(os.path.join(b, "pg_ctl")):
            return b
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def pg_available():
    """Whether a test can run a PostgreSQL server of its own: initdb and
    pg_ctl, and as root (which PostgreSQL refuses) a postgres user and
    runuser to run them as it."""
    if pg_bin() is None:
        return False
    if running_as_root():
        try:
            import pwd
            pwd.getpwnam("postgres")
        except KeyError:
            return False
        return shutil.which("runuser") is not None
    return True


def give_to_pg_server(path):
    """Make path the server's (the postgres user's when we are root)."""
    if running_as_root():
        shutil.chown(path, "postgres", "postgres")


def as_pg_server(argv):
    """argv run as the postgres user when we are root."""
    return ["runuser", "-u", "postgres", "--"] + list(argv) if running_as_root() else list(argv)


def tail_of(path, n=2000):
    """The last n characters of the file at path, or "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-n:]
    except OSError:
        return ""


def run_as_pg_server(argv, log=None, timeout=120):
    """Run argv (as_pg_server); on failure an AssertionError with its stderr
    and the tail of the server's log file log."""
    p = subprocess.run(as_pg_server(argv), stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=timeout, check=False)
    if p.returncode != 0:
        raise AssertionError("%s failed (%d): %s\n%s" % (
            " ".join(argv[:2]), p.returncode, p.stderr.decode("utf-8", "replace")[-2000:],
            tail_of(log) if log is not None else ""))
    return p


# --------------------------------------------------------------------------
# idemd


def store_url_for(tmpdir, name="data"):
    if STORE == "lmdb":
        return "lmdb:%s" % os.path.join(tmpdir, name)
    if STORE == "rocksdb":
        return "rocksdb:%s" % os.path.join(tmpdir, name)
    if STORE == "memory":
        return "memory:"
    return STORE


class Idemd:
    """One idemd process.  Ports are chosen free on each start.

    config: a dict written as the YAML file given with --config.
    store: the --store URL (default: this test's store, see IDEM_BB_STORE).
    upstream: the --upstream URL.
    Flags --listen, --admin, --upstream, --store, --log-format are given
    (use_flags=False: the same settings go into the config file instead);
    store=False leaves the store out (idemd's default); extra_args are
    appended."""

    def __init__(self, workdir, upstream, config=None, store=None, extra_args=(),
                 log_format="text", name="idemd", env=None, cwd=None, use_flags=True):
        self.workdir = workdir
        self.upstream = upstream
        self.config = dict(config or {})
        self.use_flags = use_flags
        self.store = store_url_for(workdir) if store is None else store
        self.extra_args = list(extra_args)
        self.log_format = log_format
        self.name = name
        self.env = env
        self.cwd = cwd or workdir
        self.proc = None
        self.port = None
        self.admin_port = None
        self.starts = 0
        self.logs = []  # paths of the stderr files of every start
        self.config_path = os.path.join(workdir, "%s.yaml" % name)

    def argv(self):
        cfg = dict(self.config)
        listen = "%s:%d" % (HOST, self.port)
        admin = "%s:%d" % (HOST, self.admin_port)
        if self.use_flags:
            argv = [IDEMD, "--config", self.config_path, "--listen", listen, "--admin", admin,
                    "--upstream", self.upstream]
            if self.store is not False:
                argv += ["--store", self.store]
            argv += ["--log-format", self.log_format]
        else:
            # everything from the file: the flags' twins in the config
            cfg.update({"listen": listen, "admin": admin, "upstream": self.upstream})
            if self.store is not False:
                cfg["store"] = self.store
            argv = [IDEMD, "--config", self.config_path]
        with open(self.config_path, "w") as f:
            f.write(to_yaml(cfg) + "\n")
        return argv + self.extra_args

    def start(self, attempts=3):
        """Start and wait until GET /healthz answers 200 (READY_TIMEOUT)."""
        if not os.path.exists(IDEMD):
            raise AssertionError("idemd binary not found at %s (set $IDEMD)" % IDEMD)
        last = None
        for _ in range(attempts):
            self.port, self.admin_port = free_ports(2)
            with _ANSWERED_LOCK:
                _ANSWERED[self.port] = 0  # a new process counts from 0
            self.starts += 1
            log = os.path.join(self.workdir, "%s.%d.stderr" % (self.name, self.starts))
            self.logs.append(log)
            with open(log, "wb") as err:
                self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                             stdout=err, stderr=err, cwd=self.cwd,
                                             env=self.env)
            _LIVE.add(self.proc)
            try:
                self.wait_ready()
                return self
            except AssertionError as e:
                last = e
                if self.proc.poll() is None:
                    raise
                # it exited: perhaps a port was taken in between; try new ports
        raise last

    def wait_ready(self, timeout=READY_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise AssertionError("idemd exited with %d before it was ready:\n%s"
                                     % (rc, self.log_text()[-3000:]))
            # Ask only once idemd says it listens on every socket of its own:
            # before, the admin port may be another test's process, which
            # would take the probe as a request (and count it) and answer 200.
            try:
                if self.started_listening():
                    r = request(self.admin_port, "GET", "/healthz", timeout=1.0)
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise AssertionError("idemd not ready after %.0fs:\n%s"
                                     % (timeout, self.log_text()[-3000:]))
            time.sleep(0.05)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        if self.running():
            self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=20.0):
        """Send sig and wait for the exit; return the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
            _LIVE.discard(self.proc)
            return rc
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("idemd did not exit within %.0fs of signal %d"
                                 % (timeout, sig))

    def kill(self):
        """SIGKILL (a crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            _LIVE.discard(self.proc)

    def spawn(self, tag, env=None):
        """Start the process on new free ports without waiting for it to be
        ready (a start that is to fail); its stderr goes to
        <workdir>/<name>.<tag>.stderr, whose path is returned.  env: the
        environment instead of the Idemd's own."""
        self.port, self.admin_port = free_ports(2)
        log = os.path.join(self.workdir, "%s.%s.stderr" % (self.name, tag))
        self.logs.append(log)
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=err,
                                         stderr=err, cwd=self.cwd,
                                         env=self.env if env is None else env)
        _LIVE.add(self.proc)
        return log

    def wait_exit(self, timeout):
        """The exit status of a process that ends by itself, or None when it
        still runs after timeout (it is then killed)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        _LIVE.discard(self.proc)
        return rc

    def started_listening(self):
        """Whether this start's log has idemd's "listening on" line."""
        try:
            with open(self.logs[-1], "rb") as f:
                return b"listening on" in f.read()
        except (OSError, IndexError):
            return False

    def log_text(self):
        out = []
        for p in self.logs:
            try:
                with open(p, "rb") as f:
                    out.append(f.read().decode("utf-8", "replace"))
            except OSError:
                pass
        return "".join(out)

    # clients

    def request(self, method, path, body=None, headers=None, key=None, timeout=15.0):
        return request(self.port, method, path, body=body, headers=headers, key=key,
                       timeout=timeout)

    def post(self, path="/pay", body=b'{"amount": 100}', key=None, headers=None,
             timeout=15.0):
        return self.request("POST", path, body=body, headers=headers, key=key,
                            timeout=timeout)

    def admin(self, method, path, timeout=10.0):
        return request(self.admin_port, method, path, timeout=timeout)

    def key_path(self, key, scope=None):
        p = "/keys/" + urllib.parse.quote(key, safe="")
        if scope is not None:
            p += "?scope=" + urllib.parse.quote(scope, safe="")
        return p

    def get_key(self, key, scope=None):
        return self.admin("GET", self.key_path(key, scope))

    def delete_key(self, key, scope=None):
        return self.admin("DELETE", self.key_path(key, scope))

    def metrics(self):
        r = self.admin("GET", "/metrics")
        if r.status != 200:
            raise AssertionError("GET /metrics: %r" % r)
        return parse_metrics(r.text)

    def counted_metrics(self, timeout=COUNT_TIMEOUT):
        """/metrics once idemd has counted every request whose answer this
        client read from it (request(), on any connection to self.port).

        idemd bumps idem_requests_total (and the request histogram) when it
        is done with a request, which can be just after the answer was
        written: a scrape right after an answer may miss it, and a baseline
        read then is one short (a later read is "one too many").  So wait
        until the requests counted, all outcomes together, are at least the
        answers read.  Read counters this way when no request of the test is
        between its answer and the read (requests still open do not count
        as answered).  Raises when idemd never counts an answered request."""
        want = answered(self.port)
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            got = metric_sum(m, "idem_requests_total")
            if got >= want:
                return m
            if time.monotonic() >= deadline:
                raise AssertionError("idemd counted %d requests in idem_requests_total "
                                     "%.0fs after it had answered %d" % (got, timeout, want))
            time.sleep(0.02)

    def in_flight(self):
        """idem_in_flight: the requests idemd has read a head of and is not
        done with (a request answered 503 whose outcome idemd still tries to
        store counts until it stops trying)."""
        return metric_sum(self.metrics(), "idem_in_flight")

    def wait_in_flight(self, n, timeout=COUNT_TIMEOUT):
        """Wait until idemd has at least n requests in flight: requests sent
        from other threads have reached it."""
        return wait_until(lambda: self.in_flight() >= n, timeout,
                          what="%d requests in flight in idemd" % n, interval=0.02)

    def wait_idle(self, timeout=COUNT_TIMEOUT):
        """Wait until idemd is done with every request (idem_in_flight 0)."""
        return wait_until(lambda: self.in_flight() == 0, timeout,
                          what="idemd to be done with every request", interval=0.05)

    def outcome(self, outcome):
        """The outcome counter, every answered request counted (counted_metrics)."""
        return metric_sum(self.counted_metrics(), "idem_requests_total", outcome=outcome)

    def outcome_reaches(self, outcome, value, timeout=COUNT_TIMEOUT):
        """The outcome counter once every answered request is counted and it
        reached value (requests the client had no answer to may be counted
        later), or its value at the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.outcome(outcome)
            if v >= value or time.monotonic() >= deadline:
                return v
            time.sleep(0.02)


@atexit.register
def _kill_leftovers():
    for p in list(_LIVE):
        if p.poll() is None:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------
# Prometheus text


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Samples of a Prometheus text exposition: list of (name, labels, value),
    plus the TYPE lines as a dict name -> type under the key None."""
    samples = []
    types = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise AssertionError("bad metrics line: %r" % line)
        labels = dict(_LABEL.findall(m.group(3) or ""))
        samples.append((m.group(1), labels, float(m.group(4))))
    return {"samples": samples, "types": types}


def metric_sum(metrics, name, **labels):
    """Sum of the samples of name whose labels include labels (0 when none)."""
    total = 0.0
    for n, l, v in metrics["samples"]:
        if n == name and all(l.get(k) == str(x) for k, x in labels.items()):
            total += v
    return total


# --------------------------------------------------------------------------
# the test case base


class IdemTestCase(unittest.TestCase):
    """Starts upstreams and idemd processes for a test and tears them down.

    Every process and directory is cleaned up even when the test fails; the
    logs of the idemd processes are printed when it fails."""

    maxDiff = 4000

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="idem-bb-")
        if not KEEP:
            self.addCleanup(shutil.rmtree, self.tmp, True)
        self._daemons = []

    def run(self, result=None):
        if result is None:
            return super().run(result)
        before = len(result.failures) + len(result.errors)
        self._log_dump = ""
        out = super().run(result)
        if len(result.failures) + len(result.errors) > before and self._log_dump:
            sys.stderr.write("\n----- idemd logs of %s -----\n%s----- end of logs -----\n"
                             % (self.id(), self._log_dump[-8000:]))
        return out

    def _collect(self, d):
        try:
            text = d.log_text()
        except Exception:
            text = ""
        if text:
            self._log_dump += "[%s]\n%s\n" % (d.name, text)

    def _check_sanitizers(self, d):
        """A sanitizer report in idemd's stderr fails the test, even when
        everything idemd answered was right (UBSan does not change the exit
        status)."""
        text = d.log_text()
        for marker in SANITIZER_MARKERS:
            i = text.find(marker)
            if i >= 0:
                self.fail("%s reported a problem in %s:\n%s" % (marker, d.name,
                                                                 text[max(0, i - 200):i + 3000]))

    def start_upstream(self):
        up = Upstream()
        self.addCleanup(up.close)
        return up

    def make_idemd(self, upstream=None, config=None, name=None, **kw):
        """An Idemd not yet started (for tests that start it themselves)."""
        url = upstream.url if isinstance(upstream, Upstream) else upstream
        if url is None:
            url = "http://%s:%d" % (HOST, dead_port())
        d = Idemd(self.tmp, url, config=config, name=name or "idemd%d" % len(self._daemons),
                  **kw)
        self._daemons.append(d)
        self.addCleanup(self._check_sanitizers, d)
        self.addCleanup(self._collect, d)
        self.addCleanup(d.kill)
        return d

    def start_idemd(self, upstream=None, config=None, **kw):
        d = self.make_idemd(upstream, config, **kw)
        d.start()
        return d

    def setup_pair(self, config=None, **kw):
        """A fresh upstream and an idemd in front of it."""
        up = self.start_upstream()
        d = self.start_idemd(up, config, **kw)
        return up, d

    # assertions

    def assertProblem(self, resp, status, ptype):
        """resp is an RFC 9457 problem made by idemd of this status and type."""
        self.assertEqual(resp.status, status, "expected %d %s, got %r" % (status, ptype, resp))
        ct = (resp.header("Content-Type") or "").split(";")[0].strip().lower()
        self.assertEqual(ct, "application/problem+json", "Content-Type of %r" % resp)
        try:
            doc = resp.json()
        except ValueError:
            self.fail("problem body is not JSON: %r" % resp.body)
        self.assertIsInstance(doc, dict)
        self.assertEqual(doc.get("type"), PROBLEM_PREFIX + ptype, "problem %r" % doc)
        self.assertEqual(doc.get("status"), status, "problem %r" % doc)
        self.assertIsInstance(doc.get("title"), str, "problem %r" % doc)
        self.assertTrue(doc.get("title"), "problem %r has an empty title" % doc)
        self.assertIsInstance(doc.get("detail"), str, "problem %r" % doc)
        return doc

    def assertRetryAfter(self, resp, low=0, high=None):
        """Retry-After is present, in whole seconds, within [low, high]."""
        ra = resp.header("Retry-After")
        self.assertIsNotNone(ra, "no Retry-After on %r" % resp)
        self.assertRegex(ra.strip(), r"^\d+$", "Retry-After not whole seconds")
        v = int(ra)
        self.assertGreaterEqual(v, low)
        if high is not None:
            self.assertLessEqual(v, high)
        return v

    def assertNotReplay(self, resp, header="X-Idempotent-Replay"):
        self.assertIsNone(resp.header(header), "%s on a first answer: %r" % (header, resp))

    def assertReplayOf(self, replay, first, header="X-Idempotent-Replay"):
        """replay repeats first exactly (status, body, end-to-end headers) and
        carries the replay header."""
        self.assertEqual(replay.header(header), "true", "%s missing: %r" % (header, replay))
        self.assertEqual(replay.status, first.status)
        self.assertEqual(replay.body, first.body)
        self.assertEqual(end_to_end(replay.headers, drop=(header,)),
                         end_to_end(first.headers, drop=(header,)))


# headers a proxy may legitimately add or change when it writes a response
_VARIABLE = {"date", "server", "content-length", "connection", "keep-alive",
             "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def end_to_end(headers, drop=()):
    """The headers that a replay must repeat exactly: everything but framing,
    Date/Server, hop-by-hop headers and idemd's own markers."""
    drop = {d.lower() for d in drop} | _VARIABLE | {"idempotency-bypassed"}
    return [(n.lower(), v) for n, v in headers
            if n.lower() not in drop and not n.lower().startswith("proxy-")]


def in_threads(fns, timeout=60.0):
    """Run the functions at once (released together); return their results
    (an exception instance in place of a result when one raised)."""
    n = len(fns)
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i, fn):
        try:
            barrier.wait(timeout)
            results[i] = fn()
        except BaseException as e:  # noqa: B902 - reported to the caller
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True)
               for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


class Background:
    """Run fn in a thread now; .result() waits for it (re-raising its error)."""

    def __init__(self, fn):
        self._value = None
        self._error = None
        self._done = threading.Event()

        def body():
            try:
                self._value = fn()
            except BaseException as e:  # noqa: B902
                self._error = e
            finally:
                self._done.set()
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=body, daemon=True)
        self._thread.start()

    def done(self):
        return self._done.is_set()

    def result(self, timeout=30.0):
        if not self._done.wait(timeout):
            raise AssertionError("background request did not finish within %.0fs" % timeout)
        if self._error is not None:
            raise self._error
        return self._value
