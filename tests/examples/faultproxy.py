"""A fault-injecting HTTP/1.1 proxy for black-box tests (Python stdlib only).

It sits between a client and a server and, for each request, does what a
policy says:

  FORWARD        pass the request on and its answer back (the default);
  DROP_RESPONSE  pass the request on, read the server's whole answer, then
                 close the client's connection without sending it: the work
                 was done, the client cannot know (a timeout, a broken
                 connection after the server answered);
  DROP_REQUEST   close the client's connection without passing the request
                 on: nothing was done;
  DELAY          FORWARD after policy-chosen seconds (return (DELAY, s)).

The policy is a callable taking a ProxiedRequest, whose `attempt` counts the
requests with the same identity seen so far (1 for the first), where the
identity is the Idempotency-Key header when there is one and the method,
target and body otherwise.  So "drop the answer of every first attempt and
30 % of the others" is

    rng = random.Random(7)
    def policy(req):
        if req.attempt == 1 or rng.random() < 0.3:
            return faultproxy.DROP_RESPONSE
        return faultproxy.FORWARD

    with faultproxy.FaultProxy(server_port, policy) as proxy:
        ... send requests to proxy.port ...
    proxy.counts  # {"forward": n, "drop_response": n, ...}

Each request goes to the server on a connection of its own; the client side
keeps its connection alive across requests until a fault closes it.  Bodies
are framed by Content-Length or chunked coding, in both directions.  The
policy is called from the proxy's connection threads, one call at a time
(under the proxy's lock), so it may keep state without locking.
"""

import socket
import threading
import time

FORWARD = "forward"
DROP_RESPONSE = "drop_response"
DROP_REQUEST = "drop_request"
DELAY = "delay"

HEAD_MAX = 64 * 1024
BODY_MAX = 64 * 1024 * 1024


class ProxyError(Exception):
    """Malformed or oversized HTTP on one side: the connection is dropped."""


class ProxiedRequest:
    """One request as the proxy received it."""

    def __init__(self, method, target, headers, body, attempt):
        self.method = method
        self.target = target
        self.headers = headers  # list of (name, value), as received
        self.body = body
        self.attempt = attempt  # 1 for the first request with this identity

    def header(self, name):
        return _field(self.headers, name.lower())

    @property
    def key(self):
        return self.header("Idempotency-Key")

    def __repr__(self):
        return "<ProxiedRequest %s %s key=%r attempt=%d>" % (self.method, self.target,
                                                             self.key, self.attempt)


def default_identity(req):
    key = req.key
    if key is not None:
        return ("key", key)
    return ("request", req.method, req.target, req.body)


def _read_head(f):
    """Read a head up to the blank line; None at a clean end of file."""
    lines = []
    size = 0
    while True:
        line = f.readline(HEAD_MAX + 1)
        if not line:
            if not lines:
                return None
            raise ProxyError("connection closed inside a head")
        size += len(line)
        if size > HEAD_MAX:
            raise ProxyError("head too large")
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue  # tolerate an empty line before a request
            return lines
        lines.append(line.rstrip(b"\r\n"))


def _parse_fields(lines):
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ProxyError("bad header line %r" % line[:80])
        headers.append((name.decode("latin-1").strip(), value.decode("latin-1").strip()))
    return headers


def _field(headers, name):
    """The first value of the header name (lower case) in (name, value) pairs;
    None when there is none."""
    for n, v in headers:
        if n.lower() == name:
            return v
    return None


def _read_body(f, headers, until_eof=False):
    """The body's raw bytes as framed on the wire."""
    te = (_field(headers, "transfer-encoding") or "").lower()
    if "chunked" in te:
        raw = b""
        while True:
            line = f.readline(4096)
            if not line:
                raise ProxyError("connection closed inside a chunked body")
            raw += line
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:
                    t = f.readline(4096)
                    raw += t
                    if t in (b"\r\n", b"\n", b""):
                        return raw
            if len(raw) + size > BODY_MAX:
                raise ProxyError("body too large")
            data = f.read(size + 2)
            if len(data) < size + 2:
                raise ProxyError("connection closed inside a chunk")
            raw += data
    cl = _field(headers, "content-length")
    if cl is not None:
        n = int(cl)
        if n < 0 or n > BODY_MAX:
            raise ProxyError("bad Content-Length")
        data = f.read(n)
        if len(data) < n:
            raise ProxyError("connection closed inside a body")
        return data
    if until_eof:
        return f.read(BODY_MAX)
    return b""


