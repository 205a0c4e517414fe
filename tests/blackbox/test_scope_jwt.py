"""Verified callers and scope sources that cannot be confused (SPEC section 14,
docs/protocol.md section 3).

  scope: [jwt:sub]          the caller is the `sub` of the Bearer JWT, believed
                            only after its signature, exp and nbf pass against
                            jwt_keys (PEM or JWKS: RS256, ES256, EdDSA) or
                            jwt_secret_file (HS256): a token refreshed with the
                            same sub replays the first answer; a token signed
                            by another key, expired, alg none, an RSA public
                            key used as an HS256 secret, a kid that names no
                            key all fall back (counted by reason) and never
                            reach the first caller's keys
  keys                      read at start (exit 2, one line, when they do not
                            load) and on SIGHUP (a file that does not load
                            keeps the running keys, one log line)
  fallback space            Authorization: 42 without X-User-Id never reaches
                            the keys of X-User-Id: 42
  scope_missing: reject     400 missing-scope instead of a fallback
  cookies                   the named cookie twice (sid=; sid=abc) is 400
                            ambiguous-scope; "abc" is abc
  Authorization             the scheme's case and the white space after it do
                            not make another caller; Bearer K hashes as before

Tokens are made here with the `openssl` command (keys generated per test
class, nothing committed) and Python's hmac, so the tests need no module
beyond the standard library.
"""

import base64
import hashlib
import hmac
import json
import os
import subprocess
import tempfile
import time
import unittest
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

