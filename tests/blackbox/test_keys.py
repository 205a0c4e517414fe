"""docs/protocol.md section 2: the Idempotency-Key header.

A key is accepted as a Structured Field string ("...", with \\" and \\\\
escapes) or as a bare token; it is 1 to 255 characters of visible ASCII
(plus space inside quotes).  Anything else, an empty value or the header
given twice is 400 invalid-key, and nothing reaches the upstream.
Scoping (the other half of section 1) is in test_scope.py.
"""

import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h


class KeyFormsAccepted(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair()

    def test_bare_token_key_is_accepted_and_forwarded_as_received(self):
        key = h.new_key()
        r = self.d.post(key=key)
        self.assertEqual(r.status, 200, r)
        seen = self.up.requests()
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0].header_all("Idempotency-Key"), [key])

    def test_structured_field_string_key_is_accepted_and_forwarded_as_received(self):
        key = h.new_key()
        r = self.d.post(key='"%s"' % key)
        self.assertEqual(r.status, 200, r)
        seen = self.up.requests()
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0].header_all("Idempotency-Key"), ['"%s"' % key])

    def test_quoted_and_bare_forms_name_the_same_key(self):
        key = h.new_key()
        first = self.d.post(key=key)
        self.assertEqual(first.status, 200, first)
        again = self.d.post(key='"%s"' % key)
        self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(), 1)

    def test_quoted_key_escapes_are_unescaped(self):
        # "a\"b\\c" is the key a"b\c: the admin API finds it under that name
        key = h.new_key() + 'a"b\\c'
        sent = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
        r = self.d.post(key=sent)
        self.assertEqual(r.status, 200, r)
        rec = self.d.get_key(key)
        self.assertEqual(rec.status, 200, rec)
        self.assertEqual(rec.json()["key"], key)

    def test_quoted_key_may_contain_spaces(self):
        key = h.new_key() + " with spaces"
        r = self.d.post(key='"%s"' % key)
        self.assertEqual(r.status, 200, r)
        rec = self.d.get_key(key)
        self.assertEqual(rec.status, 200, rec)
        self.assertEqual(rec.json()["key"], key)

    def test_every_visible_ascii_character_is_allowed_in_a_bare_key(self):
        # But the comma: two Idempotency-Key fields joined (test_replay_headers.py).
        key = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '",')
        r = self.d.post(key=key)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.d.get_key(key).status, 200)

    def test_key_of_255_characters_is_accepted(self):
        key = (h.new_key() + "x" * 255)[:255]
        r = self.d.post(key=key)
        self.assertEqual(r.status, 200, r)
        again = self.d.post(key=key)
        self.assertReplayOf(again, r)

    def test_quoted_key_of_255_characters_after_unescaping_is_accepted(self):
        key = (h.new_key() + "y" * 255)[:254] + '"'
        sent = '"' + key.replace('"', '\\"') + '"'
        self.assertGreater(len(sent), 257)
        r = self.d.post(key=sent)
        self.assertEqual(r.status, 200, r)

    def test_single_character_key_is_accepted(self):
        # a fresh store per test, so "a" cannot collide
        r = self.d.post(key="Z")
        self.assertEqual(r.status, 200, r)

    def test_header_name_is_case_insensitive(self):
        key = h.new_key()
        first = self.d.post(headers=[("idempotency-key", key)])
        self.assertEqual(first.status, 200, first)
        again = self.d.post(headers=[("IDEMPOTENCY-KEY", key)])
        self.assertReplayOf(again, first)
        self.assertEqual(self.up.count(), 1)

    def test_white_space_around_the_value_is_not_part_of_the_key(self):
        key = h.new_key()
        first = self.d.post(key="   %s  " % key)
        self.assertEqual(first.status, 200, first)
        again = self.d.post(key=key)
        self.assertReplayOf(again, first)
        self.assertEqual(self.d.get_key(key).status, 200)


class KeyFormsRejected(h.IdemTestCase):
    """Each bad key: 400 invalid-key, nothing forwarded, nothing stored."""

    def setUp(self):
        super().setUp()
        self.up, self.d = self.setup_pair()

    def rejected(self, *values, ptypes=("invalid-key",)):
        before = self.d.outcome("invalid_key")
        headers = [("Idempotency-Key", v) for v in values]
        r = self.d.post(headers=headers)
        self.assertEqual(r.status, 400, "key %r: %r" % (values, r))
        doc = r.json()
        self.assertIn(doc.get("type"), [h.PROBLEM_PREFIX + t for t in ptypes], doc)
        self.assertProblem(r, 400, doc["type"][len(h.PROBLEM_PREFIX):])
        self.assertEqual(self.up.count(), 0, "a request with key %r was forwarded" % (values,))
        if ptypes == ("invalid-key",):
            self.assertEqual(self.d.outcome_reaches("invalid_key", before + 1), before + 1)
        return r

    def test_empty_value(self):
        self.rejected("")

    def test_empty_quoted_string(self):
        self.rejected('""')

    def test_256_characters(self):
        self.rejected("k" * 256)

    def test_quoted_256_characters(self):
        self.rejected('"' + "k" * 256 + '"')

    def test_header_given_twice_with_different_values(self):
        self.rejected(h.new_key(), h.new_key())

    def test_header_given_twice_with_the_same_value(self):
        k = h.new_key()
        self.rejected(k, k)

    def test_bare_key_with_inner_space(self):
        self.rejected("abc def")

    def test_comma_separated_list(self):
        self.rejected("abc, def")

    def test_tab_inside(self):
        self.rejected("abc\tdef")

    def test_non_ascii_bytes(self):
        self.rejected("caf\u00e9".encode("utf-8"))

    def test_latin1_byte(self):
        self.rejected(b"abc\xff")

    def test_delete_character(self):
        # 0x7F is not visible ASCII; an HTTP parser may already call it
        # malformed (bad-request), which is also a 400 that is not forwarded
        self.rejected(b"abc\x7f", ptypes=("invalid-key", "bad-request"))

    def test_unterminated_quoted_string(self):
        self.rejected('"abc')

    def test_garbage_after_quoted_string(self):
        self.rejected('"abc"def')

    def test_unknown_escape_in_quoted_string(self):
        self.rejected('"ab\\xc"')

    def test_escape_at_end_of_quoted_string(self):
        self.rejected('"abc\\"')

    def test_structured_field_parameters_are_not_a_key(self):
        self.rejected('"abc";p=1')

    def test_nothing_is_stored_for_a_rejected_key(self):
        self.rejected("k" * 256)
        self.assertEqual(self.d.get_key("k" * 255).status, 404)


if __name__ == "__main__":
    unittest.main()
