"""docs/protocol.md section 4 (the fingerprint) and the key-reused row of section 6.

A keyed request is fingerprinted over method, path with query string, the
headers listed in fingerprint_headers (default none) and the body (raw, or
canonical JSON with fingerprint_body: json, minus fingerprint_ignore
pointers).  A repeat with the same fingerprint is replayed; another
fingerprint under the same key is 422 key-reused and never forwarded.
"""

import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class Fingerprint(h.IdemTestCase):
    config = None

    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair(self.config)

    def first(self, key, method="POST", path="/pay", body=b'{"amount": 100}', headers=None):
        r = self.d.request(method, path, body=body, key=key, headers=headers)
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        return r

    def same(self, key, first, method="POST", path="/pay", body=b'{"amount": 100}',
             headers=None):
        """The repeat is taken as the same request: replayed, not forwarded."""
        n = self.up.count()
        r = self.d.request(method, path, body=body, key=key, headers=headers)
        self.assertReplayOf(r, first)
        self.assertEqual(self.up.count(), n, "a repeat was forwarded")
        return r

    def reused(self, key, method="POST", path="/pay", body=b'{"amount": 100}', headers=None):
        """The repeat is another request under a used key: 422, not forwarded."""
        n = self.up.count()
        r = self.d.request(method, path, body=body, key=key, headers=headers)
        self.assertProblem(r, 422, "key-reused")
        self.assertEqual(self.up.count(), n, "a request with a reused key was forwarded")
        return r