FALLBACK_TAG = b"idem-scope-fallback\0"


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def openssl(*args, data=None):
    p = subprocess.run(["openssl"] + list(args), input=data, capture_output=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError("openssl %s: %s" % (" ".join(args), p.stderr.decode()))
    return p.stdout


class Key:
    """A private key made by `openssl genpkey` in dirname, and its public PEM."""

    GENPKEY = {
        "RS256": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        "ES256": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        "EdDSA": ["-algorithm", "ED25519"],
    }

    def __init__(self, dirname, alg):
        self.alg = alg
        self.path = os.path.join(dirname, "key-%s-%s.pem" % (alg, uuid.uuid4().hex[:8]))
        openssl("genpkey", *self.GENPKEY[alg], "-out", self.path)
        self.public_pem = openssl("pkey", "-in", self.path, "-pubout")
        self.public_der = openssl("pkey", "-in", self.path, "-pubout", "-outform", "DER")

    def sign(self, msg):
        with tempfile.NamedTemporaryFile() as f:
            f.write(msg)
            f.flush()
            if self.alg == "EdDSA":
                return openssl("pkeyutl", "-sign", "-inkey", self.path, "-rawin", "-in", f.name)
            sig = openssl("dgst", "-sha256", "-sign", self.path, f.name)
        if self.alg == "ES256":
            return der_to_raw(sig)
        return sig

    def jwk(self, kid, alg=None):
        """The public key as a JWK, read from its SubjectPublicKeyInfo DER."""
        if self.alg == "RS256":
            text = openssl("pkey", "-pubin", "-noout", "-text", data=self.public_pem).decode()
            e = int(text.split("Exponent:", 1)[1].split()[0])
            n = int(openssl("rsa", "-pubin", "-noout", "-modulus",
                            data=self.public_pem).decode().strip().split("=", 1)[1], 16)
            k = {"kty": "RSA", "n": b64url(n.to_bytes((n.bit_length() + 7) // 8, "big")),
                 "e": b64url(e.to_bytes((e.bit_length() + 7) // 8, "big"))}
        elif self.alg == "ES256":
            point = self.public_der[-65:]  # 04 || x || y ends the P-256 SPKI
            assert point[0] == 4
            k = {"kty": "EC", "crv": "P-256", "x": b64url(point[1:33]), "y": b64url(point[33:])}
        else:
            k = {"kty": "OKP", "crv": "Ed25519", "x": b64url(self.public_der[-32:])}
        k["kid"] = kid
        if alg:
            k["alg"] = alg
        return k


def der_to_raw(der):
    """An ECDSA-Sig-Value (DER) as the r || s of JWS (RFC 7518 3.4)."""
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 3
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        ln = der[i + 1]
        v = der[i + 2:i + 2 + ln].lstrip(b"\0")
        out += v.rjust(32, b"\0")
        i += 2 + ln
    return out


def make_token(claims, key=None, alg=None, kid=None, secret=None, header=None):
    """A compact JWS of claims: signed by key (a Key) or with the HS256
    secret; header replaces the header when given (alg none and forgeries)."""
    if header is None:
        header = {"alg": alg or (key.alg if key else "HS256"), "typ": "JWT"}
        if kid is not None:
            header["kid"] = kid
    signing_input = (b64url(json.dumps(header).encode()) + "." +
                     b64url(json.dumps(claims).encode())).encode()
    if secret is not None:
        sig = hmac.new(secret, signing_input, hashlib.sha256).digest()
    elif key is not None:
        sig = key.sign(signing_input)
    else:
        sig = b""
    return signing_input.decode() + "." + b64url(sig)


def claims(sub="alice", ttl=600, **extra):
    now = int(time.time())
    c = {"sub": sub, "iat": now, "exp": now + ttl, "jti": uuid.uuid4().hex}
    c.update(extra)
    return c


def bearer(tok):
    return {"Authorization": "Bearer " + tok}


def fallback_scope(authorization):
    """The scope of a fallback: SHA-256 of the tag and Authorization."""
    return hashlib.sha256(FALLBACK_TAG + authorization.encode("latin-1")).hexdigest()


class KeysOnce:
    """Keys made once per class: RSA generation takes a moment."""

    @classmethod
    def setUpClass(cls):
        cls.keydir = tempfile.mkdtemp(prefix="idem-jwt-keys-")
        cls.rsa = Key(cls.keydir, "RS256")
        cls.rsa_other = Key(cls.keydir, "RS256")
        cls.ec = Key(cls.keydir, "ES256")
        cls.ec_other = Key(cls.keydir, "ES256")
        cls.ed = Key(cls.keydir, "EdDSA")

    @classmethod
    def tearDownClass(cls):
        import shutil
        shutil.rmtree(cls.keydir, True)

    def write(self, name, data):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def fallbacks(self, d, **labels):
        return h.metric_sum(d.metrics(), "idem_scope_fallback_total", **labels)


class JwtScopePem(KeysOnce, h.IdemTestCase):
    """scope: [jwt:sub] with one RS256 public key in a PEM file."""

    def setUp(self):
        super().setUp()
        self.keys = self.write("jwt.pem", self.rsa.public_pem)
        self.up, self.d = self.setup_pair({"scope": ["jwt:sub"], "jwt_keys": self.keys})
        self.key = h.new_key()
        self.first = self.d.post(key=self.key, headers=bearer(make_token(claims(), self.rsa)))
        self.assertEqual(self.first.status, 200, self.first)

    def assertOtherCaller(self, tok, reason):
        before = self.fallbacks(self.d, to="authorization", reason=reason)
        r = self.d.post(key=self.key, headers=bearer(tok))
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        self.assertEqual(self.up.count(key=self.key), 2)
        self.assertEqual(self.fallbacks(self.d, to="authorization", reason=reason), before + 1)
        # It landed in the fallback space of its own Authorization.
        self.assertEqual(self.d.get_key(self.key, scope=fallback_scope("Bearer " + tok)).status,
                         200)

    def test_a_refreshed_token_with_the_same_sub_replays_the_first_answer(self):
        again = self.d.post(key=self.key, headers=bearer(make_token(claims(), self.rsa)))
        self.assertReplayOf(again, self.first)
        self.assertEqual(self.up.count(key=self.key), 1)
        self.assertEqual(self.d.get_key(self.key, scope=h.scope_of("alice")).status, 200)

    def test_the_scheme_in_another_case_is_the_same_caller(self):
        tok = make_token(claims(), self.rsa)
        again = self.d.post(key=self.key, headers={"Authorization": "bearer  " + tok})
        self.assertReplayOf(again, self.first)

    def test_another_sub_is_another_caller(self):
        r = self.d.post(key=self.key, headers=bearer(make_token(claims("bob"), self.rsa)))
        self.assertNotReplay(r)
        self.assertEqual(self.up.count(key=self.key), 2)

    def test_a_token_signed_with_another_key_falls_back(self):
        self.assertOtherCaller(make_token(claims(), self.rsa_other), "signature")

    def test_an_expired_token_falls_back(self):
        self.assertOtherCaller(make_token(claims(ttl=-3600), self.rsa), "expired")

    def test_a_token_not_yet_valid_falls_back(self):
        c = claims(nbf=int(time.time()) + 3600)
        self.assertOtherCaller(make_token(c, self.rsa), "not_yet_valid")

    def test_alg_none_falls_back(self):
        tok = make_token(claims(), header={"alg": "none", "typ": "JWT"})
        self.assertOtherCaller(tok, "algorithm")

    def test_the_rsa_public_key_as_an_hs256_secret_falls_back(self):
        tok = make_token(claims(), secret=self.rsa.public_pem)
        self.assertOtherCaller(tok, "algorithm")
        # And the same with the PEM's DER, another spelling of the key.
        tok = make_token(claims(), secret=self.rsa.public_der)
        r = self.d.post(key=self.key, headers=bearer(tok))
        self.assertNotReplay(r)

    def test_a_token_over_8_kib_falls_back(self):
        self.assertOtherCaller(make_token(claims(pad="x" * 9000), self.rsa), "malformed")

    def test_a_token_with_bad_base64url_falls_back(self):
        tok = make_token(claims(), self.rsa)
        head, payload, sig = tok.split(".")
        self.assertOtherCaller("%s.%s=.%s" % (head, payload, sig), "malformed")

    def test_a_claim_of_another_type_falls_back(self):
        tok = make_token({"sub": ["alice"], "exp": int(time.time()) + 600}, self.rsa)
        self.assertOtherCaller(tok, "claim")

    def test_a_bearer_value_that_is_not_a_jws_falls_back(self):
        self.assertOtherCaller(make_token(claims(), self.rsa).replace(".", ""), "malformed")

    def test_without_authorization_the_caller_is_anonymous(self):
        before = self.fallbacks(self.d, to="anonymous", reason="absent")
        r = self.d.post(key=self.key)
        self.assertNotReplay(r)
        self.assertEqual(self.d.get_key(self.key, scope="anonymous").status, 200)
        self.assertEqual(self.fallbacks(self.d, to="anonymous", reason="absent"), before + 1)


class JwtScopeJwks(KeysOnce, h.IdemTestCase):
    """A JWKS of several keys with kids: RS256, ES256, EdDSA."""

    def setUp(self):
        super().setUp()
        jwks = {"keys": [self.rsa.jwk("r1", "RS256"), self.ec.jwk("e1"), self.ed.jwk("d1"),
                         {"kty": "oct", "kid": "s1", "k": b64url(b"not-a-signing-key")}]}
        self.keys = self.write("jwks.json", json.dumps(jwks).encode())
        self.up, self.d = self.setup_pair({"scope": ["jwt:sub"], "jwt_keys": self.keys})

    def test_every_key_names_the_same_caller(self):
        k = h.new_key()
        first = self.d.post(key=k, headers=bearer(make_token(claims(), self.rsa, kid="r1")))
        self.assertEqual(first.status, 200, first)
        for key, kid in ((self.ec, "e1"), (self.ed, "d1"), (self.ec, None)):
            with self.subTest(alg=key.alg, kid=kid):
                again = self.d.post(key=k, headers=bearer(make_token(claims(), key, kid=kid)))
                self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(key=k), 1)

    def test_kids_and_keys_that_do_not_match_fall_back(self):
        k = h.new_key()
        first = self.d.post(key=k, headers=bearer(make_token(claims(), self.ec, kid="e1")))
        self.assertEqual(first.status, 200, first)
        cases = [
            ("unknown_kid", make_token(claims(), self.ec, kid="nope")),
            ("unknown_kid", make_token(claims(), self.ec, kid="r1")),  # an RSA key's kid
            ("signature", make_token(claims(), self.ec_other, kid="e1")),
            ("signature", make_token(claims(), self.rsa_other, kid="r1")),
            ("algorithm", make_token(claims(), secret=b"not-a-signing-key", kid="s1")),
        ]
        n = 1
        for reason, tok in cases:
            with self.subTest(reason=reason):
                before = self.fallbacks(self.d, reason=reason)
                r = self.d.post(key=k, headers=bearer(tok))
                self.assertNotReplay(r)
                n += 1
                self.assertEqual(self.up.count(key=k), n)
                self.assertEqual(self.fallbacks(self.d, reason=reason), before + 1)


class JwtScopeSecret(KeysOnce, h.IdemTestCase):
    SECRET = b"a shared secret of more than thirty-two bytes"

    def test_hs256_with_the_secret_and_with_another(self):
        path = self.write("hs", self.SECRET + b"\n")
        up, d = self.setup_pair({"scope": ["jwt:org.id"], "jwt_secret_file": path})
        k = h.new_key()
        first = d.post(key=k, headers=bearer(make_token(claims(org={"id": 7}),
                                                        secret=self.SECRET)))
        again = d.post(key=k, headers=bearer(make_token(claims("other", org={"id": 7}),
                                                        secret=self.SECRET)))
        self.assertReplayOf(again, first)
        self.assertEqual(d.get_key(k, scope=h.scope_of("7")).status, 200)
        forged = d.post(key=k, headers=bearer(make_token(claims(org={"id": 7}),
                                                         secret=self.SECRET[:-1])))
        self.assertNotReplay(forged)
        self.assertEqual(up.count(key=k), 2)


class JwtKeysReload(KeysOnce, h.IdemTestCase):
    def wait_log(self, d, text, count=1):
        h.wait_until(lambda: d.log_text().count(text) >= count, 20, what=text)

    def test_sighup_reads_the_keys_again_and_keeps_them_when_unreadable(self):
        keys = self.write("jwt.pem", self.rsa.public_pem)
        up, d = self.setup_pair({"scope": ["jwt:sub"], "jwt_keys": keys})
        k = h.new_key()
        first = d.post(key=k, headers=bearer(make_token(claims(), self.rsa)))
        # The key is rotated: the file now holds the EC key only.
        self.write("jwt.pem", self.ec.public_pem)
        d.send_signal(h.signal.SIGHUP)
        self.wait_log(d, "JWT keys read again")
        self.assertReplayOf(d.post(key=k, headers=bearer(make_token(claims(), self.ec))), first)
        self.assertNotReplay(d.post(key=k, headers=bearer(make_token(claims(), self.rsa))))
        self.assertEqual(up.count(key=k), 2)
        # The file goes away: the running keys stay.
        os.remove(keys)
        d.send_signal(h.signal.SIGHUP)
        self.wait_log(d, "the running JWT keys are kept")
        self.assertReplayOf(d.post(key=k, headers=bearer(make_token(claims(), self.ec))), first)
        self.assertEqual(up.count(key=k), 2)
        self.assertTrue(d.running())


class JwtConfig(KeysOnce, h.IdemTestCase):
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

    def test_jwt_without_keys_is_refused(self):
        self.assertRefused("scope: [jwt:sub]\n", "jwt:sub", "jwt_keys")

    def test_an_unreadable_key_file_is_refused(self):
        self.assertRefused("scope: [jwt:sub]\njwt_keys: %s/none.pem\n" % self.tmp,
                           "jwt_keys", "none.pem")

    def test_an_invalid_key_file_is_refused(self):
        path = self.write("bad.pem", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
        self.assertRefused("scope: [jwt:sub]\njwt_keys: %s\n" % path, "jwt_keys", "bad.pem")

    def test_a_short_secret_is_refused(self):
        path = self.write("hs", b"short\n")
        self.assertRefused("scope: [jwt:sub]\njwt_secret_file: %s\n" % path,
                           "jwt_secret_file", "32")

    def test_good_keys_are_accepted(self):
        path = self.write("k.pem", self.rsa.public_pem + self.ed.public_pem)
        rc, err = self.run_t("scope: [jwt:sub]\njwt_keys: %s\nscope_missing: reject\n" % path)
        self.assertEqual(rc, 0, err)

    def test_scope_missing_takes_fallback_or_reject(self):
        self.assertRefused("scope_missing: drop\n", "scope_missing", "fallback, reject")


class ScopeConfusion(h.IdemTestCase):
    """The attacks on the scope sources (issue 21 item 2); each passed the
    old code."""

    def test_authorization_without_the_header_never_reaches_the_headers_keys(self):
        up, d = self.setup_pair({"scope": ["header:X-User-Id"]})
        k = h.new_key()
        victim = d.post(key=k, headers={"X-User-Id": "42"})
        self.assertEqual(victim.status, 200, victim)
        r = d.post(key=k, headers={"Authorization": "42"})
        self.assertEqual(r.status, 200, r)
        self.assertNotReplay(r)
        self.assertEqual(up.count(key=k), 2)

    def test_authorization_cannot_claim_the_headers_key_first(self):
        up, d = self.setup_pair({"scope": ["header:X-User-Id"]})
        k = h.new_key()
        d.post(key=k, body=b'{"attacker": 1}', headers={"Authorization": "42"})
        victim = d.post(key=k, body=b'{"amount": 100}', headers={"X-User-Id": "42"})
        self.assertEqual(victim.status, 200, victim)
        self.assertNotReplay(victim)
        self.assertEqual(up.count(key=k), 2)
        self.assertEqual(d.get_key(k, scope=h.scope_of("42")).status, 200)
        self.assertEqual(d.get_key(k, scope=fallback_scope("42")).status, 200)

    def test_scope_missing_reject_answers_400_missing_scope(self):
        up, d = self.setup_pair({"scope": ["header:X-User-Id"], "scope_missing": "reject"})
        r = d.post(key=h.new_key(), headers={"Authorization": "42"})
        self.assertProblem(r, 400, "missing-scope")
        self.assertEqual(up.count(), 0)
        self.assertEqual(d.post(key=h.new_key(), headers={"X-User-Id": "42"}).status, 200)

    def test_the_named_cookie_twice_is_ambiguous(self):
        up, d = self.setup_pair({"scope": ["cookie:sid"]})
        for hdrs in ([("Cookie", "sid=; sid=abc")],
                     [("Cookie", "theme=dark; sid=abc"), ("Cookie", "sid=abc")],
                     [("Cookie", "sid=abc"), ("Cookie", "sid=")]):
            with self.subTest(cookies=hdrs):
                self.assertProblem(d.post(key=h.new_key(), headers=hdrs), 400,
                                   "ambiguous-scope")
        self.assertEqual(up.count(), 0)

    def test_a_quoted_cookie_is_its_unquoted_value(self):
        up, d = self.setup_pair({"scope": ["cookie:sid"]})
        k = h.new_key()
        first = d.post(key=k, headers={"Cookie": "sid=abc"})
        again = d.post(key=k, headers={"Cookie": 'sid="abc"'})
        self.assertReplayOf(again, first)
        self.assertEqual(up.count(key=k), 1)

    def test_the_authorization_scheme_case_and_spaces_are_one_caller(self):
        for config in ({}, {"scope": ["authorization"]}):
            with self.subTest(config=config):
                up, d = self.setup_pair(config)
                k = h.new_key()
                first = d.post(key=k, headers={"Authorization": "Bearer K"})
                for form in ("bearer K", "Bearer  K", "BEARER \t K"):
                    self.assertReplayOf(d.post(key=k, headers={"Authorization": form}), first)
                self.assertEqual(up.count(key=k), 1)
                # The usual form keeps the scope it always had.
                self.assertEqual(d.get_key(k, scope=h.scope_of("Bearer K")).status, 200)
                # The credentials keep their case.
                self.assertNotReplay(d.post(key=k, headers={"Authorization": "Bearer k"}))


if __name__ == "__main__":
    unittest.main()
