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
  timeouts        a stream whose body stalls is answered 408 after
                  body_timeout (its key never claimed) while another stream
                  of the connection is answered; a header block that never
                  ends (CONTINUATION without END_HEADERS) ends the connection
                  after header_timeout
  unread answers  a client that never opens its flow-control windows holds
                  no more than max_queued_bytes, and its connection is
                  closed after body_timeout without progress, the gauge
                  idem_queued_answer_bytes back to 0
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
        self.ack = True  # False: never open a flow-control window again
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
              sid=None, raw=None):
        """Open a stream; raw: its whole header list, as given."""
        if sid is None:
            sid = self.conn.get_next_available_stream_id()
        extra = list(extra)
        if key is not None:
            extra.append(("idempotency-key", key))
        self.streams[sid] = Stream(sid)
        self.conn.send_headers(sid, raw if raw is not None else self.headers(method, path, extra),
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
            if self.ack:
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
        # The metrics count each under its protocol: the first over HTTP/2
        # is new, the replays one per protocol.
        box = {}

        def counted():
            box["m"] = self.d.metrics()
            return h.metric_sum(box["m"], "idem_requests_total") >= 4
        h.wait_until(counted, GENEROUS, what="the four requests counted")
        m = box["m"]
        self.assertEqual(h.metric_sum(m, "idem_requests_total", outcome="new", proto="h2"), 1)
        self.assertEqual(h.metric_sum(m, "idem_requests_total", outcome="new", proto="http1"), 0)
        self.assertEqual(h.metric_sum(m, "idem_requests_total", outcome="replay", proto="h2"), 1)
        self.assertEqual(h.metric_sum(m, "idem_requests_total", outcome="replay", proto="http1"),
                         1)
        self.assertEqual(h.metric_sum(m, "idem_requests_total", outcome="mismatch", proto="h2"), 1)
        # The access log names the protocol of each.
        h.wait_until(lambda: "proto=HTTP/2" in self.d.log_text()
                     and "proto=HTTP/1.1" in self.d.log_text(), GENEROUS,
                     what="access log lines naming the protocols")

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


class TestStreams(Base):
    def test_interleaved_streams_each_run_once_with_its_body(self):
        c = self.client()
        keys = [h.new_key() for _ in range(3)]
        sids = [c.start("POST", "/pay", key=k, body=b'{"n": ', end=False) for k in keys]
        for i, sid in enumerate(sids):
            c.data(sid, b'%d' % i)
        for i, sid in reversed(list(enumerate(sids))):
            c.data(sid, b'}', end=True)
        answers = c.wait_streams(sids)
        for i, (k, st) in enumerate(zip(keys, answers)):
            self.assertEqual(st.status, 200, st.body)
            (seen,) = upstream_requests(self.up, k)
            self.assertEqual(seen.body, b'{"n": %d}' % i)
            self.assertIn(b'"key": "%s"' % k.encode(), st.body)

    def test_same_key_on_one_connection_runs_once(self):
        ev = threading.Event()
        self.addCleanup(ev.set)
        self.up.behaviour = lambda seen: h.Reply(wait=ev)
        c = self.client()
        key = h.new_key()
        first = c.start("POST", "/pay", key=key, body=b'{"a": 1}')
        self.up.wait_seen(1, key=key)
        others = [c.start("POST", "/pay", key=key, body=b'{"a": 1}') for _ in range(3)]
        for st in c.wait_streams(others):
            self.assertEqual(st.status, 409, st.body)
        ev.set()
        (st,) = c.wait_streams([first])
        self.assertEqual(st.status, 200)
        self.assertEqual(self.up.count(key=key), 1)

    def test_reset_mid_body_is_never_forwarded_and_frees_the_key(self):
        c = self.client()
        for length in (None, 13):
            key = h.new_key()
            extra = [("content-length", str(length))] if length else []
            sid = c.start("POST", "/pay", key=key, extra=extra, body=b'{"amount"', end=False)
            c.reset(sid)
            # A later stream on the same connection comes after the reset:
            # once it is answered, the reset stream was dealt with.
            sid2 = c.start("POST", "/pay", key=key, body=b'{"amount": 5}',
                           extra=[("content-length", "13")])
            (st,) = c.wait_streams([sid2])
            self.assertEqual(st.status, 200, st.body)
            seen = upstream_requests(self.up, key)
            self.assertEqual(len(seen), 1)
            self.assertEqual(seen[0].body, b'{"amount": 5}')

    def test_head_past_16k_is_431(self):
        c = self.client()
        sid = c.start("GET", "/x", extra=[("x-big", "a" * 17000)])
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 431)
        self.assertEqual(len(self.up.requests()), 0)
        sid = c.start("GET", "/x")  # the connection goes on
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 200)


