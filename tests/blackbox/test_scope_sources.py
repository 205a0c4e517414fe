"""Who the caller is: `scope:` sources (docs/protocol.md section 3).

  scope: [cookie:NAME]      callers who log in with a session cookie each get
                            a scope of their own (the SHA-256 of the cookie's
                            value), instead of all sharing "anonymous" and
                            replaying each other's answers and Set-Cookie
  scope: [header:NAME]      the same values as scope_header: NAME
  several sources           the SHA-256 of their length-framed values
  a source absent           falls back to Authorization hashed in a space of
                            its own (SHA-256 of a tag and the value), else
                            "anonymous"; counted in idem_scope_fallback_total
  Authorization (or a header the scope reads) given twice: 400 ambiguous-scope
  Connection: Authorization Authorization still names the caller and is still
                            forwarded
  jwt:CLAIM                 refused at start without jwt_keys or jwt_secret_file
                            (the rest: test_scope_jwt.py)
  client_cert               refused at start without listen_tls.client_ca_file
  scope with scope_header   refused at start: two answers to one question
"""

import hashlib
import os
import struct
import subprocess
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

ALICE = "alice-s3ss10n"
BOB = "bob-s3ss10n"


def cookie(session, extra="theme=dark"):
    return {"Cookie": "%s; session=%s" % (extra, session)}


def framed_scope(*values):
    """The scope of several sources: SHA-256 over each value's length (4 bytes
    big-endian) and bytes, in the order the sources are listed."""
    data = b""
    for v in values:
        v = v.encode("latin-1")
        data += struct.pack(">I", len(v)) + v
    return hashlib.sha256(data).hexdigest()


def fallback_scope(authorization):
    """The scope of a fallback to Authorization: the SHA-256 of the tag and
    the value (SPEC section 14), never the value's own SHA-256."""
    return hashlib.sha256(b"idem-scope-fallback\0" + authorization.encode("latin-1")).hexdigest()


def echo_session(seen):
    """An upstream that logs the caller in: its Set-Cookie names the session
    it was sent, so a replay to the wrong caller shows at once."""
    c = seen.header("Cookie") or ""
    return h.Reply(headers=[("Set-Cookie", "csrf=for-" + c.replace(";", ","))])


class FallbackMetrics:
    def fallbacks(self, d, to):
        return h.metric_sum(d.metrics(), "idem_scope_fallback_total", to=to)


class CookieScope(h.IdemTestCase, FallbackMetrics):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"scope": ["cookie:session"]})
        self.up.behaviour = echo_session

    def test_callers_with_session_cookies_do_not_get_each_others_answers(self):
        k = h.new_key()
        a = self.d.post(key=k, headers=cookie(ALICE))
        b = self.d.post(key=k, headers=cookie(BOB))
        self.assertEqual(b.status, 200, b)
        self.assertNotReplay(b)
        self.assertNotEqual(a.body, b.body)
        self.assertIn(BOB, b.header("Set-Cookie"))
        self.assertNotIn(ALICE, b.header("Set-Cookie"))
        self.assertEqual(self.up.count(key=k), 2)

    def test_the_same_session_gets_the_replay_whatever_its_other_cookies(self):
        k = h.new_key()
        first = self.d.post(key=k, headers=cookie(ALICE))
        again = self.d.post(key=k, headers=cookie(ALICE, extra="theme=light; lang=fr"))
        self.assertEqual(again.header("X-Idempotent-Replay"), "true", again)
        self.assertEqual(again.body, first.body)
        # The upstream's Set-Cookie is the first answer's only (replay_drop_headers).
        self.assertIn(ALICE, first.header("Set-Cookie"))
        self.assertEqual(again.header_all("Set-Cookie"), [])
        self.assertEqual(self.up.count(key=k), 1)

    def test_scope_is_the_sha256_of_the_cookie_value(self):
        k = h.new_key()
        self.d.post(key=k, headers=cookie(ALICE))
        r = self.d.get_key(k, scope=h.scope_of(ALICE))
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["scope"], h.scope_of(ALICE))

    def test_the_cookie_is_found_in_any_cookie_header(self):
        k = h.new_key()
        hdrs = [("Cookie", "theme=dark"), ("Cookie", "lang=fr; session=first"),
                ("Cookie", "other=third")]
        self.d.post(key=k, headers=hdrs)
        self.assertEqual(self.d.get_key(k, scope=h.scope_of("first")).status, 200)

    def test_the_named_cookie_twice_across_cookie_headers_is_ambiguous(self):
        hdrs = [("Cookie", "session=first"), ("Cookie", "session=second")]
        self.assertProblem(self.d.post(key=h.new_key(), headers=hdrs), 400, "ambiguous-scope")
        self.assertEqual(self.up.count(), 0)

    def test_without_the_cookie_the_scope_falls_back_to_authorization(self):
        before = self.fallbacks(self.d, "authorization")
        k = h.new_key()
        self.d.post(key=k, headers={"Authorization": "Bearer api-client", "Cookie": "theme=dark"})
        self.assertEqual(self.d.get_key(k, scope=fallback_scope("Bearer api-client")).status, 200)
        self.assertEqual(self.d.get_key(k, scope=h.scope_of("Bearer api-client")).status, 404)
        self.assertEqual(self.fallbacks(self.d, "authorization"), before + 1)

    def test_without_cookie_or_authorization_the_caller_is_anonymous(self):
        before = self.fallbacks(self.d, "anonymous")
        k = h.new_key()
        self.d.post(key=k, headers={"Cookie": "session="})  # empty: absent
        self.assertEqual(self.d.get_key(k, scope="anonymous").status, 200)
        self.assertEqual(self.fallbacks(self.d, "anonymous"), before + 1)

    def test_tokens_are_bound_to_the_session(self):
        r = self.d.request("POST", "/_idem/tokens", headers=cookie(ALICE))
        self.assertEqual(r.status, 201, r)
        self.assertTrue(r.json()["token"])

    def test_cookie_named_in_connection_is_still_forwarded(self):
        k = h.new_key()
        self.d.post(key=k, headers=[("Connection", "Cookie"), ("Cookie", "session=" + ALICE)])
        self.assertEqual(self.up.requests(key=k)[0].header("Cookie"), "session=" + ALICE)
        self.assertEqual(self.d.get_key(k, scope=h.scope_of(ALICE)).status, 200)


