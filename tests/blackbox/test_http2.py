"""HTTP/2 on the public listener (SPEC section 20), through the real idemd,
with Debian's python3-h2 as the client (hyperframe, under it, for the frames
h2 will not send).

  replay          a keyed POST over HTTP/2 runs once; its repeat over HTTP/2
                  and over HTTP/1.1 on the same port replays it (the same
                  fingerprint however the body came); the access log and the
                  metrics name the protocol
  interleaved     streams of one connection whose bodies come interleaved
                  each run once with their own body
  same key        concurrent streams with one key on one connection: one
                  execution, the others 409
  reset           a stream reset in the middle of its body is never
                  forwarded, and its key is free afterwards
  limits          max_concurrent_streams is advertised and a stream past it
                  is refused; an upper-case field name, a connection-specific
                  field and a missing :path are PROTOCOL_ERROR; a head past
                  16 KiB is 431; a CONTINUATION flood and an HPACK bomb end
                  the connection; a rapid reset flood ends the connection
                  with ENHANCE_YOUR_CALM and another client is answered
  goaway          SIGTERM sends GOAWAY: a stream in flight finishes and is
                  answered; a stream opened after it is not run
  tls             ALPN h2 on listen_tls

Every verdict waits for an event (a frame, an answer, a close, a metric)
with a generous deadline.
"""

import os
import socket
import ssl
import sys
import threading
import time
import unittest

try:
    import h2  # noqa: F401
except ImportError:
    # Debian's python3-h2 lives in the system's dist-packages; a python3
    # of its own on PATH (pyenv, a venv) reads it from there.
    sys.path.append("/usr/lib/python3/dist-packages")
import h2.config  # noqa: E402
import h2.connection  # noqa: E402
import h2.errors  # noqa: E402
import h2.events  # noqa: E402
import h2.exceptions  # noqa: E402
import h2.settings  # noqa: E402
from hyperframe.frame import ContinuationFrame, HeadersFrame, RstStreamFrame  # noqa: E402

try:
    from . import harness as h
except ImportError:
    import harness as h

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from certs import make_certs  # noqa: E402

GENEROUS = 30.0


class Stream:
    def __init__(self, sid):
        self.id = sid
        self.status = None
        self.headers = []
        self.body = b""
        self.ended = False
        self.reset = None  # the error code of a RST_STREAM

    def header(self, name):
        for n, v in self.headers:
            if n.decode().lower() == name.lower():
                return v.decode()
        return None

    @property
    def done(self):
        return self.ended or self.reset is not None