class TestProtocolErrors(Base):
    def check_refused(self, raw):
        c = self.client(validate=False)
        sid = c.start(raw=raw)
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.reset, h2.errors.ErrorCodes.PROTOCOL_ERROR, (st.status, st.body))
        sid = c.start("GET", "/ok")  # the connection goes on
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 200)
        self.assertEqual([s.path for s in self.up.requests()], ["/ok"])

    def base(self):
        return [(":method", "POST"), (":path", "/pay"), (":scheme", "http"),
                (":authority", "127.0.0.1")]

    def test_uppercase_name(self):
        self.check_refused(self.base() + [("X-Upper", "1")])

    def test_connection_specific_field(self):
        self.check_refused(self.base() + [("connection", "keep-alive")])

    def test_missing_path(self):
        self.check_refused([(":method", "GET"), (":scheme", "http"),
                            (":authority", "127.0.0.1")])


class TestConcurrency(Base):
    config = {"http2": True, "http2_max_concurrent_streams": 2}

    def test_max_concurrent_streams_advertised_and_enforced(self):
        ev = threading.Event()
        self.addCleanup(ev.set)
        self.up.behaviour = lambda seen: h.Reply(wait=ev)
        c = self.client()
        # Opened before idemd's SETTINGS are read, so the client does not
        # hold itself back: idemd must.
        sids = [c.start("GET", "/slow%d" % i) for i in range(3)]
        c.pump(lambda: c.streams[sids[2]].done, what="the third stream refused")
        self.assertEqual(c.remote_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS),
                         2)
        self.assertIn(c.streams[sids[2]].reset, (h2.errors.ErrorCodes.REFUSED_STREAM,
                                                 h2.errors.ErrorCodes.PROTOCOL_ERROR))
        self.up.wait_seen(2)
        ev.set()
        for st in c.wait_streams(sids[:2]):
            self.assertEqual(st.status, 200)
        self.assertEqual(sorted(s.path for s in self.up.requests()), ["/slow0", "/slow1"])


