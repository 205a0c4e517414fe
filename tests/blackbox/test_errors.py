"""docs/protocol.md sections 10 and 11: errors idemd makes, limits, malformed HTTP, smuggling.

Every error of idemd's own is application/problem+json with type, title,
status, detail.  Request head over 16 KiB -> 431 headers-too-large; body over
max_request_bytes -> 413 request-too-large; at most 100 headers.  Malformed
HTTP -> 400 bad-request, connection closed, nothing reaches the upstream;
in particular no framing trick ever smuggles a second request upstream.
"""

import json
import socket
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


def head(method="POST", path="/pay", headers=(), key=None, version="HTTP/1.1"):
    lines = ["%s %s %s" % (method, path, version), "Host: example"]
    if key is not None:
        lines.append("Idempotency-Key: %s" % key)
    lines.extend(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class ProblemFormat(h.IdemTestCase):
    def test_problem_document_fields(self):
        up, d = self.setup_pair()
        r = d.post()
        doc = self.assertProblem(r, 400, "missing-key")
        self.assertEqual(set(doc) & {"type", "title", "status", "detail"},
                         {"type", "title", "status", "detail"})
        self.assertEqual(r.header("Content-Length"), str(len(r.body)))

    def test_problem_bodies_are_valid_json_with_escaping(self):
        # a key with quotes and backslashes must not break the JSON detail
        up, d = self.setup_pair()
        r = d.post(key='"bad\\q"')
        self.assertEqual(r.status, 400)
        json.loads(r.body)


class HeadLimits(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair()

    def test_head_over_16kib_is_431(self):
        r = self.d.post(key=h.new_key(), headers={"X-Big": "b" * (17 * 1024)})
        self.assertProblem(r, 431, "headers-too-large")
        self.assertEqual(self.up.count(), 0)

    def test_head_over_16kib_on_an_off_route_is_431(self):
        r = self.d.request("GET", "/x", headers={"X-Big": "b" * (17 * 1024)})
        self.assertProblem(r, 431, "headers-too-large")
        self.assertEqual(self.up.count(), 0)

    def test_many_header_lines_over_16kib_is_431(self):
        hdrs = [("X-H%d" % i, "v" * 200) for i in range(90)]
        r = self.d.request("GET", "/x", headers=hdrs)
        self.assertProblem(r, 431, "headers-too-large")
        self.assertEqual(self.up.count(), 0)

    def test_long_request_target_over_16kib_is_rejected(self):
        r = self.d.request("GET", "/" + "p" * (17 * 1024))
        self.assertIn(r.status, (414, 431), r)
        self.assertEqual(self.up.count(), 0)

    def test_head_of_15kib_is_accepted(self):
        r = self.d.post(key=h.new_key(), headers={"X-Big": "b" * (15 * 1024)})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.up.requests()[0].header("X-Big"), "b" * (15 * 1024))

    def test_95_headers_are_accepted(self):
        hdrs = [("X-H%d" % i, "v") for i in range(93)]  # + Host + Content-Length
        r = self.d.request("GET", "/x", headers=hdrs)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.up.requests()[0].header("X-H92"), "v")

    def test_more_than_100_headers_are_rejected(self):
        hdrs = [("X-H%d" % i, "v") for i in range(120)]
        r = self.d.request("GET", "/x", headers=hdrs)
        self.assertIn(r.status, (400, 431), r)
        doc = r.json()
        self.assertIn(doc["type"], (h.PROBLEM_PREFIX + "headers-too-large",
                                    h.PROBLEM_PREFIX + "bad-request"))
        self.assertEqual(self.up.count(), 0)

    def test_slowly_sent_oversized_head_is_cut_off(self):
        # the limit holds for a head that arrives in small pieces: idemd
        # answers 431 (or drops the connection) long before 40 KiB arrive
        import select
        s = socket.create_connection((h.HOST, self.d.port), timeout=10)
        self.addCleanup(s.close)
        s.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n")
        sent_all = True
        for _ in range(40):
            if select.select([s], [], [], 0.02)[0]:
                sent_all = False
                break
            try:
                s.sendall(b"X-Fill: " + b"f" * 1000 + b"\r\n")
            except OSError:
                sent_all = False
                break
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        resps = h.parse_responses(got)
        if resps:
            self.assertEqual(resps[0].status, 431)
        else:
            self.assertFalse(sent_all, "a 40 KiB head was taken without an answer")
        self.assertEqual(self.up.count(), 0)


