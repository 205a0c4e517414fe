"""The history check of the chaos harness: what happened, judged.

A chaos run records these, the times all on one clock (time.monotonic() of
the harness process, which also runs the upstream and the fault proxies);
times only order events (which came first), no verdict depends on how long
anything took:

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
  kills       each kill -9 of an instance (t, instance), and starts, each
              start of one (t, instance), noted before it is spawned
  owner events what each idemd logged about a claim of its own, by (instance,
              key, fence): parse_owner_events() of its stderr (every life)
  outages     the store's outages (t_down, t_up), for the report only: an
              outage explains nothing by itself, the owner's log says whether
              it hit the owner's claim
  lease       the configured lease in seconds (reported)

analyse() turns these into figures and verdicts.  Nothing here knows idemd
beyond the log lines it names; it is the contract of guarantees.md written
as checks:

- A second execution of a key (any execution after the first, by arrival) is
  a double execution.  It is decided by events, never by how long anything
  took (a loaded machine, a sanitizer build, makes every step slower): it is
  in the "lease-expiry window" only when all of these hold for the execution
  before it (prev):
    * no answer for the key had been given before the second execution
      arrived, and no answer ever carried prev's nonce (an answer means the
      record was completed: durable before visible, and a completed record
      is never taken over);
    * the second execution carries a higher fence than prev (a takeover);
    * prev's owner lost its claim by one of these events:
        kill   the idemd process that forwarded prev (the life of its
               instance current when prev arrived) was killed before the
               second execution arrived;
        store  that idemd logged, for prev's key and fence, that the store
               failed it: a renewal of the lease it could not write ("could
               not renew the lease on key K (fence F)"), or a completion it
               could not write ("could not store the outcome of key K
               (fence F)", "gave up storing the outcome ..."), and it did not
               log that the completion was written after all ("stored the
               outcome of key K (fence F) after N tries").  docs/guarantees.md:
               a store outage longer than what is left of the lease leaves the
               record in progress past its lease, and a repeat runs again.
  Every other double execution is "other", which must never happen; its
  example says what idemd logged for prev (for instance that the lease was
  lost while its request ran, with no store error: a renewal that came too
  late).  A second execution after the upstream answered prev with a status
  of release_statuses (the key was removed: nothing happened) is not a
  double execution at all ("released").
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

RELEASE_STATUSES = (429, 503)  # idemd removes the key: the upstream did nothing

# What an idemd logs about one claim (key, fence) that matters here
# (src/gateway/request.c): kind -> the start of the line's message.
LOG_EVENTS = (
    ("renew_failed", "could not renew the lease on key "),
    ("store_failed", "could not store the outcome of key "),
    ("gave_up", "gave up storing the outcome of key "),
    ("stored_late", "stored the outcome of key "),
    ("lease_lost", "lease on key "),
    ("claim_late", "the claim of key "),
)


def parse_owner_events(instance, text):
    """The events of LOG_EVENTS in one instance's log text (every life of it),
    as a dict (instance, key, fence) -> set of kinds."""
    out = {}
    for line in text.splitlines():
        for kind, prefix in LOG_EVENTS:
            i = line.find(prefix)
            if i < 0:
                continue
            rest = line[i + len(prefix):].split(" ", 3)
            if len(rest) < 3 or rest[1] != "(fence" or not rest[2].rstrip("):").isdigit():
                continue
            fence = int(rest[2].rstrip("):"))
            out.setdefault((instance, rest[0], fence), set()).add(kind)
            break
    return out


def _life_start(starts, inst, t):
    """The start of the life of instance inst current at time t (the latest
    start at or before t), or None when there is none."""
    best = None
    for ts, i in starts:
        if i == inst and ts <= t and (best is None or ts > best):
            best = ts
    return best


def _owner_lost_claim(prev, nxt, kills, starts, owner_events):
    """The event that explains a takeover of prev by nxt, as a short string,
    or None when there is none (then the second string says what prev's
    owner logged, for the example)."""
    if nxt["fence"] is None or prev["fence"] is None or nxt["fence"] <= prev["fence"]:
        return None, "fence %s after %s" % (nxt["fence"], prev["fence"])
    events = owner_events.get((prev["instance"], prev["key"], prev["fence"]), set())
    said = "idemd%d logged %s" % (prev["instance"], ", ".join(sorted(events)) or "nothing")
    if "stored_late" in events:
        return None, said + " (the completion was written)"
    if events & {"renew_failed", "store_failed", "gave_up"}:
        return "store", said
    life = _life_start(starts, prev["instance"], prev["t_arr"])
    for t, inst in kills:
        if inst == prev["instance"] and (life is None or t >= life) and t < nxt["t_arr"]:
            return "kill", said
    return None, said + ", and its process was not killed"


def analyse(executions, answers, kills, outages, lease, starts=(), owner_events=None):
    """Judge one run.  See the module comment for the inputs.

    @param executions list of dicts: key, fence, mode, instance, t_arr, t_end,
                      nonce, outcome, status
    @param answers    list of dicts: key, nonce, fence, status, t, source
    @param kills      list of (t, instance)
    @param outages    list of (t_down, t_up)
    @param lease      the lease in seconds (reported only: no verdict depends
                      on a duration)
    @param starts     list of (t, instance): each start of an idemd, taken
                      before the process was spawned (empty: one life each)
    @param owner_events dict (instance, key, fence) -> set of kinds, from
                      parse_owner_events() of every instance's log
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
    answered_nonces = {a["nonce"] for a in answers}
    if owner_events is None:
        owner_events = {}

    fig = {"executions": len(executions), "keys_executed": len(by_key),
           "double_lease_window": 0, "double_lease_window_kill": 0,
           "double_lease_window_store": 0, "double_other": 0, "released": 0,
           "claims_late": sum(1 for v in owner_events.values() if "claim_late" in v),
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
            if prev.get("status") in RELEASE_STATUSES:
                fig["released"] += 1  # removed by idemd: the next one is a first run
                continue
            answered_before = first_answer is not None and first_answer["t"] < nxt["t_arr"]
            prev_answered = prev["nonce"] in answered_nonces
            if answered_before or prev_answered:
                why, said = None, ""
            else:
                why, said = _owner_lost_claim(prev, nxt, kills, starts, owner_events)
            if why is None:
                fig["double_other"] += 1
                example("double_other", "%s: nonce %d (fence %s, idemd%d, t=%.2f-%.2f) then "
                        "nonce %d (fence %s, idemd%d, t=%.2f)%s"
                        % (key, prev["nonce"], prev["fence"], prev["instance"], prev["t_arr"],
                           prev["t_end"] if prev["t_end"] is not None else -1.0,
                           nxt["nonce"], nxt["fence"], nxt["instance"], nxt["t_arr"],
                           ", after an answer at t=%.2f" % first_answer["t"]
                           if answered_before else
                           ", after prev's own answer" if prev_answered else ": " + said))
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


def _main(argv):
    """Judge a history kept by chaos.py --keep again: chaos_history.py FILE."""
    import json
    if len(argv) != 2:
        print("usage: chaos_history.py TMP/history.json")
        return 2
    with open(argv[1]) as f:
        h = json.load(f)
    events = {(i, k, fence): set(kinds) for i, k, fence, kinds in h["owner_events"]}
    fig = analyse(h["executions"], h["answers"], [tuple(k) for k in h["kills"]],
                  [tuple(o) for o in h["outages"]], h["lease"],
                  starts=[tuple(s) for s in h["starts"]], owner_events=events)
    print(json.dumps(fig, indent=1, sort_keys=True))
    return 1 if fig["double_other"] or fig["lost"] or fig["answer_mismatch"] \
        or fig["stale_fenced"] else 0


if __name__ == "__main__":
    import sys
    sys.exit(_main(sys.argv))
