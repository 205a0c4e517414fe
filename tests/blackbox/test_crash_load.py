"""Crash recovery under load (docs/protocol.md sections 6 and 12): kill -9
idemd while many clients send new keys at once, restart it on the same
store, and every key that got an answer before the kill replays that very
answer.

A completion is durable before its answer is sent, on every store and in
every sync mode, so an answered key can never be lost, whatever the kill
interrupted (a WAL write, a group commit, a sweep).  The verdict does not
depend on timing: the test records which keys were answered (status and
body) and checks each of them after the restart; keys whose request was cut
by the kill may be in flight (409) or run again, and are not judged.
"""

import threading
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

CLIENTS = 16
# Answers to have before the kill: enough that the kill lands in the
# middle of sustained group commits, few enough for the sanitizer tree.
ANSWERED_BEFORE_KILL = 1500


class CrashUnderLoad(h.IdemTestCase):
    def setUp(self):
        super().setUp()
        if not h.store_is_persistent():
            self.skipTest("the store does not survive a restart")

    def test_every_answered_key_replays_after_kill_9(self):
        up = self.start_upstream()
        d = self.make_idemd(up, {"defaults": {"lease": "30s"}})
        d.start()
        answered = {}  # key -> (status, body), for keys idemd answered
        lock = threading.Lock()
        enough = threading.Event()
        stop = threading.Event()

        def client():
            while not stop.is_set():
                k = h.new_key()
                try:
                    r = d.post(key=k, timeout=10)
                except Exception:
                    continue  # cut by the kill: not judged
                if r.status == 200:
                    with lock:
                        answered[k] = (r.status, r.body)
                        if len(answered) >= ANSWERED_BEFORE_KILL:
                            enough.set()

        threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        self.assertTrue(enough.wait(120), "idemd answered %d keys in 120 s" % len(answered))
        d.kill()  # SIGKILL while the clients keep sending
        stop.set()
        for t in threads:
            t.join(30)
        with lock:
            before = dict(answered)
        d.start()
        lost = []
        for k, (status, body) in before.items():
            r = d.post(key=k)
            if r.status != status or r.body != body or r.header("X-Idempotent-Replay") != "true":
                lost.append((k, r.status, r.body[:60]))
        self.assertEqual(lost, [], "%d of %d answered keys did not replay after kill -9"
                         % (len(lost), len(before)))
        for k in before:
            self.assertEqual(up.count(key=k), 1, "key %s ran again" % k)


if __name__ == "__main__":
    unittest.main()
