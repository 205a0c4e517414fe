"""Damaged store files (issue 20 item 7): an error, never a wrong answer.

Two kinds of damage to an lmdb: store, made to the files on disk while idemd
is stopped, as a bad disk, a bad copy or a full disk during a restore would:

- a record whose body bytes changed: every record carries a checksum
  (src/core/record.c, version 2) that the decoder verifies, so a repeat of
  its key is answered with an error and the upstream is not called again;
  the damaged bytes are never sent to the client;
- a data.mdb cut short, or one that is not an LMDB file at all: idemd used
  to die of SIGBUS in mdb_dbi_open at every start; now it checks the file
  before LMDB maps it (src/store/lmdb.c, check_data_file) and exits 2 with
  one line naming the problem;
- a rocksdb: store whose write-ahead log was damaged: RocksDB's default
  recovery cut the log at the damage, silently, so the keys completed after
  it ran again; now the open is refused (exit 2, one line).

These tests always use a store of their own in their own directory,
whatever IDEM_BB_STORE says, because they edit its files.
"""

import os
import signal
import time
import unittest
import uuid

try:
    from . import harness as h
except ImportError:
    import harness as h

# How long a refused start may take before it counts as a hang.
EXIT_BOUND = 30.0


class Corruption(h.IdemTestCase):
    def lmdb_url(self):
        self.data_dir = os.path.join(self.tmp, "store")
        return "lmdb:" + self.data_dir

    def data_file(self):
        return os.path.join(self.data_dir, "data.mdb")

    def complete_keys(self, d, up, n, body_size=0):
        """Complete n keys through d; return {key: body}."""
        done = {}
        for i in range(n):
            marker = "MARK-%s-%d" % (uuid.uuid4().hex, i)
            body = (marker + "." * body_size).encode()
            up.set_reply(status=201, headers={"Content-Type": "text/plain"}, body=body)
            k = h.new_key("c")
            r = d.post(key=k)
            self.assertEqual(r.status, 201, r)
            self.assertEqual(r.body, body)
            done[k] = body
        return done

    def flip_everywhere(self, needle, at):
        """Flip one bit of byte `at` of every copy of needle in data.mdb (an
        LMDB page may keep older copies); return how many were changed."""
        with open(self.data_file(), "r+b") as f:
            data = bytearray(f.read())
            n, i = 0, data.find(needle)
            while i >= 0:
                data[i + at] ^= 0x01
                n += 1
                i = data.find(needle, i + 1)
            f.seek(0)
            f.write(data)
        return n

    def start_refused(self, d):
        """Start d, which must exit by itself; return (status, stderr lines)."""
        log = d.spawn("refused")
        rc = d.wait_exit(EXIT_BOUND)
        if rc is None:
            self.fail("idemd did not exit within %.0fs on a damaged data.mdb" % EXIT_BOUND)
        with open(log, "rb") as f:
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        return rc, lines

    # ---- a damaged record ---------------------------------------------------

    def damaged_repeat(self, config=None):
        """Complete a key, damage one byte of its body on disk, restart and
        repeat it; return (the repeat's answer, the key, its body, every key
        completed, the upstream, idemd)."""
        up = self.start_upstream()
        cfg = {"local_cache": 0}
        cfg.update(config or {})
        d = self.make_idemd(up, store=self.lmdb_url(), config=cfg)
        d.start()
        done = self.complete_keys(d, up, 3)
        self.assertEqual(d.stop(), 0)
        key = sorted(done)[1]
        body = done[key]
        self.assertGreaterEqual(self.flip_everywhere(body, len(body) - 3), 1,
                                "the body is not in data.mdb as it was sent")
        d.start()
        r = d.post(key=key)
        return r, key, body, done, up, d

    def test_a_damaged_body_is_not_replayed(self):
        r, key, body, done, up, d = self.damaged_repeat()
        damaged = bytearray(body)
        damaged[-3] ^= 0x01
        self.assertNotIn(bytes(damaged), r.body, "the damaged body was replayed: %r" % r)
        self.assertFalse(r.replayed, r)
        self.assertNotEqual(r.status, 201, r)
        self.assertGreaterEqual(r.status, 500, r)
        # Not run again either: the key's first request was executed.
        self.assertEqual(up.count(key=key), 1)
        # The other keys of the store are untouched and replay as they were.
        for k, b in done.items():
            if k != key:
                rr = d.post(key=k)
                self.assertEqual((rr.status, rr.body), (201, b), rr)
                self.assertTrue(rr.replayed, rr)

    def test_a_damaged_record_is_500_logged_and_counted(self):
        r, key, body, done, up, d = self.damaged_repeat()
        self.assertEqual(r.status, 500, r)
        m = d.counted_metrics()
        self.assertGreaterEqual(h.metric_sum(m, "idem_requests_total",
                                             outcome="corrupt_record"), 1)
        named = [ln for ln in d.log_text().splitlines()
                 if key in ln and ("corrupt" in ln or "damaged" in ln)]
        self.assertTrue(named, "no log line names the damaged record of %s" % key)

    def test_a_damaged_record_is_not_run_again_when_store_errors_bypass(self):
        r, key, body, done, up, d = self.damaged_repeat({"on_store_error": "open"})
        self.assertEqual(up.count(key=key), 1, "the key's request ran again: %r" % r)
        self.assertEqual(r.status, 500, r)

    # ---- a damaged data.mdb -------------------------------------------------

    def test_a_truncated_data_file_is_refused_in_one_line(self):
        up = self.start_upstream()
        d = self.make_idemd(up, store=self.lmdb_url())
        d.start()
        self.complete_keys(d, up, 40, body_size=3000)  # some 30 pages and more
        self.assertEqual(d.stop(), 0)
        size = os.path.getsize(self.data_file())
        os.truncate(self.data_file(), size // 2)

        rc, lines = self.start_refused(d)
        self.assertNotEqual(rc, -signal.SIGBUS, "idemd died of SIGBUS")
        self.assertEqual(rc, 2, lines)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("data.mdb is truncated", lines[0])
        self.assertIn("%d bytes" % (size // 2), lines[0])
        self.assertIn(self.data_dir, lines[0])

    def test_a_file_that_is_not_lmdb_is_refused_in_one_line(self):
        os.makedirs(os.path.join(self.tmp, "store"))
        up = self.start_upstream()
        d = self.make_idemd(up, store=self.lmdb_url())
        with open(self.data_file(), "wb") as f:
            f.write(b"this is not an LMDB database\n" * 4000)
        rc, lines = self.start_refused(d)
        self.assertEqual(rc, 2, lines)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("data.mdb is not an LMDB database", lines[0])

    def test_a_damaged_rocksdb_log_is_refused_in_one_line(self):
        up = self.start_upstream()
        self.data_dir = os.path.join(self.tmp, "rocks")
        d = self.make_idemd(up, store="rocksdb:" + self.data_dir)
        try:
            d.start(attempts=1)
        except AssertionError as e:
            if "built without" in str(e):
                self.skipTest("idemd is built without RocksDB")
            raise
        done = self.complete_keys(d, up, 3)
        self.assertEqual(d.stop(), 0)
        # The records are in the write-ahead log (nothing was flushed yet).
        body = done[sorted(done)[1]]
        changed = 0
        for name in os.listdir(self.data_dir):
            path = os.path.join(self.data_dir, name)
            with open(path, "r+b") as f:
                data = bytearray(f.read())
                i = data.find(body)
                while i >= 0:
                    data[i + len(body) - 3] ^= 0x01
                    changed += 1
                    i = data.find(body, i + 1)
                f.seek(0)
                f.write(data)
        self.assertGreaterEqual(changed, 1, "the body is in no file of the store")
        rc, lines = self.start_refused(d)
        self.assertEqual(rc, 2, lines)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("Corruption", lines[0])
        # Never served without the keys after the damage: nothing ran again.
        self.assertEqual(up.count(), 3)

    def test_an_empty_data_file_is_a_new_store(self):
        # LMDB writes a new database into an empty file; so does idemd.
        os.makedirs(os.path.join(self.tmp, "store"))
        open(os.path.join(self.tmp, "store", "data.mdb"), "wb").close()
        up = self.start_upstream()
        d = self.make_idemd(up, store=self.lmdb_url())
        d.start()
        self.complete_keys(d, up, 1)


if __name__ == "__main__":
    unittest.main()
