"""Unit tests of chaos_history.analyse() on made-up histories: each verdict
of the chaos harness can fail, and fails for the reason it names.

  python3 -m unittest discover -s tests/chaos -p 'test_*.py' -v
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaos_history import analyse  # noqa: E402

LEASE = 2.0


def ex(nonce, t_arr, t_end, fence=1, key="k", instance=0, mode="plain", outcome="applied"):
    return {"nonce": nonce, "key": key, "fence": fence, "mode": mode, "instance": instance,
            "t_arr": t_arr, "t_end": t_end, "outcome": outcome,
            "status": 200 if outcome == "applied" else 409}


def ans(nonce, t, fence=1, key="k", status=200, source="client"):
    return {"key": key, "nonce": nonce, "fence": fence, "status": status, "t": t,
            "source": source}


class Analyse(unittest.TestCase):
    def test_one_execution_one_answer_is_clean(self):
        r = analyse([ex(1, 10.0, 10.1)], [ans(1, 10.2), ans(1, 12.0)], [], [], LEASE)
        for name in ("double_lease_window", "double_other", "lost", "answer_mismatch",
                     "stale_plain", "stale_fenced"):
            self.assertEqual(r[name], 0, name)

    def test_takeover_after_the_owner_was_killed_is_in_the_lease_window(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=2, instance=1)]
        r = analyse(execs, [ans(2, 12.7, fence=2)], [(10.5, 0)], [], LEASE)
        self.assertEqual(r["double_lease_window"], 1)
        self.assertEqual(r["double_lease_window_kill"], 1)
        self.assertEqual(r["double_other"], 0)
        self.assertEqual(r["lost"], 0)
        # the stale owner's write landed after the takeover's
        self.assertEqual(r["stale_plain"], 1)

    def test_takeover_after_a_store_outage_is_in_the_lease_window(self):
        execs = [ex(1, 10.0, 10.2), ex(2, 14.0, 14.1, fence=2, instance=1)]
        r = analyse(execs, [ans(2, 14.2, fence=2)], [], [(10.1, 13.5)], LEASE)
        self.assertEqual(r["double_lease_window_store"], 1)
        self.assertEqual(r["double_other"], 0)

    def test_takeover_without_a_crash_is_other(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=2, instance=1)]
        r = analyse(execs, [ans(2, 12.7, fence=2)], [], [], LEASE)
        self.assertEqual(r["double_other"], 1)

    def test_a_kill_of_the_other_instance_does_not_explain_it(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=2, instance=1)]
        r = analyse(execs, [], [(10.5, 1)], [], LEASE)
        self.assertEqual(r["double_other"], 1)

    def test_takeover_before_the_lease_ran_out_is_other(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 11.0, 11.1, fence=2, instance=1)]
        r = analyse(execs, [], [(10.5, 0)], [], LEASE)
        self.assertEqual(r["double_other"], 1)

    def test_a_second_execution_with_the_same_fence_is_other(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=1, instance=1)]
        r = analyse(execs, [], [(10.5, 0)], [], LEASE)
        self.assertEqual(r["double_other"], 1)

    def test_a_kill_long_after_the_upstream_answered_does_not_explain_it(self):
        execs = [ex(1, 10.0, 10.1), ex(2, 15.0, 15.1, fence=2, instance=1)]
        r = analyse(execs, [], [(13.0, 0)], [], LEASE)
        self.assertEqual(r["double_other"], 1)

    def test_execution_after_an_answer_is_other_and_lost(self):
        execs = [ex(1, 10.0, 10.1), ex(2, 13.0, 13.1, fence=2, instance=1)]
        r = analyse(execs, [ans(1, 10.2, source="proxy0 (dropped)")], [(10.15, 0)], [], LEASE)
        self.assertEqual(r["double_other"], 1)
        self.assertEqual(r["lost"], 1)

    def test_another_answer_after_an_answer_is_lost(self):
        execs = [ex(1, 10.0, 10.1), ex(2, 10.05, 10.2, instance=1)]
        r = analyse(execs, [ans(1, 10.15), ans(2, 10.3)], [], [], LEASE)
        self.assertEqual(r["lost"], 1)

    def test_an_answer_naming_no_execution_or_another_fence_is_a_mismatch(self):
        r = analyse([ex(1, 10.0, 10.1)], [ans(7, 10.2)], [], [], LEASE)
        self.assertEqual(r["answer_mismatch"], 1)
        r = analyse([ex(1, 10.0, 10.1)], [ans(1, 10.2, fence=3)], [], [], LEASE)
        self.assertEqual(r["answer_mismatch"], 1)
        r = analyse([ex(1, 10.0, 10.1)], [ans(1, 10.2, key="other")], [], [], LEASE)
        self.assertEqual(r["answer_mismatch"], 1)

    def test_fenced_stale_write_is_counted_and_a_refused_one_is_not(self):
        execs = [ex(1, 10.0, 14.0, mode="fenced"),
                 ex(2, 12.5, 12.6, fence=2, instance=1, mode="fenced")]
        r = analyse(execs, [], [(10.5, 0)], [], LEASE)
        self.assertEqual(r["stale_fenced"], 1)
        execs[0]["outcome"] = "refused"
        r = analyse(execs, [], [(10.5, 0)], [], LEASE)
        self.assertEqual(r["stale_fenced"], 0)
        self.assertEqual(r["refused_stale"], 1)

    def test_equal_fences_applied_twice_are_a_stale_write(self):
        execs = [ex(1, 10.0, 10.1, mode="fenced"), ex(2, 11.0, 11.1, mode="fenced")]
        r = analyse(execs, [], [], [], LEASE)
        self.assertEqual(r["stale_fenced"], 1)
        self.assertEqual(r["double_effect_fenced"], 1)


if __name__ == "__main__":
    unittest.main()
