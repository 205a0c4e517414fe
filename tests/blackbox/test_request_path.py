"""What the upstream gets (docs/protocol.md section 2): found by the fuzz
target of the request path (fuzz/fuzz_request_path.c).

  a scope source that is a field framing the client's connection
  (Transfer-Encoding, Upgrade, Connection, Keep-Alive, TE, Trailer)
                            still names the caller, but is never forwarded:
                            the upstream gets idemd's own framing only
                            (Content-Length), never the client's next to it
  a Proxy-* scope source    still forwarded, as any header the scope reads
  Idempotency-Token named in Connection
                            still forwarded, as Idempotency-Key is
  a request whose forwarded head would pass idemd's own limits (100
  fields, 16 KiB) with the fields idemd adds
                            431 headers-too-large before the store
"""

import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class FramingFieldsNameTheCaller(h.IdemTestCase):
    """An odd configuration the loader accepts: the caller named by fields
    that frame the client's message.  idemd reads them for the scope, and
    sends the upstream a message framed by its own Content-Length alone."""

    def test_transfer_encoding_the_scope_reads_is_not_forwarded(self):
        up, d = self.setup_pair({"scope": ["header:Transfer-Encoding"],
                                 "upstream_timeout": "5s"})
        k = h.new_key()
        raw = ("POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\n"
               "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" % k).encode()
        data, _ = h.raw_exchange(d.port, raw, timeout=15, shut_write=True)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 1, data[:300])
        self.assertEqual(resps[0].status, 200, resps[0])
        seen = up.requests(key=k)
        self.assertEqual(len(seen), 1)
        self.assertIsNone(seen[0].header("Transfer-Encoding"))
        self.assertEqual(seen[0].header("Content-Length"), "3")
        self.assertEqual(seen[0].body, b"abc")
        # The field still named the caller.
        self.assertEqual(d.get_key(k, scope=h.scope_of("chunked")).status, 200)

    def test_upgrade_the_scope_reads_is_not_forwarded(self):
        up, d = self.setup_pair({"scope": ["header:Upgrade", "header:X-User"]})
        k = h.new_key()
        r = d.post(key=k, headers=[("Upgrade", "websocket"), ("X-User", "alice")])
        self.assertEqual(r.status, 200, r)
        seen = up.requests(key=k)[0]
        self.assertIsNone(seen.header("Upgrade"))
        self.assertEqual(seen.header("X-User"), "alice")

    def test_proxy_field_the_scope_reads_is_still_forwarded(self):
        up, d = self.setup_pair({"scope_header": "Proxy-User"})
        k = h.new_key()
        r = d.post(key=k, headers=[("Connection", "Proxy-User"), ("Proxy-User", "alice")])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.requests(key=k)[0].header("Proxy-User"), "alice")
        self.assertEqual(d.get_key(k, scope=h.scope_of("alice")).status, 200)


class TokenNamedInConnection(h.IdemTestCase):
    def test_token_named_in_connection_is_forwarded(self):
        up, d = self.setup_pair({"routes": [
            {"methods": ["POST"], "path": "/orders", "mode": "token"}]})
        r = d.request("POST", "/_idem/tokens")
        self.assertEqual(r.status, 201, r)
        token = r.json()["token"]
        r = d.request("POST", "/orders", body=b"{}",
                      headers=[("Connection", "Idempotency-Token"),
                               ("Idempotency-Token", token)])
        self.assertEqual(r.status, 200, r)
        seen = up.requests(path="/orders")
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0].header("Idempotency-Token"), token)


def many_fields(key, n):
    """A keyed POST of exactly n header fields (Host, the key, and fillers)."""
    lines = ["POST /pay HTTP/1.1", "Host: x", "Idempotency-Key: %s" % key]
    lines += ["X-F%d: %d" % (i, i) for i in range(n - 2)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class ForwardedWithinLimits(h.IdemTestCase):
    """idemd adds Idempotency-Fence (and may add Host and Content-Length):
    a request at the limit of 100 header fields would go upstream with
    101, which an idemd behind it, or an upstream with the same limit,
    refuses only after this idemd claimed the key and then keeps that
    refusal as the key's answer.  It is refused here, before the store."""

    def test_a_request_that_would_pass_100_fields_upstream_is_431_before_the_store(self):
        up, d = self.setup_pair()
        k = h.new_key()
        data, _ = h.raw_exchange(d.port, many_fields(k, 100), timeout=10, shut_write=True)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 1, data[:300])
        doc = self.assertProblem(resps[0], 431, "headers-too-large")
        self.assertIn("Idempotency-Fence", doc["detail"])
        self.assertEqual(up.count(), 0)
        self.assertEqual(d.get_key(k, scope="anonymous").status, 404)

    def test_a_request_within_the_limit_is_forwarded(self):
        # 98 fields go up as 99 (the test upstream, Python's, takes at most
        # 99; the exact bound of 100 is in tests/unit/test_request_plan.c).
        up, d = self.setup_pair()
        k = h.new_key()
        data, _ = h.raw_exchange(d.port, many_fields(k, 98), timeout=10, shut_write=True)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 1, data[:300])
        self.assertEqual(resps[0].status, 200, resps[0])
        seen = up.requests(key=k)
        self.assertEqual(len(seen), 1)
        self.assertEqual(len(seen[0].headers), 99)


if __name__ == "__main__":
    unittest.main()
