"""Unit tests of chaos_ledger: verdict() on made-up ledger tables (each of its
figures can fail, and for the reason it names), read_db() on a real SQLite
file with the ledger's schema, and the fault proxy's reading of an answer
that came through the tap.

  python3 -m unittest discover -s tests/chaos -p 'test_*.py' -v
"""

import os
import shutil
import sqlite3
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaos_ledger import read_db, verdict  # noqa: E402
from chaos_proxy import upstream_doc  # noqa: E402

OPEN = 1000


def fwd(key, status=201, nonce=1):
    return {"nonce": nonce, "key": key, "status": status}


def row(tid, key, src="a", dst="b", amount=10):
    return {"id": tid, "from": src, "to": dst, "amount": amount, "key": key}


def accounts(**balances):
    acc = {"a": OPEN, "b": OPEN, "c": OPEN}
    acc.update(balances)
    return {k: (v, OPEN) for k, v in acc.items()}


def stats(rows, keys, total=3 * OPEN):
    return {"transfers": rows, "transfer_keys": keys, "total_balance": total}


PLAN = {"k1": ("a", "b", 10), "k2": ("b", "c", 5)}


class Verdict(unittest.TestCase):
    def clean(self):
        rows = [row("t1", "k1"), row("t2", "k2", "b", "c", 5)]
        acc = accounts(a=OPEN - 10, b=OPEN + 10 - 5, c=OPEN + 5)
        execs = [fwd("k1"), fwd("k2", nonce=2), fwd("k1", nonce=3)]
        finals = {"k1": [{"id": "t1", "from": "a", "to": "b", "amount": 10}]}
        return rows, acc, stats(2, 2), execs, finals

    def test_each_key_once_is_clean(self):
        rows, acc, st, execs, finals = self.clean()
        r = verdict(rows, acc, st, PLAN, execs, finals, 2)
        for name in ("double_effects", "row_mismatch", "not_received", "received_not_applied",
                     "balance_wrong", "final_mismatch"):
            self.assertEqual(r[name], 0, name)
        self.assertTrue(r["conserved"] and r["stats_agree"] and r["within_ops"])
        self.assertEqual(r["finals_checked"], 1)

    def test_a_key_applied_twice_is_a_double_effect_and_a_wrong_balance(self):
        rows, _acc, _st, execs, finals = self.clean()
        rows.append(row("t3", "k1"))
        acc = accounts(a=OPEN - 20, b=OPEN + 20 - 5, c=OPEN + 5)
        r = verdict(rows, acc, stats(3, 2), PLAN, execs, finals, 2)
        self.assertEqual(r["double_effects"], 1)
        self.assertEqual(r["keys_applied_twice"], 1)
        self.assertEqual(r["balance_wrong"], 2)       # a and b, against one application
        self.assertTrue(r["conserved"])               # money moved, none created
        self.assertEqual(r["final_mismatch"], 1)      # the answer names one of two
        self.assertTrue(r["stats_agree"])

    def test_a_transfer_unlike_the_request_is_a_row_mismatch(self):
        rows, acc, st, execs, finals = self.clean()
        rows[1] = row("t2", "k2", "b", "c", 6)
        r = verdict(rows, acc, st, PLAN, execs, finals, 2)
        self.assertEqual(r["row_mismatch"], 1)

    def test_a_transfer_for_a_key_never_forwarded(self):
        rows, acc, st, execs, finals = self.clean()
        r = verdict(rows, acc, st, PLAN, [e for e in execs if e["key"] != "k2"], finals, 2)
        self.assertEqual(r["not_received"], 1)

    def test_a_2xx_without_a_transfer(self):
        rows, acc, st, execs, finals = self.clean()
        r = verdict(rows, acc, st, PLAN, execs + [fwd("k3", nonce=9)], finals, 3)
        self.assertEqual(r["received_not_applied"], 1)

    def test_a_refused_forward_needs_no_transfer(self):
        rows, acc, st, execs, finals = self.clean()
        r = verdict(rows, acc, st, PLAN, execs + [fwd("k3", status=409, nonce=9)], finals, 3)
        self.assertEqual(r["received_not_applied"], 0)

    def test_money_created_is_not_conserved(self):
        rows, acc, st, execs, finals = self.clean()
        acc["c"] = (OPEN + 6, OPEN)
        r = verdict(rows, acc, st, PLAN, execs, finals, 2)
        self.assertEqual(r["balance_wrong"], 1)
        self.assertFalse(r["conserved"])

    def test_an_answer_naming_another_transfer(self):
        rows, acc, st, execs, finals = self.clean()
        finals["k2"] = [{"id": "t1", "from": "b", "to": "c", "amount": 5}]
        r = verdict(rows, acc, st, PLAN, execs, finals, 2)
        self.assertEqual(r["final_mismatch"], 1)

    def test_an_answer_with_another_amount(self):
        rows, acc, st, execs, finals = self.clean()
        finals["k1"].append({"id": "t1", "from": "a", "to": "b", "amount": 11})
        r = verdict(rows, acc, st, PLAN, execs, finals, 2)
        self.assertEqual(r["final_mismatch"], 1)
        self.assertEqual(r["finals_checked"], 2)

    def test_stats_that_disagree_or_are_missing(self):
        rows, acc, _st, execs, finals = self.clean()
        self.assertFalse(verdict(rows, acc, stats(3, 2), PLAN, execs, finals, 2)["stats_agree"])
        self.assertFalse(verdict(rows, acc, None, PLAN, execs, finals, 2)["stats_agree"])

    def test_more_keys_applied_than_operations(self):
        rows, acc, st, execs, finals = self.clean()
        self.assertFalse(verdict(rows, acc, st, PLAN, execs, finals, 1)["within_ops"])


