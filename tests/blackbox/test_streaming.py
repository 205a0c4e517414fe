"""Streamed answers to a client that reads slowly, through the real idemd
(docs/protocol.md section 7, docs/configuration.md "Limits": answers
waiting for clients).

An answer larger than max_response_bytes is not kept: idemd captures the
first max_response_bytes of it, then relays the captured piece and the
rest as the upstream sends it, pausing the upstream while the client's
queue is full (max_queued_bytes) and resuming it when the client has read.
Each test here has an upstream answer 8 MiB (max_response_bytes 64 KiB),
and a client that

  1. reads the head and a first piece of the body,
  2. stops reading until idemd's queue of answer bytes has grown past
     max_queued_bytes (idem_queued_answer_bytes: the stream has paused its
     upstream on this client), so the pause really happened,
  3. reads the rest,

and must receive the whole body, byte for byte, with nothing cut:

  keyless GET   no route matches (passed through)   HTTP/1.1 and HTTP/2
  keyed POST    the default route, key stored       HTTP/1.1 and HTTP/2
                without its body (not retained)

Every wait is for an event (bytes read, the gauge, the end of the body)
with a generous deadline; nothing depends on how long anything takes.
"""

import random
import socket
import time
import unittest

try:
    from . import harness as h
    from .test_http2 import H2Client
except ImportError:
    import harness as h
    from test_http2 import H2Client

GENEROUS = 30.0
SIZE = 8 << 20
CAP = 512 << 10  # max_queued_bytes
FIRST = 4096     # what the client reads before it pauses
# Not periodic: a piece lost, doubled or moved is seen.
BODY = random.Random(20240611).randbytes(SIZE)
CONFIG = {
    "http2": True,
    "max_queued_bytes": "512KiB",
    "body_timeout": "60s",  # the client pauses on purpose; it is never cut for it
    "idle_timeout": "60s",
    "defaults": {"max_response_bytes": "64KiB"},
}


def queued(d):
    return h.metric_sum(d.metrics(), "idem_queued_answer_bytes")


def wait_queue_full(d, what):
    """Until idemd holds more than max_queued_bytes for the client that does
    not read: the stream is paused on it.  An answer that stalls before
    (its upstream never read on) never gets there."""
    last = [0.0]

    def full():
        last[0] = queued(d)
        return last[0] > CAP
    try:
        h.wait_until(full, GENEROUS, 0.05, what)
    except AssertionError as e:
        raise AssertionError("%s: the answer stalled with %d bytes queued to a client that "
                             "does not read (max_queued_bytes %d)" % (e, last[0], CAP)) from None


class SlowReader(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair(dict(CONFIG))
        self.up.set_reply(body=BODY)

    def assertWhole(self, body):
        self.assertEqual(len(body), SIZE, "the streamed answer is not whole")
        if body != BODY:
            at = next(i for i in range(SIZE) if body[i] != BODY[i])
            self.fail("the streamed answer differs from the upstream's at byte %d" % at)

    # ---- HTTP/1.1

    def h1(self, request):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        # A small receive buffer: the kernel holds little of what the client
        # does not read, so idemd's queue fills.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(GENEROUS)
        s.connect((h.HOST, self.d.port))
        s.sendall(request)
        got = b""
        while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < FIRST:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "closed before the first piece of the body: %r" % got[:300])
            got += chunk
        head, _, body = got.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200 "), head)
        wait_queue_full(self.d, "the answer to fill max_queued_bytes")
        parts = [body]
        have = len(body)
        deadline = time.monotonic() + GENEROUS
        while have < SIZE:
            self.assertLess(time.monotonic(), deadline, "the rest of the body within %.0fs "
                            "(%d of %d bytes)" % (GENEROUS, have, SIZE))
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        return head, b"".join(parts)

    def test_h1_keyless_get_over_max_response_bytes(self):
        head, body = self.h1(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"\r\ncontent-length: %d" % SIZE, head.lower())
        self.assertWhole(body)
        self.assertEqual(self.up.count(path="/big"), 1)

    def test_h1_keyed_post_over_max_response_bytes(self):
        key = h.new_key()
        head, body = self.h1(("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n"
                              "Content-Length: 2\r\n\r\n{}" % key).encode())
        self.assertWhole(body)
        self.assertEqual(self.up.count(key=key), 1)
        # Streamed, not retained: a repeat is 409 response-not-retained.
        r = self.d.post(key=key, body=b"{}")
        self.assertProblem(r, 409, "response-not-retained")

    # ---- HTTP/2

    def h2(self, method, path, key=None, body=None):
        c = H2Client(self.d.port)
        self.addCleanup(c.close)
        sid = c.start(method, path, key=key, body=body)
        st = c.streams[sid]
        c.pump(lambda: st.status is not None and len(st.body) > 0 or st.done, GENEROUS,
               "the head and a first piece of the body")
        self.assertEqual(st.status, 200, st.body[:300])
        # The client reads nothing now: its windows stay shut, idemd queues.
        wait_queue_full(self.d, "the answer to fill max_queued_bytes")
        c.pump(lambda: st.done, GENEROUS, "the rest of the body")
        self.assertIsNone(st.reset, "the stream was reset after %d bytes" % len(st.body))
        self.assertTrue(st.ended)
        return st

    def test_h2_keyless_get_over_max_response_bytes(self):
        st = self.h2("GET", "/big")
        self.assertWhole(st.body)
        self.assertEqual(self.up.count(path="/big"), 1)

    def test_h2_keyed_post_over_max_response_bytes(self):
        key = h.new_key()
        st = self.h2("POST", "/pay", key=key, body=b"{}")
        self.assertWhole(st.body)
        self.assertEqual(self.up.count(key=key), 1)
        r = self.d.post(key=key, body=b"{}")
        self.assertProblem(r, 409, "response-not-retained")


if __name__ == "__main__":
    unittest.main()