class BodyLimits(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"max_request_bytes": "1KiB"})

    def test_body_over_max_request_bytes_is_413(self):
        r = self.d.post(key=h.new_key(), body=b"x" * 1025)
        self.assertProblem(r, 413, "request-too-large")
        self.assertEqual(self.up.count(), 0)

    def test_body_of_exactly_max_request_bytes_is_accepted(self):
        r = self.d.post(key=h.new_key(), body=b"x" * 1024)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.up.requests()[0].body, b"x" * 1024)

    def test_limit_applies_to_off_routes(self):
        r = self.d.request("PUT", "/x", body=b"x" * 2048)
        self.assertProblem(r, 413, "request-too-large")
        self.assertEqual(self.up.count(), 0)

    def test_chunked_body_over_the_limit_is_413(self):
        k = h.new_key()
        body = b"".join(b"100\r\n" + b"c" * 256 + b"\r\n" for _ in range(5)) + b"0\r\n\r\n"
        raw = head(headers=["Transfer-Encoding: chunked"], key=k) + body
        data, _ = h.raw_exchange(self.d.port, raw)
        resps = h.parse_responses(data)
        self.assertTrue(resps, data)
        self.assertProblem(resps[0], 413, "request-too-large")
        self.assertEqual(self.up.count(), 0)

    def test_413_does_not_claim_the_key(self):
        k = h.new_key()
        self.assertEqual(self.d.post(key=k, body=b"x" * 2000).status, 413)
        self.assertEqual(self.d.get_key(k).status, 404)
        r = self.d.post(key=k, body=b"small")
        self.assertEqual(r.status, 200, r)


class DefaultBodyLimit(h.IdemTestCase):
    def test_declared_length_over_10mib_is_413_without_sending_it(self):
        up, d = self.setup_pair()
        s = socket.create_connection((h.HOST, d.port), timeout=10)
        self.addCleanup(s.close)
        # only the head: idemd must refuse on the declared length alone
        s.sendall(head(key=h.new_key(), headers=["Content-Length: %d" % (10 * 1024 * 1024 + 1)]))
        got = b""
        try:
            while b"\r\n\r\n" not in got:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        self.assertTrue(got.startswith(b"HTTP/1.1 413"), got[:200])
        self.assertEqual(up.count(), 0)

    def test_10mib_body_is_accepted(self):
        up, d = self.setup_pair()
        r = d.request("PUT", "/x", body=b"y" * (10 * 1024 * 1024))
        self.assertEqual(r.status, 200, r)
        self.assertEqual(len(up.requests()[0].body), 10 * 1024 * 1024)


