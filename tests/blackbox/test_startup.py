"""docs/protocol.md section 14: a thread that does not start.

idemd starts a store writer thread (several on a network store), the
sweeper, the admin thread and its workers.  When one of them cannot be
started (pthread_create fails: no memory, a process limit), idemd says so
in one line naming it and exits 2, having stopped and joined only the
threads that did start: no hang, no crash, and the store is closed so that
the next idemd opens it.

The failure is made with the test hook of src/gateway/thread.h: in a build
with tests, IDEM_TEST_THREAD_FAIL=NAME[:N] makes the start of that thread
(the Nth of that name) fail as pthread_create would.  A build without the
hook starts normally, and these tests skip.
"""

import os
import subprocess
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

# How long a failed start may take before it counts as a hang: a bound on a
# deadlock, far above the milliseconds it takes.
HANG_BOUND = 30.0


class ThreadStartFails(h.IdemTestCase):
    def start_failing(self, what, workers=1):
        """Start idemd with the hook failing what; return (exit status,
        stderr lines, the Idemd).  Skips when idemd starts and the build has
        no hook; fails when it starts although the build has one (that
        thread is not started through idem__thread_create)."""
        up = self.start_upstream()
        d = self.make_idemd(up, {"workers": workers})
        log = d.spawn(what.replace(":", "-"), env=dict(os.environ, IDEM_TEST_THREAD_FAIL=what))
        deadline = time.monotonic() + HANG_BOUND
        while d.proc.poll() is None:
            try:
                if h.request(d.admin_port, "GET", "/healthz", timeout=1.0).status == 200:
                    if what == "sweeper" or not self.has_hook():
                        d.kill()
                        self.skipTest("this idemd has no thread test hook "
                                      "(a build without tests)")
                    # The admin thread answers from its start, before the
                    # workers start (and a connection made earlier waits
                    # in the backlog for it): a 200 is no verdict, the exit is.
                    try:
                        d.proc.wait(max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        d.kill()
                        self.fail("idemd started although its %s thread was to fail: "
                                  "not started through idem__thread_create" % what)
                    break
            except OSError:
                pass
            if time.monotonic() >= deadline:
                d.kill()
                self.fail("idemd hung after %s did not start" % what)
            time.sleep(0.05)
        with open(log, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        return d.proc.returncode, lines, d

    def has_hook(self):
        """Whether this idemd has the hook: one whose sweeper is to fail
        exits."""
        env = dict(os.environ, IDEM_TEST_THREAD_FAIL="sweeper")
        port, admin = h.free_ports(2)
        p = subprocess.Popen([h.IDEMD, "--listen", "%s:%d" % (h.HOST, port),
                              "--admin", "%s:%d" % (h.HOST, admin), "--store", "memory:",
                              "--upstream", "http://%s:%d" % (h.HOST, h.dead_port())],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env)
        try:
            return p.wait(HANG_BOUND) == 2
        except subprocess.TimeoutExpired:
            return False
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()

    def assert_one_line(self, lines, text):
        self.assertTrue(lines, "idemd exited 2 without a word")
        self.assertEqual(lines[-1], "idemd: " + text, lines)
        self.assertEqual(sum(1 for l in lines if "cannot start" in l), 1, lines)

    def assert_store_closed(self, d):
        """A normal idemd opens the same store at once (an embedded store
        left locked or open would refuse it)."""
        again = self.start_idemd(d.upstream, store=d.store)
        self.assertEqual(again.admin("GET", "/healthz").status, 200)
        self.assertEqual(again.stop(), 0)

    def test_sweeper_that_does_not_start_is_exit_2(self):
        rc, lines, d = self.start_failing("sweeper")
        self.assertEqual(rc, 2, lines)
        self.assertEqual(len(lines), 1, lines)  # nothing else was said
        self.assert_one_line(lines, "cannot start the sweeper thread: "
                             "Resource temporarily unavailable")
        self.assert_store_closed(d)

    def test_writer_that_does_not_start_is_exit_2(self):
        rc, lines, d = self.start_failing("writer")
        self.assertEqual(rc, 2, lines)
        self.assert_one_line(lines, "cannot start the store writer thread: "
                             "Resource temporarily unavailable")
        self.assert_store_closed(d)

    def test_second_worker_that_does_not_start_is_exit_2(self):
        # The first worker runs already: it is stopped and joined, the second
        # (never started) only has its loop closed.
        rc, lines, d = self.start_failing("worker:2", workers=2)
        self.assertEqual(rc, 2, lines)
        self.assert_one_line(lines, "cannot start worker thread 1: "
                             "Resource temporarily unavailable")
        self.assert_store_closed(d)

    def test_admin_thread_that_does_not_start_is_exit_2(self):
        rc, lines, d = self.start_failing("admin")
        self.assertEqual(rc, 2, lines)
        self.assert_one_line(lines, "cannot start the admin thread: "
                             "Resource temporarily unavailable")
        self.assert_store_closed(d)


if __name__ == "__main__":
    unittest.main()
