"""Unit tests of chaos_history.analyse() on made-up histories: each verdict
of the chaos harness can fail, and fails for the reason it names.

  python3 -m unittest discover -s tests/chaos -p 'test_*.py' -v
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaos_history import analyse, parse_owner_events  # noqa: E402

LEASE = 2.0
STARTS = [(0.0, 0), (0.0, 1)]  # one life of each instance, from the start


def ex(nonce, t_arr, t_end, fence=1, key="k", instance=0, mode="plain", outcome="applied",
       status=None):
    return {"nonce": nonce, "key": key, "fence": fence, "mode": mode, "instance": instance,
            "t_arr": t_arr, "t_end": t_end, "outcome": outcome,
            "status": status or (200 if outcome == "applied" else 409)}


def run(execs, answers, kills=(), outages=(), starts=STARTS, events=None):
    return analyse(execs, answers, list(kills), list(outages), LEASE, starts=list(starts),
                   owner_events=events or {})


def ans(nonce, t, fence=1, key="k", status=200, source="client"):
    return {"key": key, "nonce": nonce, "fence": fence, "status": status, "t": t,
            "source": source}


class Analyse(unittest.TestCase):
    def test_one_execution_one_answer_is_clean(self):
        r = run([ex(1, 10.0, 10.1)], [ans(1, 10.2), ans(1, 12.0)])
        for name in ("double_lease_window", "double_other", "lost", "answer_mismatch",
                     "stale_plain", "stale_fenced"):
            self.assertEqual(r[name], 0, name)

    def test_takeover_after_the_owner_was_killed_is_in_the_lease_window(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=2, instance=1)]
        r = run(execs, [ans(2, 12.7, fence=2)], kills=[(10.5, 0)])
        self.assertEqual(r["double_lease_window"], 1)
        self.assertEqual(r["double_lease_window_kill"], 1)
        self.assertEqual(r["double_other"], 0)
        self.assertEqual(r["lost"], 0)
        # the stale owner's write landed after the takeover's
        self.assertEqual(r["stale_plain"], 1)

    def test_a_kill_however_long_after_the_upstream_answered_explains_it(self):
        # a loaded machine: the completion had not reached the store when
        # the owner died; no duration decides
        execs = [ex(1, 10.0, 10.1), ex(2, 15.0, 15.1, fence=2, instance=1)]
        r = run(execs, [], kills=[(13.0, 0)])
        self.assertEqual(r["double_lease_window_kill"], 1)
        self.assertEqual(r["double_other"], 0)

    def test_takeover_after_a_completion_the_store_refused_is_in_the_lease_window(self):
        # the store came back 2.5 s after the upstream answered: no window
        # of time, only what the owner logged
        execs = [ex(1, 10.0, 10.2), ex(2, 12.7, 12.8, fence=2, instance=1)]
        events = {(0, "k", 1): {"store_failed", "gave_up"}}
        r = run(execs, [ans(2, 12.9, fence=2)], outages=[(12.3, 12.6)], events=events)
        self.assertEqual(r["double_lease_window_store"], 1)
        self.assertEqual(r["double_other"], 0)

    def test_takeover_after_renewals_the_store_refused_is_in_the_lease_window(self):
        execs = [ex(1, 10.0, 14.4), ex(2, 13.0, 13.1, fence=2, instance=1)]
        events = {(0, "k", 1): {"renew_failed", "lease_lost"}}
        r = run(execs, [], events=events)
        self.assertEqual(r["double_lease_window_store"], 1)
        self.assertEqual(r["double_other"], 0)

    def test_a_store_outage_the_owner_did_not_log_does_not_explain_it(self):
        execs = [ex(1, 10.0, 10.2), ex(2, 14.0, 14.1, fence=2, instance=1)]
        r = run(execs, [ans(2, 14.2, fence=2)], outages=[(10.1, 13.5)])
        self.assertEqual(r["double_other"], 1)
        self.assertIn("logged nothing", r["examples"]["double_other"][0])

    def test_a_store_failure_for_another_fence_or_instance_does_not_explain_it(self):
        execs = [ex(1, 10.0, 10.2), ex(2, 14.0, 14.1, fence=2, instance=1)]
        for events in ({(0, "k", 2): {"gave_up"}}, {(1, "k", 1): {"gave_up"}},
                       {(0, "other", 1): {"gave_up"}}):
            r = run(execs, [], events=events)
            self.assertEqual(r["double_other"], 1, events)

    def test_a_completion_written_late_does_not_explain_it(self):
        execs = [ex(1, 10.0, 10.2), ex(2, 14.0, 14.1, fence=2, instance=1)]
        events = {(0, "k", 1): {"store_failed", "stored_late"}}
        r = run(execs, [], kills=[(13.0, 0)], events=events)
        self.assertEqual(r["double_other"], 1)
        self.assertIn("completion was written", r["examples"]["double_other"][0])

    def test_a_lease_lost_without_a_store_failure_is_other(self):
        execs = [ex(1, 10.0, 14.4), ex(2, 13.0, 13.1, fence=2, instance=1)]
        r = run(execs, [], events={(0, "k", 1): {"lease_lost"}})
        self.assertEqual(r["double_other"], 1)
        self.assertIn("lease_lost", r["examples"]["double_other"][0])

    def test_takeover_without_a_crash_is_other(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=2, instance=1)]
        r = run(execs, [ans(2, 12.7, fence=2)])
        self.assertEqual(r["double_other"], 1)

    def test_a_kill_of_the_other_instance_does_not_explain_it(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=2, instance=1)]
        r = run(execs, [], kills=[(10.5, 1)])
        self.assertEqual(r["double_other"], 1)

    def test_a_kill_of_an_earlier_life_of_the_owner_does_not_explain_it(self):
        # idemd0 was killed and started again before prev arrived: the life
        # that forwarded prev lives on
        execs = [ex(1, 12.0, 14.0), ex(2, 14.5, 14.6, fence=2, instance=1)]
        r = run(execs, [], kills=[(10.5, 0)], starts=STARTS + [(11.0, 0)])
        self.assertEqual(r["double_other"], 1)
        r = run(execs, [], kills=[(10.5, 0), (13.0, 0)], starts=STARTS + [(11.0, 0)])
        self.assertEqual(r["double_lease_window_kill"], 1)

    def test_a_kill_after_the_second_execution_does_not_explain_it(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=2, instance=1)]
        r = run(execs, [], kills=[(12.6, 0)])
        self.assertEqual(r["double_other"], 1)

    def test_a_second_execution_with_the_same_fence_is_other(self):
        execs = [ex(1, 10.0, 14.0), ex(2, 12.5, 12.6, fence=1, instance=1)]
        r = run(execs, [], kills=[(10.5, 0)])
        self.assertEqual(r["double_other"], 1)

    def test_execution_after_an_answer_is_other_and_lost(self):
        execs = [ex(1, 10.0, 10.1), ex(2, 13.0, 13.1, fence=2, instance=1)]
        r = run(execs, [ans(1, 10.2, source="proxy0 (dropped)")], kills=[(10.15, 0)])
        self.assertEqual(r["double_other"], 1)
        self.assertEqual(r["lost"], 1)

    def test_an_answer_of_the_first_execution_even_later_makes_it_other(self):
        # prev's outcome was recorded (it was answered), so its key was
        # never free to take over, whenever the answer was seen
        execs = [ex(1, 10.0, 10.1), ex(2, 13.0, 13.1, fence=2, instance=1)]
        r = run(execs, [ans(1, 13.5, source="proxy0")], kills=[(10.15, 0)])
        self.assertEqual(r["double_other"], 1)
        self.assertIn("own answer", r["examples"]["double_other"][0])

    def test_an_execution_after_a_release_status_is_no_double(self):
        execs = [ex(1, 10.0, 10.1, status=503, outcome="error"),
                 ex(2, 10.5, 10.6, fence=1, instance=1)]
        r = run(execs, [ans(2, 10.7)])
        self.assertEqual(r["released"], 1)
        self.assertEqual(r["double_other"], 0)
        self.assertEqual(r["double_lease_window"], 0)

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
        r = run(execs, [], kills=[(10.5, 0)])
        self.assertEqual(r["stale_fenced"], 1)
        execs[0]["outcome"] = "refused"
        r = run(execs, [], kills=[(10.5, 0)])
        self.assertEqual(r["stale_fenced"], 0)
        self.assertEqual(r["refused_stale"], 1)

    def test_parse_owner_events_reads_idemds_lines(self):
        text = "\n".join([
            "2026-12-05T03:22:51.435Z error idemd: could not store the outcome of key k1 "
            "(fence 1): store unavailable; retrying while the lease lasts",
            "2026-12-05T03:22:52.936Z error idemd: gave up storing the outcome of key k1 "
            "(fence 1) after 5 tries: it stays in progress until its lease ends",
            "2026-12-05T03:22:51.640Z warn idemd: could not renew the lease on key k2 "
            "(fence 3): store unavailable; it ends in 1334 ms unless a renewal gets through",
            "2026-12-05T03:22:53.000Z warn idemd: lease on key k2 (fence 3) was lost while "
            "its request ran",
            "2026-12-05T03:22:54.000Z info idemd: stored the outcome of key k3 (fence 2) "
            "after 3 tries",
            "2026-12-05T03:22:55.000Z warn idemd: the claim of key k4 (fence 1) came back "
            "from the store with -20 ms of its lease left; not forwarded",
            "2026-12-05T03:22:56.000Z info request method=POST path=/plain/x status=200 "
            "outcome=new proto=HTTP/1.1 key=k5 scope=anonymous fence=1 ms=3.0",
            "{\"ts\":\"x\",\"level\":\"error\",\"msg\":\"gave up storing the outcome "
            "of key k6 (fence 4) after 1 tries: it stays in progress until its lease ends\"}",
        ])
        self.assertEqual(parse_owner_events(1, text), {
            (1, "k1", 1): {"store_failed", "gave_up"},
            (1, "k2", 3): {"renew_failed", "lease_lost"},
            (1, "k3", 2): {"stored_late"},
            (1, "k4", 1): {"claim_late"},
            (1, "k6", 4): {"gave_up"},
        })

    def test_equal_fences_applied_twice_are_a_stale_write(self):
        execs = [ex(1, 10.0, 10.1, mode="fenced"), ex(2, 11.0, 11.1, mode="fenced")]
        r = run(execs, [])
        self.assertEqual(r["stale_fenced"], 1)
        self.assertEqual(r["double_effect_fenced"], 1)


if __name__ == "__main__":
    unittest.main()