class Malformed(h.IdemTestCase):
    """Each malformed request: 400 bad-request, connection closed, nothing
    forwarded.  The bytes after the bad request (a valid request) must not be
    answered or forwarded either."""

    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair()

    def bad(self, raw, follow=True, also=()):
        """also: other statuses RFC 9112 allows for this request (e.g. 501)."""
        if follow:
            raw += head("GET", "/after")
        # raw_exchange returns at the close; the deadline only bounds a
        # connection left open, so it is generous for a loaded sanitizer run.
        data, closed = h.raw_exchange(self.d.port, raw, timeout=20)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 1, "answers to %r: %r" % (raw[:80], data[:500]))
        if resps[0].status in also:
            doc = resps[0].json()
            self.assertProblem(resps[0], resps[0].status, doc["type"][len(h.PROBLEM_PREFIX):])
        else:
            self.assertProblem(resps[0], 400, "bad-request")
        self.assertTrue(closed, "connection left open after a malformed request")
        time.sleep(0.1)
        self.assertEqual(self.up.count(), 0, "forwarded: %r" % self.up.requests())

    def test_garbage_request_line(self):
        self.bad(b"HELLO THERE\r\n\r\n")

    def test_missing_http_version(self):
        self.bad(b"GET /\r\nHost: a\r\n\r\n")

    def test_malformed_http_version(self):
        self.bad(b"GET / HTTP/1.x\r\nHost: a\r\n\r\n")

    def test_header_line_without_colon(self):
        self.bad(head("GET", "/x", headers=["NoColonHere"]))

    def test_space_before_colon(self):
        self.bad(head("GET", "/x", headers=["X-A : 1"]))

    def test_nul_in_request_target(self):
        self.bad(b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n")

    def test_non_numeric_content_length(self):
        self.bad(head(headers=["Content-Length: abc"], key=h.new_key()) + b"abc")

    def test_signed_content_length(self):
        self.bad(head(headers=["Content-Length: +3"], key=h.new_key()) + b"abc")

    def test_negative_content_length(self):
        self.bad(head(headers=["Content-Length: -1"], key=h.new_key()))

    def test_huge_content_length_is_not_an_overflow(self):
        raw = head(headers=["Content-Length: 18446744073709551617"], key=h.new_key())
        data, closed = h.raw_exchange(self.d.port, raw, timeout=5)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 1, data)
        self.assertIn(resps[0].status, (400, 413))
        self.assertEqual(self.up.count(), 0)

    def test_two_different_content_lengths(self):
        self.bad(head(headers=["Content-Length: 3", "Content-Length: 5"], key=h.new_key())
                 + b"abcde", follow=False)

    def test_bad_chunk_size(self):
        self.bad(head(headers=["Transfer-Encoding: chunked"], key=h.new_key())
                 + b"zz\r\nabc\r\n0\r\n\r\n", follow=False)

    def test_chunk_without_crlf(self):
        self.bad(head(headers=["Transfer-Encoding: chunked"], key=h.new_key())
                 + b"3\r\nabcXX0\r\n\r\n", follow=False)

    def test_unknown_transfer_encoding(self):
        self.bad(head(headers=["Transfer-Encoding: gzip"], key=h.new_key()) + b"x",
                 follow=False, also=(501,))

    def test_missing_host_in_http11(self):
        self.bad(b"GET /x HTTP/1.1\r\nX-A: 1\r\n\r\n")

    def test_bad_request_is_closed_even_after_good_ones(self):
        s = socket.create_connection((h.HOST, self.d.port), timeout=5)
        self.addCleanup(s.close)
        s.sendall(head("GET", "/good"))
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        s.sendall(b"BROKEN\r\n\r\n")
        s.settimeout(5)
        rest = b""
        while True:
            try:
                c = s.recv(65536)
            except OSError:
                break
            if not c:
                break
            rest += c
        resps = h.parse_responses(got + rest)
        self.assertEqual([r.status for r in resps], [200, 400])
        self.assertEqual(self.up.count(), 1)