class TestFloods(Base):
    def frames_client(self):
        c = self.client(validate=False)
        c.pump(lambda: c.remote_settings, what="SETTINGS")
        return c

    def assert_others_answered(self):
        other = self.client()
        sid = other.start("GET", "/other")
        (st,) = other.wait_streams([sid])
        self.assertEqual(st.status, 200)

    def test_rapid_reset_closes_the_connection(self):
        c = self.frames_client()
        sent = 0
        try:
            for _ in range(1000):
                sid = c.conn.get_next_available_stream_id()
                c.conn.send_headers(sid, c.headers("GET", "/rr"), end_stream=True)
                c.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                sent += 1
                if sent % 50 == 0:
                    c.flush()
            c.flush()
        except (OSError, h2.exceptions.ProtocolError):
            pass  # closed under us: what is checked below
        c.pump_until_closed()
        self.assertIsNotNone(c.goaway, "no GOAWAY before the close")
        self.assertEqual(c.goaway.error_code, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        self.assertLess(len(self.up.requests()), 1000)
        self.assert_others_answered()

    def test_continuation_flood_closes_the_connection(self):
        c = self.frames_client()
        import hpack
        enc = hpack.Encoder()
        block = enc.encode(c.headers("GET", "/cf"))
        sid = 1
        frames = [HeadersFrame(sid, data=block).serialize()]
        for i in range(50):
            cf = ContinuationFrame(sid, data=enc.encode([("x-f%d" % i, "v")]))
            frames.append(cf.serialize())
        try:
            c.send_raw(b"".join(frames))
        except OSError:
            pass
        c.pump_until_closed()
        self.assertEqual(len(self.up.requests()), 0)
        self.assert_others_answered()

    def test_hpack_bomb_closes_the_connection(self):
        c = self.frames_client()
        import hpack
        enc = hpack.Encoder()
        # One 4000-byte field into the dynamic table, then referenced again
        # and again: a few hundred bytes that decode to megabytes.
        fields = c.headers("GET", "/bomb") + [("x-bomb", "b" * 4000)] * 1000
        block = enc.encode(fields)
        self.assertLess(len(block), 8000)
        f = HeadersFrame(1, data=block)
        f.flags.add("END_HEADERS")
        f.flags.add("END_STREAM")
        try:
            c.send_raw(f.serialize())
        except OSError:
            pass
        c.pump_until_closed()
        self.assertIsNotNone(c.goaway)
        self.assertEqual(c.goaway.error_code, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        self.assertEqual(len(self.up.requests()), 0)
        self.assert_others_answered()


class TestTimeouts(Base):
    config = {"http2": True, "body_timeout": "1s", "header_timeout": "1s",
              "idle_timeout": "60s"}

    def test_a_stalled_body_is_408_and_the_other_stream_is_answered(self):
        c = self.client()
        key = h.new_key()
        t0 = time.monotonic()
        stalled = c.start("POST", "/pay", key=key, extra=[("content-length", "13")],
                          body=b'{"amo', end=False)
        # Another stream of the connection, opened after the stall, is
        # answered as usual.
        other_key = h.new_key()
        other = c.start("POST", "/pay", key=other_key, body=b'{"amount": 1}')
        (st,) = c.wait_streams([other])
        self.assertEqual(st.status, 200, st.body)
        # The stalled one ends after body_timeout as an HTTP/1.1 request
        # whose body stalls: 408 request-timeout (or, at the least, reset).
        (st,) = c.wait_streams([stalled])
        self.assertGreaterEqual(time.monotonic() - t0, 0.9, "ended before body_timeout")
        if st.status is not None:
            self.assertEqual(st.status, 408, st.body)
            self.assertIn(b"request-timeout", st.body)
        else:
            self.assertIsNotNone(st.reset)
        self.assertEqual(upstream_requests(self.up, key), [])
        # Its key was never claimed: the same key runs now, on the same
        # connection.
        again = c.start("POST", "/pay", key=key, body=b'{"amount": 2}')
        (st,) = c.wait_streams([again])
        self.assertEqual(st.status, 200, st.body)
        self.assertEqual(self.up.count(key=key), 1)
        self.assertEqual(self.up.count(key=other_key), 1)
        h.wait_until(lambda: h.metric_sum(self.d.metrics(), "idem_requests_total",
                                          outcome="request_timeout") >= 1,
                     GENEROUS, what="the 408 counted")

    def test_a_header_block_that_never_ends_closes_the_connection(self):
        c = self.client(validate=False)
        c.pump(lambda: c.remote_settings, what="SETTINGS")
        import hpack
        t0 = time.monotonic()
        f = HeadersFrame(1, data=hpack.Encoder().encode(c.headers("GET", "/never")))
        c.send_raw(f.serialize())  # no END_HEADERS, and no CONTINUATION after it
        c.pump_until_closed()
        self.assertGreaterEqual(time.monotonic() - t0, 0.9, "closed before header_timeout")
        self.assertIsNotNone(c.goaway, "no GOAWAY before the close")
        self.assertEqual(len(self.up.requests()), 0)
        other = self.client()
        sid = other.start("GET", "/other")
        (st,) = other.wait_streams([sid])
        self.assertEqual(st.status, 200)


class TestUnreadAnswers(Base):
    CAP = 1 << 20
    ANSWER = 3 << 20
    STREAMS = 4
    PIECE = 64 * 1024
    # A request hands its client the piece of the answer it captured
    # (max_response_bytes) at once, and each stream with nothing queued may
    # always take one piece: the bound is the cap plus that per stream.
    config = {"http2": True, "max_queued_bytes": "1MiB", "body_timeout": "2s",
              "idle_timeout": "60s", "defaults": {"max_response_bytes": "64KiB"}}

    def test_a_client_that_never_opens_its_window_is_bounded_and_closed(self):
        self.up.set_reply(body=b"r" * self.ANSWER,
                          headers=[("Content-Type", "application/octet-stream")])
        c = self.client()
        c.ack = False  # the first 64 KiB window, then nothing
        sids = [c.start("POST", "/big%d" % i, key=h.new_key(), body=b"{}")
                for i in range(self.STREAMS)]
        most = [0.0]

        def queued():
            v = h.metric_sum(self.d.metrics(), "idem_queued_answer_bytes")
            most[0] = max(most[0], v)
            return v
        h.wait_until(lambda: queued() >= self.CAP, GENEROUS, 0.02,
                     "idem_queued_answer_bytes to reach max_queued_bytes")
        # Another client is answered meanwhile.
        other = self.client()
        sid = other.start("GET", "/other")
        (st,) = other.wait_streams([sid])
        self.assertEqual(st.status, 200)
        self.assertEqual(len(st.body), self.ANSWER)
        # The stalled connection is closed after body_timeout without
        # progress; until then what it holds stays under the cap plus one
        # piece of the upstream's answer per stream.
        done = [False]

        def reader():
            try:
                c.pump_until_closed(60.0)
            finally:
                done[0] = True
        t = threading.Thread(target=reader)
        t.start()
        while not done[0]:
            queued()
            time.sleep(0.02)
        t.join()
        self.assertTrue(c.closed)
        self.assertFalse(all(c.streams[s].ended for s in sids), "every answer was taken")
        bound = self.CAP + self.STREAMS * 4 * self.PIECE
        self.assertLessEqual(most[0], bound,
                             "idem_queued_answer_bytes reached %d (bound %d)" % (most[0], bound))
        h.wait_until(lambda: queued() == 0, GENEROUS, 0.05, "the queue to be given back")


def read_frames(sock, until, timeout=GENEROUS):
    """Frames as (type, flags, stream id, payload) read from sock until
    until(frames) holds or the connection closes (h2's own state machine
    takes nothing after a GOAWAY, so these tests read frames themselves)."""
    frames, buf = [], b""
    deadline = time.monotonic() + timeout
    while not until(frames):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("frames wanted did not come: %r" % [f[:3] for f in frames])
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            data = b""
        if not data:
            frames.append(("closed", 0, 0, b""))
            break
        buf += data
        while len(buf) >= 9:
            n = int.from_bytes(buf[0:3], "big")
            if len(buf) < 9 + n:
                break
            frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7fffffff,
                           buf[9:9 + n]))
            buf = buf[9 + n:]
    return frames