class HeaderScope(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"scope": ["header:X-User"]})

    def test_header_source_gives_the_values_of_scope_header(self):
        k = h.new_key()
        first = self.d.post(key=k, headers={"X-User": "u-1", "Authorization": "a"})
        again = self.d.post(key=k, headers={"x-user": "u-1", "Authorization": "b"})
        self.assertReplayOf(again, first)
        self.assertEqual(self.d.get_key(k, scope=h.scope_of("u-1")).status, 200)

    def test_source_header_given_twice_is_400_and_not_forwarded(self):
        k = h.new_key()
        r = self.d.post(key=k, headers=[("X-User", "u-1"), ("X-User", "u-2")])
        self.assertProblem(r, 400, "ambiguous-scope")
        self.assertEqual(self.up.count(), 0)


class SeveralSources(h.IdemTestCase, FallbackMetrics):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair({"scope": ["header:X-Org", "cookie:session"]})

    def test_scope_is_the_sha256_of_the_length_framed_values(self):
        k = h.new_key()
        self.d.post(key=k, headers={"X-Org": "org-7", "Cookie": "session=" + ALICE})
        r = self.d.get_key(k, scope=framed_scope("org-7", ALICE))
        self.assertEqual(r.status, 200, r)

    def test_values_that_join_alike_are_different_callers(self):
        k = h.new_key()
        self.d.post(key=k, headers={"X-Org": "ab", "Cookie": "session=c"})
        r = self.d.post(key=k, headers={"X-Org": "a", "Cookie": "session=bc"})
        self.assertNotReplay(r)
        self.assertEqual(self.up.count(key=k), 2)

    def test_one_source_absent_falls_back(self):
        before = self.fallbacks(self.d, "authorization")
        k = h.new_key()
        self.d.post(key=k, headers={"X-Org": "org-7", "Authorization": "Bearer t"})
        self.assertEqual(self.d.get_key(k, scope=fallback_scope("Bearer t")).status, 200)
        self.assertEqual(self.fallbacks(self.d, "authorization"), before + 1)