class ReadDb(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="idem-chaos-test-")
        self.path = os.path.join(self.tmp, "ledger.db")
        con = sqlite3.connect(self.path)
        con.executescript(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT, opening_balance BIGINT);"
            "CREATE TABLE transfers (id TEXT PRIMARY KEY, from_id TEXT, to_id TEXT,"
            " amount BIGINT, idem_key TEXT, created_at BIGINT);"
            "INSERT INTO accounts VALUES ('a', 990, 1000), ('b', 1010, 1000);"
            "INSERT INTO transfers VALUES ('t1', 'a', 'b', 10, 'k1', 0);")
        con.commit()
        con.close()

    def tearDown(self):
        shutil.rmtree(self.tmp, True)

    def test_rows_accounts_and_no_key_table(self):
        rows, acc, keys = read_db(self.path)
        self.assertEqual(rows, [row("t1", "k1")])
        self.assertEqual(acc, {"a": (990, 1000), "b": (1010, 1000)})
        self.assertIsNone(keys)


class TapAnswer(unittest.TestCase):
    def test_the_forward_headers_name_the_answer(self):
        head = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                b"X-Chaos-Forward: 7\r\nX-Chaos-Fence: 2")
        doc = upstream_doc(head, b'{"id": "t1"}')
        self.assertEqual(doc, {"id": "t1", "nonce": 7, "fence": 2})

    def test_a_ledger_problem_is_still_the_ledger_s_answer(self):
        head = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json"
                b"\r\nX-Chaos-Forward: 3\r\nX-Chaos-Fence: ")
        doc = upstream_doc(head, b'{"type": "urn:idem:problem:database-busy"}')
        self.assertEqual(doc["nonce"], 3)
        self.assertIsNone(doc["fence"])

    def test_idemd_s_own_problem_is_not(self):
        head = b"HTTP/1.1 409 Conflict\r\nContent-Type: application/problem+json"
        self.assertIsNone(upstream_doc(head, b'{"type": "urn:idem:problem:in-flight"}'))


if __name__ == "__main__":
    unittest.main()