class TestShutdown(Base):
    def test_sigterm_sends_goaway_and_the_stream_in_flight_finishes(self):
        import hpack
        import signal
        ev = threading.Event()
        self.addCleanup(ev.set)
        self.up.behaviour = lambda seen: h.Reply(wait=ev)
        c = self.client()
        key = h.new_key()
        first = c.start("POST", "/pay", key=key, body=b'{"a": 1}')
        self.up.wait_seen(1, key=key)
        self.d.send_signal(signal.SIGTERM)
        frames = read_frames(c.sock, lambda fs: any(f[0] in (7, "closed") for f in fs))
        goaway = [f for f in frames if f[0] == 7]
        self.assertTrue(goaway, "no GOAWAY: %r" % [f[:3] for f in frames])
        payload = goaway[0][3]
        self.assertEqual(int.from_bytes(payload[0:4], "big") & 0x7fffffff, first)
        self.assertEqual(int.from_bytes(payload[4:8], "big"), 0)  # NO_ERROR
        # A stream opened after GOAWAY is never run.
        late_key = h.new_key()
        f = HeadersFrame(first + 2, data=hpack.Encoder().encode(
            c.headers("POST", "/pay", [("idempotency-key", late_key)])))
        f.flags.add("END_HEADERS")
        f.flags.add("END_STREAM")
        c.send_raw(f.serialize())
        ev.set()
        frames += read_frames(c.sock, lambda fs: any(f[0] == "closed" for f in fs))
        mine = [f for f in frames if f[2] == first]
        self.assertTrue(any(f[0] == 1 for f in mine), "no HEADERS for the stream in flight")
        self.assertTrue(any(f[0] in (0, 1) and f[1] & 1 for f in mine),
                        "the stream in flight did not end: %r" % [f[:3] for f in frames])
        self.assertFalse([f for f in frames if f[2] == first + 2 and f[0] == 1],
                         "the late stream was answered")
        self.assertEqual(self.d.wait_exit(GENEROUS), 0)
        self.assertEqual(self.up.count(key=late_key), 0)
        self.assertEqual(self.up.count(key=key), 1)


class TestTLS(h.IdemTestCase):
    def test_alpn_h2(self):
        certs = make_certs(os.path.join(self.tmp, "certs"))
        tls_port = h.free_port()
        up = self.start_upstream()
        self.start_idemd(up, {"http2": True, "listen_tls": {
            "address": "%s:%d" % (h.HOST, tls_port), "cert_file": certs["server"],
            "key_file": certs["server_key"]}})
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(certs["ca"])
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        c = H2Client(tls_port, ssl_ctx=ctx)
        self.addCleanup(c.close)
        self.assertEqual(c.alpn, "h2")
        key = h.new_key()
        sid = c.start("POST", "/pay", key=key, body=b'{"t": 1}')
        (st,) = c.wait_streams([sid])
        self.assertEqual(st.status, 200, st.body)
        sid = c.start("POST", "/pay", key=key, body=b'{"t": 1}')
        (st2,) = c.wait_streams([sid])
        self.assertEqual(st2.body, st.body)
        self.assertEqual(up.count(key=key), 1)


if __name__ == "__main__":
    unittest.main()