class Smuggling(h.IdemTestCase):
    """Framing tricks: whatever idemd answers, the upstream never sees a
    request it was not meant to see (here: anything for /smuggled)."""

    SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"

    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair()

    def never_smuggled(self, raw):
        data, _ = h.raw_exchange(self.d.port, raw, timeout=3)
        time.sleep(0.2)
        paths = [s.path for s in self.up.requests()]
        self.assertNotIn("/smuggled", paths, "smuggled through: %r" % self.up.requests())
        return h.parse_responses(data)

    def test_content_length_and_transfer_encoding(self):
        body = b"0\r\n\r\n" + self.SMUGGLED
        raw = head("GET", "/x", headers=["Content-Length: %d" % len(body),
                                         "Transfer-Encoding: chunked"]) + body
        resps = self.never_smuggled(raw)
        # RFC 9112 6.1: refuse it, or answer the chunked request and close
        self.assertEqual(len(resps), 1, "the smuggled request was answered: %r" % resps)

    def test_transfer_encoding_and_content_length_on_keyed_route(self):
        body = b"0\r\n\r\n" + self.SMUGGLED
        raw = head("POST", "/pay", key=h.new_key(),
                   headers=["Transfer-Encoding: chunked",
                            "Content-Length: %d" % len(body)]) + body
        resps = self.never_smuggled(raw)
        self.assertEqual(len(resps), 1, "the smuggled request was answered: %r" % resps)

    def test_content_length_then_smaller_content_length(self):
        raw = head("GET", "/x", headers=["Content-Length: 0",
                                         "Content-Length: %d" % len(self.SMUGGLED)]) + \
            self.SMUGGLED
        resps = self.never_smuggled(raw)
        self.assertEqual(resps[0].status, 400)

    def test_obfuscated_transfer_encoding(self):
        for te in ("chunked, identity", "xchunked", "chunked\t ", " chunked",
                   "identity, chunked, identity"):
            body = b"0\r\n\r\n" + self.SMUGGLED
            raw = head("GET", "/x", headers=["Transfer-Encoding: %s" % te,
                                             "Content-Length: %d" % len(body)]) + body
            self.never_smuggled(raw)

    def test_transfer_encoding_twice(self):
        body = b"0\r\n\r\n" + self.SMUGGLED
        raw = head("GET", "/x", headers=["Transfer-Encoding: chunked",
                                         "Transfer-Encoding: identity"]) + body
        self.never_smuggled(raw)

    def test_chunked_body_containing_a_request_stays_a_body(self):
        inner = self.SMUGGLED
        raw = head("PUT", "/x", headers=["Transfer-Encoding: chunked", "Connection: close"]) + \
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(inner), inner)
        resps = self.never_smuggled(raw)
        self.assertEqual(resps[0].status, 200)
        self.assertEqual(self.up.requests()[0].body, inner)

    def test_content_length_body_containing_a_request_stays_a_body(self):
        raw = head("PUT", "/x", headers=["Content-Length: %d" % len(self.SMUGGLED),
                                         "Connection: close"]) + self.SMUGGLED
        resps = self.never_smuggled(raw)
        self.assertEqual(resps[0].status, 200)
        self.assertEqual(self.up.requests()[0].body, self.SMUGGLED)

    def test_pipelined_requests_are_answered_in_order(self):
        raw = head("GET", "/one") + head("GET", "/two") + \
            head("GET", "/three", headers=["Connection: close"])
        data, closed = h.raw_exchange(self.d.port, raw, timeout=5)
        resps = h.parse_responses(data)
        self.assertEqual([r.status for r in resps], [200, 200, 200])
        self.assertEqual([r.json()["path"] for r in resps], ["/one", "/two", "/three"])
        self.assertEqual([s.path for s in self.up.requests()], ["/one", "/two", "/three"])

    def test_pipelined_keyed_requests_are_answered_in_order(self):
        k1, k2 = h.new_key(), h.new_key()
        raw = (head("POST", "/a", key=k1, headers=["Content-Length: 1"]) + b"1" +
               head("POST", "/b", key=k2, headers=["Content-Length: 1"]) + b"2" +
               head("POST", "/a", key=k1, headers=["Content-Length: 1", "Connection: close"])
               + b"1")
        data, closed = h.raw_exchange(self.d.port, raw, timeout=5)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 3, data)
        self.assertEqual(resps[0].json()["path"], "/a")
        self.assertEqual(resps[1].json()["path"], "/b")
        self.assertReplayOf(resps[2], resps[0])
        self.assertEqual(self.up.count(), 2)


if __name__ == "__main__":
    unittest.main()
