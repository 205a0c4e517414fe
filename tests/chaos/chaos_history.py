"""The history check of the chaos harness: what happened, judged.

A chaos run records four things, all on one clock (time.monotonic() of the
harness process, which also runs the upstream and the fault proxies):

  executions  every request that reached the upstream: key, fence, mode
              ("plain" or "fenced"), which idemd instance forwarded it, arrival
              and end time, nonce (a number unique to that execution, echoed in
              its response body) and outcome ("applied", or "refused" when the
              fenced upstream refused a stale fence); with the ledger, every
              forward the tap of chaos_ledger.py passed on (mode "ledger",
              nonce in a header, outcome "applied", "replayed" by the
              ledger, "refused" or "error")
  answers     every answer idemd gave that carried an upstream body (so a
              nonce): seen at a fault proxy (delivered or dropped), by a client
              directly, or by the verification pass at the end
  crashes     the faults that can legitimately lose an owner's claim: a
              kill -9 of an instance (t, instance), and a store outage
              (t_down, t_up) which every instance suffers
  lease       the configured lease in seconds

analyse() turns these into figures and verdicts.  Nothing here knows idemd;
it is the contract of guarantees.md written as checks:

- A second execution of a key (any execution after the first, by arrival) is
  a double execution.  It is in the "lease-expiry window after an owner
  crash" only when all of these hold for the execution before it (prev):
    * no answer for the key had been given before the second execution
      arrived (an answer means the record was completed: durable before
      visible);
    * the second execution carries a higher fence than prev (a takeover);
    * it arrived at least one lease after prev arrived (the claim was made
      before prev arrived, and a live lease is never taken over);
    * prev's owner crashed while prev was in progress: the instance that
      forwarded prev was killed, or the store went down, between prev's
      arrival and its end plus a grace (the time idemd needs to record the
      completion), and before the second execution arrived.
  Every other double execution is "other", which must never happen.
- A lost completed response: a key for which idemd gave an answer, and later
  either gave an answer from another execution (another nonce), or the
  upstream received the key again.
- Every answer must name an execution of its key that exists, with the same
  fence, and the status that execution answered.
- A stale write: an applied execution whose fence is not higher than that of
  an execution of the same key already applied before it ended.  With the
  fenced upstream this must never happen; with the plain upstream it is the
  effect fencing is there to stop (counted, not a failure).
"""

EPS = 0.2      # s: clock and scheduling slack between the harness's events
GRACE = 2.0    # s: after the upstream answered, the owner still has to record it


def _owner_crashed(prev, nxt, kills, outages, lease):
    """The crash that explains a takeover of prev by nxt, as a short string,
    or None when there is none."""
    if nxt["t_arr"] < prev["t_arr"] + lease - EPS:
        return None
    if nxt["fence"] is None or prev["fence"] is None or nxt["fence"] <= prev["fence"]:
        return None
    lo = prev["t_arr"] - EPS
    hi = min(prev["t_end"] + GRACE, nxt["t_arr"])
    for t, inst in kills:
        if inst == prev["instance"] and lo <= t <= hi:
            return "kill"
    for t_down, _t_up in outages:
        if lo <= t_down <= hi:
            return "store"
    return None


def analyse(executions, answers, kills, outages, lease):
    """Judge one run.  See the module comment for the inputs.

    @param executions list of dicts: key, fence, mode, instance, t_arr, t_end,
                      nonce, outcome, status
    @param answers    list of dicts: key, nonce, fence, status, t, source
    @param kills      list of (t, instance)
    @param outages    list of (t_down, t_up)
    @param lease      the lease in seconds
    @return dict of figures (numbers) and "examples" (a few offending keys
            per kind, for the report)"""
    by_key = {}
    for e in executions:
        by_key.setdefault(e["key"], []).append(e)
    for lst in by_key.values():
        lst.sort(key=lambda e: (e["t_arr"], e["nonce"]))
    ans_by_key = {}
    for a in answers:
        ans_by_key.setdefault(a["key"], []).append(a)
    for lst in ans_by_key.values():
        lst.sort(key=lambda a: a["t"])
    by_nonce = {e["nonce"]: e for e in executions}

    fig = {"executions": len(executions), "keys_executed": len(by_key),
           "double_lease_window": 0, "double_lease_window_kill": 0,
           "double_lease_window_store": 0, "double_other": 0,
           "lost": 0, "answer_mismatch": 0,
           "stale_plain": 0, "stale_fenced": 0, "refused_stale": 0,
           "double_effect_plain": 0, "double_effect_fenced": 0}
    examples = {"double_other": [], "lost": [], "answer_mismatch": [], "stale_fenced": []}

    def example(kind, text):
        if len(examples[kind]) < 5:
            examples[kind].append(text)

    for key, execs in by_key.items():
        first_answer = ans_by_key.get(key, [None])[0]
        for prev, nxt in zip(execs, execs[1:]):
            answered_before = first_answer is not None and first_answer["t"] < nxt["t_arr"]
            why = None if answered_before else _owner_crashed(prev, nxt, kills, outages, lease)
            if why is None:
                fig["double_other"] += 1
                example("double_other", "%s: nonce %d (fence %s, idemd%d, t=%.2f-%.2f) then "
                        "nonce %d (fence %s, idemd%d, t=%.2f)%s"
                        % (key, prev["nonce"], prev["fence"], prev["instance"], prev["t_arr"],
                           prev["t_end"], nxt["nonce"], nxt["fence"], nxt["instance"],
                           nxt["t_arr"], ", after an answer at t=%.2f" % first_answer["t"]
                           if answered_before else ""))
            else:
                fig["double_lease_window"] += 1
                fig["double_lease_window_" + why] += 1
        applied = [e for e in execs if e["outcome"] == "applied"]
        fig["refused_stale"] += sum(1 for e in execs if e["outcome"] == "refused")
        if len(applied) > 1:
            name = "double_effect_" + execs[0]["mode"]
            fig[name] = fig.get(name, 0) + len(applied) - 1
        for e in applied:
            earlier = [o for o in applied if o is not e and o["t_end"] < e["t_end"]]
            if any(o["fence"] is not None and e["fence"] is not None and o["fence"] >= e["fence"]
                   for o in earlier):
                fig["stale_" + e["mode"]] = fig.get("stale_" + e["mode"], 0) + 1
                if e["mode"] == "fenced":
                    example("stale_fenced", "%s: nonce %d fence %s applied after a higher "
                            "or equal fence" % (key, e["nonce"], e["fence"]))

    for key, lst in ans_by_key.items():
        first = lst[0]
        lost = None
        for a in lst[1:]:
            if a["nonce"] != first["nonce"]:
                lost = "answered nonce %d at t=%.2f, then nonce %d at t=%.2f (%s)" % (
                    first["nonce"], first["t"], a["nonce"], a["t"], a["source"])
                break
        if lost is None:
            for e in by_key.get(key, []):
                if e["t_arr"] > first["t"]:
                    lost = "answered nonce %d at t=%.2f, then executed again (nonce %d) at " \
                           "t=%.2f" % (first["nonce"], first["t"], e["nonce"], e["t_arr"])
                    break
        if lost is not None:
            fig["lost"] += 1
            example("lost", "%s: %s" % (key, lost))
        for a in lst:
            e = by_nonce.get(a["nonce"])
            if e is None or e["key"] != key or e["fence"] != a["fence"] \
                    or e["status"] != a["status"]:
                fig["answer_mismatch"] += 1
                example("answer_mismatch", "%s: answer %r does not match execution %r"
                        % (key, a, e))
    fig["examples"] = examples
    return fig