class RawFingerprint(Fingerprint):
    def test_identical_request_is_replayed(self):
        k = h.new_key()
        f = self.first(k)
        self.same(k, f)

    def test_other_body_is_key_reused(self):
        k = h.new_key()
        self.first(k)
        self.reused(k, body=b'{"amount": 101}')

    def test_empty_body_versus_body_is_key_reused(self):
        k = h.new_key()
        self.first(k, body=b"")
        self.reused(k, body=b"x")

    def test_other_path_is_key_reused(self):
        k = h.new_key()
        self.first(k, path="/pay")
        self.reused(k, path="/refund")

    def test_other_query_string_is_key_reused(self):
        k = h.new_key()
        self.first(k, path="/pay?currency=eur")
        self.reused(k, path="/pay?currency=usd")

    def test_added_query_string_is_key_reused(self):
        k = h.new_key()
        self.first(k, path="/pay")
        self.reused(k, path="/pay?x=1")

    def test_same_query_string_is_replayed(self):
        k = h.new_key()
        f = self.first(k, path="/pay?currency=eur&x=1")
        self.same(k, f, path="/pay?currency=eur&x=1")

    def test_other_method_is_key_reused(self):
        k = h.new_key()
        self.first(k, method="POST")
        self.reused(k, method="PATCH")

    def test_reordered_json_is_another_body_in_raw_mode(self):
        k = h.new_key()
        self.first(k, body=b'{"a": 1, "b": 2}')
        self.reused(k, body=b'{"b": 2, "a": 1}')

    def test_headers_are_not_fingerprinted_by_default(self):
        k = h.new_key()
        f = self.first(k, headers={"X-Client-Time": "1", "User-Agent": "a"})
        self.same(k, f, headers={"X-Client-Time": "2", "User-Agent": "b"})

    def test_binary_body_is_fingerprinted_byte_for_byte(self):
        k = h.new_key()
        body = bytes(range(256)) * 4
        f = self.first(k, body=body)
        self.same(k, f, body=body)
        self.reused(k, body=body[:-1] + b"\x00")

    def test_chunked_and_content_length_bodies_with_the_same_bytes_match(self):
        k = h.new_key()
        f = self.first(k, body=b"hello world")
        raw = (b"POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + k.encode() +
               b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        data, _ = h.raw_exchange(self.d.port, raw)
        resps = h.parse_responses(data)
        self.assertEqual(len(resps), 1, data)
        self.assertReplayOf(resps[0], f)
        self.assertEqual(self.up.count(), 1)

    def test_mismatch_is_checked_while_the_first_is_in_flight(self):
        # "any record with another fingerprint": 422 even while in_progress
        gate = h.threading.Event()
        self.addCleanup(gate.set)
        self.up.set_reply(wait=gate)
        k = h.new_key()
        bg = h.Background(lambda: self.d.post(key=k, body=b"one"))
        self.up.wait_seen(1)
        r = self.d.post(key=k, body=b"two")
        self.assertProblem(r, 422, "key-reused")
        gate.set()
        self.assertEqual(bg.result().status, 200)
        self.assertEqual(self.up.count(), 1)

    def test_a_reused_key_does_not_change_the_record(self):
        k = h.new_key()
        f = self.first(k)
        self.reused(k, body=b"other")
        self.same(k, f)

    def test_mismatch_is_counted(self):
        k = h.new_key()
        self.first(k)
        before = self.d.outcome("mismatch")
        self.reused(k, body=b"other")
        self.assertEqual(self.d.outcome_reaches("mismatch", before + 1), before + 1)

    def test_fingerprint_is_shown_as_hex_by_the_admin_api(self):
        k = h.new_key()
        self.first(k)
        rec = self.d.get_key(k).json()
        self.assertRegex(rec["fingerprint"], r"^[0-9a-f]{64}$")
        k2 = h.new_key()
        self.first(k2, body=b"another body")
        self.assertNotEqual(self.d.get_key(k2).json()["fingerprint"], rec["fingerprint"])
        k3 = h.new_key()
        self.first(k3)
        self.assertEqual(self.d.get_key(k3).json()["fingerprint"], rec["fingerprint"])


class HeaderFingerprint(Fingerprint):
    config = {"defaults": {"fingerprint_headers": ["X-Tenant", "content-type"]}}

    def test_listed_header_with_another_value_is_key_reused(self):
        k = h.new_key()
        self.first(k, headers={"X-Tenant": "a"})
        self.reused(k, headers={"X-Tenant": "b"})

    def test_listed_header_with_the_same_value_is_replayed(self):
        k = h.new_key()
        f = self.first(k, headers={"X-Tenant": "a", "Content-Type": "application/json"})
        self.same(k, f, headers={"x-tenant": "a", "content-type": "application/json"})

    def test_listed_header_added_is_key_reused(self):
        k = h.new_key()
        self.first(k)
        self.reused(k, headers={"X-Tenant": "a"})

    def test_second_listed_header_counts_too(self):
        k = h.new_key()
        self.first(k, headers={"Content-Type": "application/json"})
        self.reused(k, headers={"Content-Type": "text/plain"})

    def test_unlisted_header_is_ignored(self):
        k = h.new_key()
        f = self.first(k, headers={"X-Tenant": "a", "X-Other": "1"})
        self.same(k, f, headers={"X-Tenant": "a", "X-Other": "2"})


class JsonFingerprint(Fingerprint):
    config = {"defaults": {"fingerprint_body": "json",
                           "fingerprint_ignore": ["/client_time", "/meta/trace"]}}

    def test_reordered_keys_are_the_same_request(self):
        k = h.new_key()
        f = self.first(k, body=b'{"a": 1, "b": {"x": [1, 2], "y": "s"}}')
        self.same(k, f, body=b'{"b": {"y": "s", "x": [1, 2]}, "a": 1}')

    def test_white_space_is_insignificant(self):
        k = h.new_key()
        f = self.first(k, body=b'{"a":1,"b":[1,2,3]}')
        self.same(k, f, body=b'\n{ "a" : 1 ,\n\t"b" : [ 1 , 2 , 3 ] }  \n')

    def test_other_value_is_key_reused(self):
        k = h.new_key()
        self.first(k, body=b'{"a": 1, "b": 2}')
        self.reused(k, body=b'{"a": 1, "b": 3}')

    def test_array_order_matters(self):
        k = h.new_key()
        self.first(k, body=b'{"a": [1, 2]}')
        self.reused(k, body=b'{"a": [2, 1]}')

    def test_string_and_number_differ(self):
        k = h.new_key()
        self.first(k, body=b'{"a": 1}')
        self.reused(k, body=b'{"a": "1"}')

    def test_ignored_top_level_field_may_differ(self):
        k = h.new_key()
        f = self.first(k, body=b'{"amount": 5, "client_time": "10:00"}')
        self.same(k, f, body=b'{"client_time": "10:01", "amount": 5}')

    def test_ignored_field_may_be_absent(self):
        k = h.new_key()
        f = self.first(k, body=b'{"amount": 5, "client_time": "10:00"}')
        self.same(k, f, body=b'{"amount": 5}')

    def test_ignored_nested_field_may_differ(self):
        k = h.new_key()
        f = self.first(k, body=b'{"amount": 5, "meta": {"trace": "abc", "user": 7}}')
        self.same(k, f, body=b'{"meta": {"user": 7, "trace": "xyz"}, "amount": 5}')

    def test_sibling_of_ignored_nested_field_still_counts(self):
        k = h.new_key()
        self.first(k, body=b'{"amount": 5, "meta": {"trace": "abc", "user": 7}}')
        self.reused(k, body=b'{"amount": 5, "meta": {"trace": "abc", "user": 8}}')

    def test_invalid_json_is_hashed_raw(self):
        k = h.new_key()
        f = self.first(k, body=b'{not json')
        self.same(k, f, body=b'{not json')
        self.reused(k, body=b'{not  json')

    def test_path_still_counts_in_json_mode(self):
        k = h.new_key()
        self.first(k, path="/a", body=b'{"a": 1}')
        self.reused(k, path="/b", body=b'{"a": 1}')

    def test_body_is_forwarded_unchanged(self):
        k = h.new_key()
        body = b'{ "b": 2,  "a": 1, "client_time": "x" }'
        self.first(k, body=body)
        self.assertEqual(self.up.requests()[0].body, body)


class JsonNumbersAndSpellings(Fingerprint):
    """docs/protocol.md section 4: numbers are compared exactly as decimals,
    never through a binary float, and one value has one canonical form
    however it is spelled."""
    config = {"defaults": {"fingerprint_body": "json"}}

    def test_money_amounts_that_differ_beyond_a_double_are_key_reused(self):
        # Both are the double 9007199254740992: through a float they merged,
        # and the second payment was answered with the first one's replay.
        k = h.new_key()
        self.first(k, body=b'{"amount": 9007199254740993.0, "currency": "EUR"}')
        self.reused(k, body=b'{"amount": 9007199254740992.0, "currency": "EUR"}')

    def test_amounts_that_differ_in_the_last_of_many_digits_are_key_reused(self):
        k = h.new_key()
        self.first(k, body=b'{"amount": 0.10000000000000000000000000000001}')
        self.reused(k, body=b'{"amount": 0.10000000000000000000000000000002}')

    def test_one_number_however_spelled_is_the_same_request(self):
        k = h.new_key()
        f = self.first(k, body=b'{"amount": 1}')
        for spelling in (b"1.0", b"1e0", b"10e-1", b"0.1E+1", b"1.000"):
            self.same(k, f, body=b'{"amount": ' + spelling + b'}')

    def test_large_integers_are_exact(self):
        k = h.new_key()
        f = self.first(k, body=b'{"id": 123456789012345678901234567890}')
        self.same(k, f, body=b'{"id": 1.2345678901234567890123456789e29}')
        self.reused(k, body=b'{"id": 123456789012345678901234567891}')

    def test_escaped_and_plain_strings_are_the_same_request(self):
        k = h.new_key()
        f = self.first(k, body='{"name": "Zo\u00eb/A"}'.encode())
        self.same(k, f, body='{"name": "Zoë\\/\u0041"}'.encode())

    def test_duplicate_keys_are_hashed_raw(self):
        # JSON.parse reads {"a":1,"a":2} as {"a":2}, other parsers as
        # {"a":1}: no canonical form can be fair to both, so the bytes count.
        k = h.new_key()
        f = self.first(k, body=b'{"a": 1, "a": 2}')
        self.same(k, f, body=b'{"a": 1, "a": 2}')
        self.reused(k, body=b'{"a": 2, "a": 1}')
        self.reused(k, body=b'{"a": 2}')


def vm_hwm_kib(pid):
    """The peak resident set of a process (VmHWM), in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/%d/status" % pid)


def sanitized(pid):
    """Whether the process runs under AddressSanitizer, whose shadow memory
    and quarantine of freed blocks make its resident set several times
    larger."""
    with open("/proc/%d/maps" % pid) as f:
        return "libasan" in f.read()


class JsonMemory(Fingerprint):
    """docs/protocol.md section 4: the JSON path costs memory in proportion to
    the body, with a small constant.  A 10 MiB body of empty objects took
    idemd's peak resident set to about 800 MiB (a tree of some 80 bytes a
    value) and it stayed there; now the canonical form is computed from the
    body itself with a bitmap of one bit an object (640 KiB here)."""
    config = {"defaults": {"fingerprint_body": "json"}}

    # idemd's peak resident set after two such requests, allowed in MiB: the
    # body is buffered (10 MiB) and forwarded, and the canonicaliser adds
    # little; the old binary reached 800.  Under AddressSanitizer every
    # allocation is shadowed and freed ones are quarantined, so the bound is
    # looser there, and still far below what a tree of values took.
    BOUND_MIB = 120
    BOUND_SANITIZED_MIB = 250

    def test_a_10_mib_body_of_empty_objects_fits_in_a_small_bound(self):
        n = (10 * 1024 * 1024 - 5) // 3  # room for one byte of white space
        body = b"[" + b"{}," * n + b"{}]"
        self.assertLessEqual(len(body), 10 * 1024 * 1024)  # max_request_bytes
        pid = self.d.proc.pid
        k = h.new_key()
        f = self.d.request("POST", "/pay", body=body, key=k, timeout=120)
        self.assertEqual(f.status, 200, f)
        self.assertNotReplay(f)
        self.assertEqual(self.up.count(), 1)
        self.assertEqual(len(self.up.requests()[0].body), len(body))
        # Re-spaced, it is the same request (so the JSON path was taken: a
        # raw hash would differ); one object fewer is another.
        r = self.d.request("POST", "/pay", body=body[:-1] + b" ]", key=k, timeout=120)
        self.assertReplayOf(r, f)
        r = self.d.request("POST", "/pay", body=b"[" + b"{}," * (n - 1) + b"{}]", key=k,
                           timeout=120)
        self.assertProblem(r, 422, "key-reused")
        self.assertEqual(self.up.count(), 1)
        bound = self.BOUND_SANITIZED_MIB if sanitized(pid) else self.BOUND_MIB
        hwm = vm_hwm_kib(pid)
        self.assertLess(hwm, bound * 1024,
                        "idemd's peak resident set is %d MiB after a 10 MiB JSON body"
                        % (hwm // 1024))


class PerRouteFingerprint(Fingerprint):
    config = {"routes": [
        {"methods": ["POST"], "path": "/json", "mode": "required", "fingerprint_body": "json"},
        {"methods": ["POST"], "path": "/", "mode": "required"},
    ]}

    def test_route_setting_applies_to_its_route(self):
        k = h.new_key()
        f = self.first(k, path="/json", body=b'{"a": 1, "b": 2}')
        self.same(k, f, path="/json", body=b'{"b": 2, "a": 1}')

    def test_other_route_keeps_the_default(self):
        k = h.new_key()
        self.first(k, path="/raw", body=b'{"a": 1, "b": 2}')
        self.reused(k, path="/raw", body=b'{"b": 2, "a": 1}')


if __name__ == "__main__":
    unittest.main()
