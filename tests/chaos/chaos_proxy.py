"""The fault proxy of the chaos harness: clients -> FaultProxy -> idemd.

One proxy stands in front of each idemd instance and forwards one request per
connection (the clients send "Connection: close").  It reads the whole request,
connects to the instance's current port (idemd gets a new port at each
restart, the proxy's stays), sends it, and reads idemd's whole answer.  Then,
for a fraction `drop` of the answers, it drops it: closes the client's
connection without sending a byte, after idemd (and so the upstream) has
done everything.  That is the fault a client meets when a response is lost on
the way back, and it must retry with the same key.

Every complete answer idemd gave that carries an upstream body (JSON with a
"nonce", or the ledger's answer named by the tap's X-Chaos-Forward header)
is reported to on_answer(record), delivered or dropped, so that the
history check knows what idemd said and when.  When idemd is not there (killed,
restarting) or dies mid-answer, the client's connection is closed too: a
connection error the client retries.
"""

import json
import random
import socket
import threading
import time

HOST = "127.0.0.1"
MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 1024 * 1024
IO_TIMEOUT = 30.0


class Incomplete(Exception):
    """The peer closed (or timed out) before a whole message arrived."""


def read_message(sock, buf=b""):
    """Read one HTTP/1.1 message framed by Content-Length (or by the end of
    the connection when it has none and is not chunked).

    @return (head bytes, body bytes); raises Incomplete when the peer stops
            early, ValueError on a message it cannot frame"""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            raise ValueError("head too large")
        chunk = sock.recv(65536)
        if not chunk:
            raise Incomplete("closed in the head")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = None
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    is_response = head.startswith(b"HTTP/")
    if length is None and not chunked and not is_response:
        length = 0  # a request without a body
    if length is not None:
        if length < 0 or length > MAX_BODY:
            raise ValueError("bad Content-Length")
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise Incomplete("closed in the body")
            rest += chunk
        return head, rest[:length]
    # chunked or close-delimited: until the peer closes (the client asked for close)
    while True:
        if len(rest) > MAX_BODY:
            raise ValueError("body too large")
        chunk = sock.recv(65536)
        if not chunk:
            if chunked and not rest.endswith(b"0\r\n\r\n"):
                raise Incomplete("closed in a chunked body")
            return head, rest
        rest += chunk


def header_of(head, name):
    name = name.lower().encode()
    for line in head.split(b"\r\n")[1:]:
        n, _, v = line.partition(b":")
        if n.strip().lower() == name:
            return v.strip().decode("latin-1")
    return None


def upstream_doc(head, body):
    """The upstream's JSON document in an answer, or None (idemd's own
    problem+json, or anything else).

    The recording upstream names its execution in the body ("nonce",
    "fence"); the ledger's answers come through the tap of chaos_ledger.py,
    which names the forward in two headers: then the document is the
    ledger's JSON body (or {}) with "nonce" and "fence" added."""
    fwd = header_of(head, "X-Chaos-Forward")
    if fwd is not None and fwd.isdigit():
        try:
            doc = json.loads(body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            doc = None
        doc = dict(doc) if isinstance(doc, dict) else {}
        fence = header_of(head, "X-Chaos-Fence") or ""
        doc["nonce"] = int(fwd)
        doc["fence"] = int(fence) if fence.isdigit() else None
        return doc
    ctype = (header_of(head, "Content-Type") or "").lower()
    if "problem+json" in ctype:
        return None
    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) and "nonce" in doc else None


class FaultProxy:
    """A listener that forwards to target_port() and drops a fraction of the
    complete answers."""

    def __init__(self, instance, target_port, drop, on_answer, seed=None):
        self.instance = instance
        self.target_port = target_port
        self.drop = drop
        self.on_answer = on_answer
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"forwarded": 0, "dropped": 0, "dropped_final": 0, "no_idemd": 0,
                       "broken": 0}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _count(self, name):
        with self.lock:
            self.counts[name] += 1

    def _accept(self):
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, client):
        up = None
        try:
            client.settimeout(IO_TIMEOUT)
            try:
                head, body = read_message(client)
            except (Incomplete, ValueError, OSError):
                return
            try:
                up = socket.create_connection((HOST, self.target_port()), timeout=IO_TIMEOUT)
            except OSError:
                self._count("no_idemd")
                return
            try:
                up.sendall(head + b"\r\n\r\n" + body)
                rhead, rbody = read_message(up)
            except (Incomplete, ValueError, OSError):
                self._count("broken")  # idemd died (or broke the answer)
                return
            t = time.monotonic()
            doc = upstream_doc(rhead, rbody)
            with self.lock:
                dropped = self.rng.random() < self.drop
            if doc is not None:
                status = int(rhead.split(b" ", 2)[1])
                self.on_answer({"key": header_of(head, "Idempotency-Key"),
                                "nonce": doc.get("nonce"), "fence": doc.get("fence"),
                                "status": status, "t": t,
                                "source": "proxy%d%s" % (self.instance,
                                                         " (dropped)" if dropped else "")})
            if dropped:
                self._count("dropped")
                if doc is not None:
                    self._count("dropped_final")
                return
            self._count("forwarded")
            client.sendall(rhead + b"\r\n\r\n" + rbody)
        except OSError:
            pass
        finally:
            if up is not None:
                up.close()
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            client.close()

    def close(self):
        self.closing.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