class H2Client:
    """One HTTP/2 connection with prior knowledge (or over ssl_ctx with ALPN h2)."""

    def __init__(self, port, timeout=GENEROUS, validate=True, ssl_ctx=None):
        sock = socket.create_connection((h.HOST, port), timeout)
        if ssl_ctx is not None:
            sock = ssl_ctx.wrap_socket(sock, server_hostname="localhost")
            self.alpn = sock.selected_alpn_protocol()
        self.sock = sock
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                        validate_outbound_headers=validate,
                                        normalize_outbound_headers=validate,
                                        validate_inbound_headers=True)
        self.conn = h2.connection.H2Connection(cfg)
        self.conn.initiate_connection()
        self.streams = {}
        self.goaway = None  # ConnectionTerminated
        self.closed = False
        self.remote_settings = {}
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def send_raw(self, data):
        self.sock.sendall(data)

    def headers(self, method, path, extra=(), authority="127.0.0.1"):
        hs = [(":method", method), (":path", path), (":scheme", "http")]
        if authority is not None:
            hs.append((":authority", authority))
        return hs + list(extra)

    def start(self, method="POST", path="/pay", extra=(), body=None, end=True, key=None,
              sid=None):
        if sid is None:
            sid = self.conn.get_next_available_stream_id()
        extra = list(extra)
        if key is not None:
            extra.append(("idempotency-key", key))
        self.streams[sid] = Stream(sid)
        self.conn.send_headers(sid, self.headers(method, path, extra),
                               end_stream=end and body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end)
        self.flush()
        return sid

    def data(self, sid, chunk, end=False):
        self.conn.send_data(sid, chunk, end_stream=end)
        self.flush()

    def reset(self, sid, code=h2.errors.ErrorCodes.CANCEL):
        self.conn.reset_stream(sid, code)
        self.flush()

    def _event(self, e):
        if isinstance(e, h2.events.ResponseReceived):
            st = self.streams.setdefault(e.stream_id, Stream(e.stream_id))
            st.headers = list(e.headers)
            for n, v in e.headers:
                if n == b":status":
                    st.status = int(v)
        elif isinstance(e, h2.events.DataReceived):
            self.streams.setdefault(e.stream_id, Stream(e.stream_id)).body += e.data
            self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        elif isinstance(e, h2.events.StreamEnded):
            self.streams.setdefault(e.stream_id, Stream(e.stream_id)).ended = True
        elif isinstance(e, h2.events.StreamReset):
            self.streams.setdefault(e.stream_id, Stream(e.stream_id)).reset = e.error_code
        elif isinstance(e, h2.events.ConnectionTerminated):
            self.goaway = e
        elif isinstance(e, h2.events.RemoteSettingsChanged):
            for k, v in e.changed_settings.items():
                self.remote_settings[k] = v.new_value

    def pump(self, until, timeout=GENEROUS, what="condition"):
        """Read frames until until() holds (or the connection closes)."""
        deadline = time.monotonic() + timeout
        while not until():
            if self.closed:
                raise AssertionError("connection closed before %s" % what)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no %s within %.0fs" % (what, timeout))
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, ssl.SSLError, OSError):
                data = b""
            if not data:
                self.closed = True
                continue
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.closed = True
                continue
            for e in events:
                self._event(e)
            try:
                self.flush()
            except OSError:
                self.closed = True

    def wait_streams(self, sids, timeout=GENEROUS):
        self.pump(lambda: all(self.streams[s].done for s in sids), timeout,
                  "answers to streams %s" % (sids,))
        return [self.streams[s] for s in sids]

    def wait_closed(self, timeout=GENEROUS):
        self.pump(lambda: self.closed, timeout, "close")

    def pump_until_closed(self, timeout=GENEROUS):
        """Read until the connection closes; AssertionError if it does not."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            try:
                self.pump(lambda: self.closed, max(0.1, deadline - time.monotonic()), "close")
            except AssertionError:
                if self.closed:
                    break
                raise

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def upstream_requests(up, key):
    return [s for s in up.requests() if s.key == key]


class Base(h.IdemTestCase):
    config = {"http2": True}

    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair(dict(self.config))
        self.clients = []
        self.addCleanup(self._close_clients)

    def _close_clients(self):
        for c in self.clients:
            c.close()

    def client(self, **kw):
        c = H2Client(self.d.port, **kw)
        self.clients.append(c)
        return c


class TestBasics(Base):
    def test_replay_over_h2_and_h1(self):
        c = self.client()
        key = h.new_key()
        sid = c.start("POST", "/pay", body=b'{"amount": 7}', key=key,
                      extra=[("content-type", "application/json")])
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 200, st.body)
        first = st.body
        self.assertEqual(self.up.count(key=key), 1)
        # Again over HTTP/2: a replay.
        sid = c.start("POST", "/pay", body=b'{"amount": 7}', key=key,
                      extra=[("content-type", "application/json")])
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 200)
        self.assertEqual(st.body, first)
        # And over HTTP/1.1 on the same port: the same fingerprint, a replay.
        r = self.d.post("/pay", body=b'{"amount": 7}', key=key,
                        headers={"Content-Type": "application/json"})
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, first)
        self.assertEqual(self.up.count(key=key), 1)
        # A different body under the key: 422 over HTTP/2 too.
        sid = c.start("POST", "/pay", body=b'{"amount": 8}', key=key)
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 422)
        self.assertEqual(self.up.count(key=key), 1)

    def test_body_without_length_over_data_frames(self):
        c = self.client()
        key = h.new_key()
        sid = c.start("POST", "/pay", body=b'{"amount"', key=key, end=False)
        c.data(sid, b': 9}', end=True)
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 200, st.body)
        (seen,) = upstream_requests(self.up, key)
        self.assertEqual(seen.body, b'{"amount": 9}')
        self.assertEqual(seen.header("Content-Length"), "13")
        # The same body over HTTP/1.1 replays.
        r = self.d.post("/pay", body=b'{"amount": 9}', key=key)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, st.body)
        self.assertEqual(self.up.count(key=key), 1)

    def test_http1_still_works_on_the_port(self):
        r = self.d.post("/pay", key=h.new_key())
        self.assertEqual(r.status, 200)


if __name__ == "__main__":
    unittest.main()