class AmbiguousScope(h.IdemTestCase):
    """Authorization (or the scope header) given twice is 400 (section 3)."""

    def test_authorization_twice_is_400_and_not_forwarded(self):
        up, d = self.setup_pair()
        r = d.post(key=h.new_key(), headers=[("Authorization", "Bearer alice"),
                                             ("Authorization", "Bearer bob")])
        self.assertProblem(r, 400, "ambiguous-scope")
        self.assertEqual(up.count(), 0)

    def test_authorization_twice_on_a_token_issue_is_400(self):
        up, d = self.setup_pair()
        r = d.request("POST", "/_idem/tokens", headers=[("Authorization", "a"),
                                                        ("authorization", "a")])
        self.assertProblem(r, 400, "ambiguous-scope")

    def test_authorization_twice_is_400_even_when_a_cookie_names_the_caller(self):
        up, d = self.setup_pair({"scope": ["cookie:session"]})
        r = d.post(key=h.new_key(), headers=[("Cookie", "session=" + ALICE),
                                             ("Authorization", "a"), ("Authorization", "b")])
        self.assertProblem(r, 400, "ambiguous-scope")
        self.assertEqual(up.count(), 0)

    def test_scope_header_twice_is_400(self):
        up, d = self.setup_pair({"scope_header": "X-Api-Key"})
        r = d.post(key=h.new_key(), headers=[("X-Api-Key", "k1"), ("X-Api-Key", "k2")])
        self.assertProblem(r, 400, "ambiguous-scope")
        self.assertEqual(up.count(), 0)

    def test_ambiguous_requests_are_counted_as_bad_requests(self):
        up, d = self.setup_pair()
        before = d.outcome("bad_request")
        d.post(key=h.new_key(), headers=[("Authorization", "a"), ("Authorization", "b")])
        self.assertEqual(d.outcome_reaches("bad_request", before + 1), before + 1)


class ConnectionNamesTheScopeHeader(h.IdemTestCase):
    """A header that Connection names is still used for the scope and still
    forwarded (docs/protocol.md sections 2, 3), so idemd and the upstream
    see one caller."""

    def test_authorization_named_in_connection_is_forwarded_and_scopes(self):
        up, d = self.setup_pair()
        k = h.new_key()
        r = d.post(key=k, headers=[("Connection", "Authorization"),
                                   ("Authorization", "Bearer alice")])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.requests(key=k)[0].header("Authorization"), "Bearer alice")
        self.assertEqual(d.get_key(k, scope=h.scope_of("Bearer alice")).status, 200)

    def test_scope_header_named_in_connection_is_forwarded(self):
        up, d = self.setup_pair({"scope_header": "X-Api-Key"})
        k = h.new_key()
        d.post(key=k, headers=[("Connection", "x-api-key"), ("X-Api-Key", "k1")])
        self.assertEqual(up.requests(key=k)[0].header("X-Api-Key"), "k1")
        self.assertEqual(d.get_key(k, scope=h.scope_of("k1")).status, 200)

    def test_other_headers_named_in_connection_are_still_dropped(self):
        up, d = self.setup_pair()
        k = h.new_key()
        d.post(key=k, headers=[("Connection", "X-Hop, Authorization"), ("X-Hop", "1"),
                               ("Authorization", "Bearer alice")])
        seen = up.requests(key=k)[0]
        self.assertIsNone(seen.header("X-Hop"))
        self.assertEqual(seen.header("Authorization"), "Bearer alice")


class ScopeConfig(h.IdemTestCase):
    def run_t(self, text):
        path = os.path.join(self.tmp, "idem.yaml")
        with open(path, "w") as f:
            f.write(text)
        p = subprocess.run([h.IDEMD, "--config", path, "-t"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=10, cwd=self.tmp)
        return p.returncode, p.stderr.decode("utf-8", "replace")

    def assertRefused(self, text, *mentions):
        rc, err = self.run_t(text)
        self.assertEqual(rc, 2, err)
        lines = [x for x in err.splitlines() if x.strip()]
        self.assertEqual(len(lines), 1, err)
        for m in mentions:
            self.assertIn(m, lines[0])

    def test_sources_are_accepted(self):
        rc, err = self.run_t("scope: [authorization, header:X-User, cookie:session]\n"
                             "scope_rate_limit: 200/s\n")
        self.assertEqual(rc, 0, err)

    def test_jwt_without_keys_is_refused(self):
        self.assertRefused("scope: [jwt:sub]\n", "scope: jwt:sub", "jwt_keys")

    def test_client_cert_needs_listen_tls_client_ca_file(self):
        self.assertRefused("scope:\n  - cookie:sid\n  - client_cert\n",
                           "scope: client_cert needs listen_tls.client_ca_file")

    def test_scope_with_scope_header_is_refused(self):
        self.assertRefused("scope_header: X-Api-Key\nscope: [cookie:sid]\n", "idem.yaml:2",
                           "scope", "scope_header")

    def test_unknown_source_is_refused(self):
        self.assertRefused("scope: [session]\n", "idem.yaml:1", "scope[0]", "session")

    def test_bad_rate_is_refused(self):
        self.assertRefused("scope_rate_limit: 200 per second\n", "idem.yaml:1",
                           "scope_rate_limit", "not a rate")


if __name__ == "__main__":
    unittest.main()