def _decoded(raw, headers):
    """The body without chunked framing (for the policy's eyes)."""
    te = (_field(headers, "transfer-encoding") or "").lower()
    if "chunked" not in te:
        return raw
    out = b""
    pos = 0
    while True:
        nl = raw.find(b"\n", pos)
        size = int(raw[pos:nl].split(b";")[0].strip() or b"0", 16)
        pos = nl + 1
        if size == 0:
            return out
        out += raw[pos:pos + size]
        pos += size + 2


class FaultProxy:
    """A proxy on a free loopback port in front of target_host:target_port."""

    def __init__(self, target_port, policy=None, target_host="127.0.0.1", identity=None,
                 listen_host="127.0.0.1", upstream_timeout=60.0):
        self.target = (target_host, target_port)
        self.policy = policy or (lambda req: FORWARD)
        self.identity = identity or default_identity
        self.upstream_timeout = upstream_timeout
        self.lock = threading.Lock()
        self.counts = {FORWARD: 0, DROP_RESPONSE: 0, DROP_REQUEST: 0, DELAY: 0}
        self.errors = []          # upstream failures, as strings
        self._attempts = {}
        self._stopping = threading.Event()
        self._conns = set()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((listen_host, 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        self._thread = None

    # -- life --------------------------------------------------------------

    def start(self):
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self

    def close(self):
        self._stopping.set()
        try:
            self._sock.close()
        except OSError:
            pass
        with self.lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def attempts(self, identity):
        with self.lock:
            return self._attempts.get(identity, 0)

    # -- work --------------------------------------------------------------

    def _accept_loop(self):
        self._sock.settimeout(0.2)
        while not self._stopping.is_set():
            try:
                c, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            c.settimeout(None)
            with self.lock:
                self._conns.add(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _decide(self, method, target, headers, body):
        req = ProxiedRequest(method, target, headers, body, 0)
        with self.lock:
            ident = self.identity(req)
            n = self._attempts.get(ident, 0) + 1
            self._attempts[ident] = n
            req.attempt = n
            action = self.policy(req)
            delay = 0.0
            if isinstance(action, tuple):
                action, delay = action
            self.counts[action] = self.counts.get(action, 0) + 1
        return action, delay

    def _exchange(self, head_raw, body_raw, method):
        """Send one request to the target; return its whole answer's bytes."""
        up = socket.create_connection(self.target, timeout=self.upstream_timeout)
        try:
            up.sendall(head_raw + body_raw)
            f = up.makefile("rb")
            while True:
                lines = _read_head(f)
                if lines is None:
                    raise ProxyError("the target closed without answering")
                status = int(lines[0].split()[1])
                headers = _parse_fields(lines)
                head = b"\r\n".join(lines) + b"\r\n\r\n"
                if 100 <= status < 200:
                    continue  # 100 Continue and friends are not passed on
                if method == "HEAD" or status in (204, 304):
                    return head, headers
                return head + _read_body(f, headers, until_eof=True), headers
        finally:
            up.close()

    def _serve(self, c):
        f = c.makefile("rb")
        try:
            while not self._stopping.is_set():
                lines = _read_head(f)
                if lines is None:
                    return
                parts = lines[0].decode("latin-1").split(" ")
                if len(parts) != 3:
                    raise ProxyError("bad request line")
                method, target = parts[0], parts[1]
                headers = _parse_fields(lines)
                body_raw = _read_body(f, headers)
                action, delay = self._decide(method, target, headers,
                                             _decoded(body_raw, headers))
                if action == DROP_REQUEST:
                    return
                if delay:
                    time.sleep(delay)
                head_raw = b"\r\n".join(lines) + b"\r\n\r\n"
                try:
                    answer, rheaders = self._exchange(head_raw, body_raw, method)
                except (OSError, ProxyError, ValueError, IndexError) as e:
                    with self.lock:
                        self.errors.append("%s %s: %r" % (method, target, e))
                    return
                if action == DROP_RESPONSE:
                    return
                c.sendall(answer)
                conn_hdr = (_field(headers, "connection") or "").lower()
                rconn = (_field(rheaders, "connection") or "").lower()
                if "close" in conn_hdr or "close" in rconn:
                    return
        except (OSError, ProxyError, ValueError, IndexError):
            return
        finally:
            with self.lock:
                self._conns.discard(c)
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
