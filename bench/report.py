#!/usr/bin/env python3
"""bench/report.py - turn one `make bench` run into a table and a JSON file.

bench/run.sh leaves, in its work directory, one wrk output per row and
round (<row>.r<N>.wrk), for the idemd rows the /metrics text scraped before
and after each measured run (<row>.r<N>.metrics.before/.after), and
meta.json (parameters and environment).  This script parses wrk's summary
(Requests/sec, the 50% and 99% lines of --latency, non-2xx answers, socket
errors), takes each figure's median over a row's rounds, works out each
row's ratio to nginx proxy_pass and to nginx direct (ratio of the medians),
checks the targets of the benchmark issues, prints a table and the
ratios of idemd to express-idempotency (new key and replay), and writes
everything, every round's raw wrk output included, to
RESULTS_DIR/bench-<UTC time>.json (and latest.json).

Every wrk row also has the CPU (utime + stime, /proc/PID/stat) of its
server process and, where that is another process, of nginx's upstream
worker, read before and after each measured run (<row>.r<N>.cpu.before and
.after, "ROLE PID TICKS" lines): the table prints each as microseconds per
request (median over the rounds).  The TLS rows have a CPU target instead
of a req/s one: idemd's CPU per new key through TLS at most CPU_TARGET_RATIO
times nginx's per proxied request doing the same TLS work (CPU_TARGETS).
The handshake measurement (tls-handshakes) leaves, per server and round,
<server>.r<N>.hs (the server's CPU before and after, the wall time) and the
`openssl s_time` outputs <server>.r<N>.stime.<K>; this script prints
handshakes a second and CPU per handshake for nginx and idemd and the
ratios (read_handshakes).

The steady-state row (idemd-steady) is not a round of the table: run.sh
leaves idemd-steady.samples (a sample every 10 s: the store's bytes on
disk, new keys and swept records from /metrics, requests answered, RSS) and
idemd-steady.wrk.  This script prints the samples as their own table and
judges them (steady_verdict: the size must stay flat after the first TTL);
a store that grew is a "not met" line like a missed target.

Usage: report.py WORKDIR RESULTS_DIR.  Exit status 0, or 1 when
BENCH_STRICT=1 and a target was missed or a row had errors.  Python stdlib
only.
"""
import json
import os
import re
import sys
import time

ROWS = [
    ("nginx-direct", "nginx direct"),
    ("nginx-proxy", "nginx proxy_pass"),
    ("idemd-new-always", "idemd new key, sync=always"),
    ("idemd-new-interval", "idemd new key, sync=interval"),
    ("idemd-replay", "idemd replay"),
    ("idemd-new-redis", "idemd new key, Redis"),
    ("idemd-replay-redis", "idemd replay, Redis"),
    ("idemd-new-pg", "idemd new key, PostgreSQL"),
    ("idemd-replay-pg", "idemd replay, PostgreSQL"),
    # Issue 20: Redis over TLS, and a Redis Cluster of 3 masters: without
    # replicas (compared with one master, which has none), and with one each.
    ("idemd-new-rediss", "idemd new key, rediss"),
    ("idemd-new-redis-cluster", "idemd new key, Redis Cluster"),
    ("idemd-new-redis-cluster-replicas", "idemd new key, Cluster+replicas"),
    ("express-new", "express-idempotency new key"),
    ("express-replay", "express-idempotency replay"),
    # BENCH_BASE_BUILD: another build's idemd, measured in the same run.
    ("base-new-always", "base idemd new key, sync=always"),
    ("base-new-interval", "base idemd new key, sync=interval"),
    ("base-replay", "base idemd replay"),
    ("base-new-pg", "base idemd new key, PostgreSQL"),
    ("base-new-redis", "base idemd new key, Redis"),
    ("base-new-redis-cluster", "base idemd new key, Redis Cluster"),
    # Issue 19: TLS on the listener and to the upstream.
    ("nginx-tls-listener", "nginx proxy_pass, TLS listener"),
    ("idemd-tls-listener", "idemd new key, TLS listener"),
    ("nginx-https-upstream", "nginx proxy_pass, https upstream"),
    ("idemd-https-upstream", "idemd new key, https upstream"),
    # Issue 22: the new-key path (LMDB, sync=interval) at one worker and at
    # workers: auto (one per CPU).
    ("idemd-workers-1", "idemd new key, workers 1"),
    ("idemd-workers-auto", "idemd new key, workers auto"),
]

# Issue 19's target, per idemd TLS row: its server CPU per request at most
# this many times that of the nginx row doing the same TLS work in the same
# run (nginx's proxy worker only; each upstream is nginx's other worker).
CPU_TARGET_RATIO = 2.0
CPU_TARGETS = {
    "idemd-tls-listener": "nginx-tls-listener",
    "idemd-https-upstream": "nginx-https-upstream",
}

# Issue 20's target for the shared stores: the CPU per new key of idemd and
# of the store server together (server + store, every process of the
# store: PostgreSQL's backends, WAL writer, autovacuum...; every node of
# a Redis Cluster, replicas included) at most this many times nginx
# proxy_pass's CPU per request (its one worker) in the same run.  Printed
# beside the req/s target, and a missed one is listed likewise.
STORE_CPU_TARGETS = {
    "idemd-new-redis": 2.5,
    "idemd-new-rediss": 2.5,
    "idemd-new-redis-cluster": 2.5,
    "idemd-new-redis-cluster-replicas": 2.5,
    "idemd-new-pg": 4.0,
    "base-new-pg": 4.0,  # BENCH_BASE_BUILD: shown, never listed as missed
    "base-new-redis": 2.5,  # likewise
    "base-new-redis-cluster": 2.5,  # likewise
}

# idemd against express-idempotency: (idemd row, express row, path).  The
# first of each path is a target of the benchmark issue (idemd ahead: a
# ratio of req/s of at least 1.0); the others are printed for information.
EXPRESS_PAIRS = [
    ("idemd-new-always", "express-new", "new key", True),
    ("idemd-new-interval", "express-new", "new key", False),
    ("idemd-replay", "express-replay", "replay", True),
    ("idemd-new-redis", "express-new", "new key", False),
    ("idemd-replay-redis", "express-replay", "replay", False),
    ("idemd-new-pg", "express-new", "new key", False),
    ("idemd-replay-pg", "express-replay", "replay", False),
]

# Issue 14's targets, per idemd row: (least req/s, most p99), each a ratio
# to nginx proxy_pass's figure in the same run; None where the row has no
# p99 target (only the default store's durable new key has one).
TARGETS = {
    "idemd-new-always": (0.8, 1.5),
    "idemd-new-interval": (1.0, None),
    "idemd-replay": (2.5, None),
    "idemd-new-redis": (0.7, None),
    "idemd-new-pg": (0.4, None),
}

# Issue 20's req/s target between two rows: (other row, least ratio of
# this row's req/s to the other's), the Redis Cluster of three masters
# against one master.  Printed beside the store CPU target, and a missed
# one is listed likewise.  Like for like: the one master has no replica, so
# the cluster held to it has none either; the cluster with replicas is
# compared in the CPU-bound section below, not held to this target.
VS_ROW_TARGETS = {"idemd-new-redis-cluster": ("idemd-new-redis", 1.0)}

# Rows whose CPU per request of every process (wrk, idemd, the upstream,
# the store) is printed with the req/s the machine's CPUs allow at that
# cost: CPUs / the sum, when everything is CPU-bound (issue 20: how close
# the cluster comes to the bound, against one master).
BOUND_ROWS = ["nginx-proxy", "idemd-new-redis", "idemd-new-redis-cluster",
              "idemd-new-redis-cluster-replicas", "idemd-new-rediss"]

# The steady-state verdict.  After the first key_ttl the sweeper removes
# keys as fast as they come, so the store's size must stop growing; but a
# store's size moves in steps (RocksDB flushes memtables and compacts, an
# LMDB file grows until its free pages are reused), so single samples are
# not compared.  The reference is the largest size among the samples from
# key_ttl to key_ttl + STEADY_WINDOW seconds; the end is the largest among
# the samples of the run's last STEADY_WINDOW seconds that come after that
# window.  Flat: end <= reference + max(STEADY_GROWTH of it, STEADY_SLACK).
# A store that keeps every key grows by about the first TTL's size every
# TTL, so over the default 180 s with key_ttl 10s it ends many times over
# the bound; a slow leak of more than 10 % in the run is caught too.
STEADY_WINDOW = 20
STEADY_GROWTH = 0.10
STEADY_SLACK = 4 << 20

UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def to_ms(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text.strip())
    if not m:
        raise ValueError("not a wrk duration: %r" % text)
    return float(m.group(1)) * UNIT_MS[m.group(2)]


def parse_wrk(text):
    """The figures of one wrk --latency summary."""
    out = {"rps": None, "p50_ms": None, "p75_ms": None, "p90_ms": None, "p99_ms": None,
           "requests": None, "seconds": None, "non_2xx_3xx": 0,
           "socket_errors": {"connect": 0, "read": 0, "write": 0, "timeout": 0}}
    m = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.M)
    if m:
        out["rps"] = float(m.group(1))
    for pct in ("50", "75", "90", "99"):
        m = re.search(r"^\s+%s%%\s+(\S+)" % pct, text, re.M)
        if m:
            out["p%s_ms" % pct] = to_ms(m.group(1))
    m = re.search(r"^\s+(\d+) requests in ([0-9.]+)(us|ms|s|m|h)", text, re.M)
    if m:
        out["requests"] = int(m.group(1))
        out["seconds"] = to_ms(m.group(2) + m.group(3)) / 1e3
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    if m:
        out["non_2xx_3xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        out["socket_errors"] = dict(zip(("connect", "read", "write", "timeout"),
                                        map(int, m.groups())))
    return out


def parse_metrics(text):
    """Prometheus text to {name{labels}: value}, only the lines we use."""
    vals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(" ", 1)
        if len(parts) != 2:
            continue
        try:
            vals[parts[0]] = float(parts[1])
        except ValueError:
            pass
    return vals


def metrics_delta_raw(before, after):
    """Every counter's growth during one measured run."""
    return {k: after[k] - before.get(k, 0.0) for k in after}


def summarise_delta(d):
    """What idemd counted during the measured runs of a row."""
    outcomes = {}
    for k, v in d.items():
        # Summed over the route label (issue 22) and the proto label
        # (issue 23) where there are.
        m = re.fullmatch(r'idem_requests_total\{outcome="([^"]+)"'
                         r'(?:,route="[^"]*")?(?:,proto="[^"]*")?\}', k)
        if m and v:
            outcomes[m.group(1)] = outcomes.get(m.group(1), 0) + int(v)
    res = {"outcomes": outcomes}
    for name in ("idem_store_batches_total", "idem_store_ops_total", "idem_store_errors_total"):
        if name in d:
            res[name.replace("idem_", "").replace("_total", "")] = int(d[name])
    if res.get("store_batches"):
        res["store_ops_per_batch"] = round(res["store_ops"] / res["store_batches"], 2)
    for h in ("store_commit", "upstream", "request"):
        base = "idem_%s_duration_seconds" % h
        cnt, tot = d.get(base + "_count"), d.get(base + "_sum")
        if cnt:
            res["%s_mean_ms" % h] = round(tot / cnt * 1e3, 3)
    return res


def read_steady(work, meta):
    """The steady-state samples and wrk figures, judged; None without the row."""
    path = os.path.join(work, "idemd-steady.samples")
    if not os.path.exists(path):
        return None
    names = ("seconds", "bytes_on_disk", "bytes_apparent", "new", "swept", "answered", "rss_kib")
    samples = []
    with open(path) as f:
        for line in f.read().splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) != len(names):
                continue
            smp = dict(zip(names, [float(parts[0])] + [int(p) for p in parts[1:]]))
            smp["records"] = smp["new"] - smp["swept"]
            samples.append(smp)
    ttl = int(meta.get("steady_ttl_seconds", 10))
    st = {"ttl": meta.get("steady_ttl"), "ttl_seconds": ttl, "seconds": meta.get("steady_seconds"),
          "store": meta.get("steady_store"), "embedded": meta.get("embedded", "lmdb"),
          "samples": samples}
    wpath = os.path.join(work, "idemd-steady.wrk")
    if os.path.exists(wpath):
        with open(wpath) as f:
            raw = f.read()
        st["wrk"] = {**parse_wrk(raw), "wrk_output": raw}
    st["verdict"] = steady_verdict(samples, ttl)
    return st


def steady_verdict(samples, ttl):
    """Flat when the end's largest size is within the bound of the reference's."""
    v = {"rule": "largest size on disk in the last %ds <= largest from key_ttl to key_ttl + %ds"
                 " + max(%d%%, %d MiB)" % (STEADY_WINDOW, STEADY_WINDOW, STEADY_GROWTH * 100,
                                           STEADY_SLACK >> 20)}
    ref = [s for s in samples if ttl <= s["seconds"] <= ttl + STEADY_WINDOW]
    last = samples[-1]["seconds"] if samples else 0
    end = [s for s in samples if s["seconds"] > ttl + STEADY_WINDOW and s["seconds"] >= last - STEADY_WINDOW]
    if not ref or not end:
        v.update(flat=None, why="no sample after key_ttl + %ds (the run must last at least key_ttl + %ds)"
                 % (STEADY_WINDOW, STEADY_WINDOW + 10))
        return v
    ref_b = max(s["bytes_on_disk"] for s in ref)
    end_b = max(s["bytes_on_disk"] for s in end)
    limit = ref_b + max(ref_b * STEADY_GROWTH, STEADY_SLACK)
    v.update(reference_seconds=[ref[0]["seconds"], ref[-1]["seconds"]], reference_bytes=ref_b,
             end_seconds=[end[0]["seconds"], end[-1]["seconds"]], end_bytes=end_b,
             limit_bytes=int(limit), growth=(end_b - ref_b) / ref_b if ref_b else None,
             flat=end_b <= limit)
    return v


def fmt_bytes(n):
    if n is None:
        return "-"
    return "%.1f MiB" % (n / 1048576.0) if n >= 1048576 else "%d KiB" % (n // 1024)


def fmt_span(ab):
    """[a, b] seconds as "40s" or "10-30s"."""
    return "%.0fs" % ab[0] if round(ab[0]) == round(ab[1]) else "%.0f-%.0fs" % (ab[0], ab[1])


def read_cpu(work, name, k, clk, requests):
    """{role: microseconds of CPU per request} of one round, or None.  A
    role's PID may be several, comma-joined (the store role of a Redis
    Cluster: run.sh sums its nodes' ticks); it must match before and after."""
    paths = [os.path.join(work, "%s.r%d.cpu.%s" % (name, k, s)) for s in ("before", "after")]
    if not requests or not all(os.path.exists(p) for p in paths):
        return None
    snaps = []
    for p in paths:
        snap = {}
        with open(p) as f:
            for line in f.read().splitlines():
                parts = line.split()
                if len(parts) == 3:
                    snap[parts[0]] = (parts[1], int(parts[2]))
        snaps.append(snap)
    out = {}
    for role, (pid, before) in snaps[0].items():
        after = snaps[1].get(role)
        if after is None or after[0] != pid or after[1] < before:
            continue  # the process changed or went away: no figure
        out[role] = (after[1] - before) / clk * 1e6 / requests
    return out


def read_handshakes(work, meta):
    """The handshake measurement: per server (nginx, idemd) the median
    handshakes/s and CPU per handshake over the rounds; None without it."""
    clk = float(meta.get("clk_tck") or 100)
    res = {}
    for server in ("nginx", "idemd"):
        rounds = []
        for k in range(1, 100):
            path = os.path.join(work, "handshakes-%s.r%d.hs" % (server, k))
            if not os.path.exists(path):
                break
            hs = {}
            with open(path) as f:
                for line in f.read().splitlines():
                    parts = line.split()
                    if parts and parts[0] == "cpu" and len(parts) == 4:
                        hs["cpu_ticks"] = int(parts[3]) - int(parts[2])
                    elif parts and parts[0] == "wall_us" and len(parts) == 2:
                        hs["wall_s"] = int(parts[1]) / 1e6
            n, raw = 0, []
            for c in range(1, 65):
                sp = os.path.join(work, "handshakes-%s.r%d.stime.%d" % (server, k, c))
                if not os.path.exists(sp):
                    break
                with open(sp) as f:
                    text = f.read()
                raw.append(text)
                m = re.search(r"^(\d+) connections in [0-9.]+ real seconds", text, re.M)
                n += int(m.group(1)) if m else 0
            rnd = {"round": k, "handshakes": n, "clients": len(raw), "s_time_output": raw,
                   "wall_s": hs.get("wall_s")}
            rnd["per_s"] = n / hs["wall_s"] if hs.get("wall_s") else None
            rnd["cpu_us_per_handshake"] = (hs["cpu_ticks"] / clk * 1e6 / n
                                           if n and "cpu_ticks" in hs else None)
            rounds.append(rnd)
        if rounds:
            res[server] = {"per_s": median([r["per_s"] for r in rounds]),
                           "per_s_min": min((r["per_s"] for r in rounds if r["per_s"]), default=None),
                           "per_s_max": max((r["per_s"] for r in rounds if r["per_s"]), default=None),
                           "cpu_us_per_handshake": median([r["cpu_us_per_handshake"] for r in rounds]),
                           "rounds": rounds}
    if not res:
        return None
    a, b = res.get("idemd"), res.get("nginx")
    if a and b and a["per_s"] and b["per_s"]:
        res["rate_ratio"] = a["per_s"] / b["per_s"]
        if a["cpu_us_per_handshake"] and b["cpu_us_per_handshake"]:
            res["cpu_ratio"] = a["cpu_us_per_handshake"] / b["cpu_us_per_handshake"]
    return res


def fmt_us(v):
    return "-" if v is None else "%.1fus" % v


def median(values):
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def fmt_ms(v):
    if v is None:
        return "-"
    return "%.2fms" % v if v >= 1 else "%.0fus" % (v * 1e3)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: report.py WORKDIR RESULTS_DIR")
    work, results_dir = sys.argv[1], sys.argv[2]
    with open(os.path.join(work, "meta.json")) as f:
        meta = json.load(f)

    rows = []
    for name, label in ROWS:
        rounds = []
        for k in range(1, 100):
            path = os.path.join(work, "%s.r%d.wrk" % (name, k))
            if not os.path.exists(path):
                break
            with open(path) as f:
                raw = f.read()
            rnd = {"round": k, **parse_wrk(raw), "wrk_output": raw}
            mb, ma = (os.path.join(work, "%s.r%d.metrics.%s" % (name, k, s)) for s in ("before", "after"))
            if os.path.exists(mb) and os.path.exists(ma):
                with open(mb) as f1, open(ma) as f2:
                    rnd["delta"] = metrics_delta_raw(parse_metrics(f1.read()), parse_metrics(f2.read()))
            rnd["cpu_us_per_req"] = read_cpu(work, name, k, float(meta.get("clk_tck") or 100),
                                             rnd["requests"])
            rounds.append(rnd)
        if not rounds:
            continue
        row = {"name": name, "label": label, "rounds": len(rounds)}
        for field in ("rps", "p50_ms", "p75_ms", "p90_ms", "p99_ms"):
            row[field] = median([r[field] for r in rounds])
        row["rps_min"] = min((r["rps"] for r in rounds if r["rps"] is not None), default=None)
        row["rps_max"] = max((r["rps"] for r in rounds if r["rps"] is not None), default=None)
        row["cpu_us_per_req"] = {}
        for role in ("server", "upstream", "store", "masters", "replicas", "client"):
            v = median([(r["cpu_us_per_req"] or {}).get(role) for r in rounds])
            if v is not None:
                row["cpu_us_per_req"][role] = v
        row["non_2xx_3xx"] = sum(r["non_2xx_3xx"] for r in rounds)
        row["socket_errors"] = {k: sum(r["socket_errors"][k] for r in rounds)
                                for k in ("connect", "read", "write", "timeout")}
        deltas = [r.pop("delta") for r in rounds if "delta" in r]
        if deltas:
            total = {}
            for d in deltas:
                for k, v in d.items():
                    total[k] = total.get(k, 0.0) + v
            row["idemd"] = summarise_delta(total)
        row["per_round"] = rounds
        rows.append(row)

    by = {r["name"]: r for r in rows}
    proxy, direct = by.get("nginx-proxy"), by.get("nginx-direct")
    missed = []
    for r in rows:
        r["vs_proxy"] = (r["rps"] / proxy["rps"]) if proxy and proxy["rps"] and r["rps"] else None
        r["vs_direct"] = (r["rps"] / direct["rps"]) if direct and direct["rps"] and r["rps"] else None
        errs = r["non_2xx_3xx"] + sum(r["socket_errors"].values())
        r["errors"] = errs
        if r["name"] in TARGETS and proxy is not None:  # BENCH_ROWS may leave nginx out
            want, p99_ratio = TARGETS[r["name"]]
            ok_rps = r["vs_proxy"] is not None and r["vs_proxy"] >= want
            # p99_max_ms and p99_met are None on a row without a p99 target.
            p99_max = ok_p99 = None
            if p99_ratio is not None:
                p99_max = proxy["p99_ms"] * p99_ratio if proxy["p99_ms"] is not None else None
                ok_p99 = r["p99_ms"] is not None and p99_max is not None and r["p99_ms"] <= p99_max
            r["target"] = {"rps_vs_proxy_min": want, "rps_met": ok_rps,
                           "p99_vs_proxy_max": p99_ratio, "p99_max_ms": p99_max, "p99_met": ok_p99}
            if not ok_rps:
                missed.append("%s: %.2fx nginx proxy_pass, target >= %.1fx"
                              % (r["label"], r["vs_proxy"] or 0, want))
            if ok_p99 is False:
                missed.append("%s: p99 %s, target <= %.1fx nginx proxy_pass's %s = %s"
                              % (r["label"], fmt_ms(r["p99_ms"]), p99_ratio, fmt_ms(proxy["p99_ms"]),
                                 fmt_ms(p99_max)))
        if r["name"] in CPU_TARGETS:
            base = by.get(CPU_TARGETS[r["name"]])
            mine = r["cpu_us_per_req"].get("server")
            theirs = base["cpu_us_per_req"].get("server") if base else None
            if mine is not None and theirs:
                ratio = mine / theirs
                r["target"] = {"cpu_vs": base["name"], "cpu_vs_max": CPU_TARGET_RATIO,
                               "cpu_ratio": ratio, "cpu_met": ratio <= CPU_TARGET_RATIO,
                               "rps_vs": (r["rps"] / base["rps"]) if base["rps"] and r["rps"] else None}
                if ratio > CPU_TARGET_RATIO:
                    missed.append("%s: %.1fus CPU a request, %.2fx %s's %.1fus, target <= %.1fx"
                                  % (r["label"], mine, ratio, base["label"], theirs, CPU_TARGET_RATIO))
        if r["name"] in STORE_CPU_TARGETS and proxy is not None:
            mine = r["cpu_us_per_req"].get("server")
            store = r["cpu_us_per_req"].get("store")
            theirs = proxy["cpu_us_per_req"].get("server")
            if mine is not None and store is not None and theirs:
                want = STORE_CPU_TARGETS[r["name"]]
                ratio = (mine + store) / theirs
                r.setdefault("target", {}).update(
                    {"store_cpu_vs_proxy_max": want, "store_cpu_ratio": ratio,
                     "store_cpu_met": ratio <= want})
                if ratio > want and not r["name"].startswith("base-"):
                    missed.append("%s: %.1fus + %.1fus (store) CPU a request, %.2fx nginx"
                                  " proxy_pass's %.1fus, target <= %.1fx"
                                  % (r["label"], mine, store, ratio, theirs, want))
        if r["name"] in VS_ROW_TARGETS:
            other, want = VS_ROW_TARGETS[r["name"]]
            o = by.get(other)
            if o and o["rps"] and r["rps"]:
                ratio = r["rps"] / o["rps"]
                r.setdefault("target", {}).update(
                    {"rps_vs_row": other, "rps_vs_row_min": want, "rps_vs_row_ratio": ratio,
                     "rps_vs_row_met": ratio >= want})
                if ratio < want:
                    missed.append("%s: %.2fx %s's req/s, target >= %.1fx"
                                  % (r["label"], ratio, o["label"], want))
        if errs:
            missed.append("%s: %d non-2xx answers, socket errors %s"
                          % (r["label"], r["non_2xx_3xx"], r["socket_errors"]))

    # idemd against express-idempotency.
    versus_express = []
    for idem_name, ex_name, path, is_target in EXPRESS_PAIRS:
        a, b = by.get(idem_name), by.get(ex_name)
        if not a or not b or not a["rps"] or not b["rps"]:
            continue
        v = {"idemd_row": idem_name, "express_row": ex_name, "path": path,
             "rps_ratio": a["rps"] / b["rps"], "idemd_p99_ms": a["p99_ms"],
             "express_p99_ms": b["p99_ms"], "target": is_target}
        if is_target:
            v["met"] = v["rps_ratio"] >= 1.0
            if not v["met"]:
                missed.append("%s: %.2fx express-idempotency %s, target >= 1.0x"
                              % (a["label"], v["rps_ratio"], path))
        versus_express.append(v)

    # The table.
    print()
    print("idem bench  %s  git %s  %s CPUs (load at start %s)"
          % (meta.get("date"), meta.get("git"), meta.get("cpus"), meta.get("loadavg_at_start")))
    engine = {"lmdb": "LMDB", "rocksdb": "RocksDB"}.get(meta.get("embedded", "lmdb"), meta.get("embedded"))
    print("wrk -t%s -c%s -d%ss, median of %s interleaved rounds; %s keys preloaded; %s on %s"
          % (meta.get("threads"), meta.get("connections"), meta.get("seconds"), meta.get("rounds"),
             meta.get("preload"), engine, meta.get("data_fs")))
    hdr = "%-32s %10s %15s %9s %9s %8s %8s %9s %9s %9s  %s" % (
        "row", "req/s", "(min-max)", "p50", "p99", "/proxy", "/direct", "cpu/req", "+upstr", "+store",
        "target")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        t = r.get("target")
        if t and "cpu_ratio" in t:
            tgt = "cpu<=%.1fx nginx %s (%.2fx; req/s %.2fx)" % (
                t["cpu_vs_max"], "MET" if t["cpu_met"] else "MISSED", t["cpu_ratio"], t["rps_vs"] or 0)
        elif t:
            bits = []
            if "rps_vs_proxy_min" in t:
                bits.append("rps>=%.1fx %s" % (t["rps_vs_proxy_min"], "MET" if t["rps_met"] else "MISSED"))
            if t.get("p99_vs_proxy_max") is not None:
                bits.append("p99<=%.1fx %s" % (t["p99_vs_proxy_max"], "MET" if t["p99_met"] else "MISSED"))
            if "store_cpu_ratio" in t:
                bits.append("cpu+store<=%.1fx %s (%.2fx)" % (
                    t["store_cpu_vs_proxy_max"], "MET" if t["store_cpu_met"] else "MISSED",
                    t["store_cpu_ratio"]))
            if "rps_vs_row_ratio" in t:
                bits.append("rps>=%.1fx %s %s (%.2fx)" % (
                    t["rps_vs_row_min"], by[t["rps_vs_row"]]["label"],
                    "MET" if t["rps_vs_row_met"] else "MISSED", t["rps_vs_row_ratio"]))
            tgt = ", ".join(bits)
        else:
            tgt = "(baseline)"
        if r["errors"]:
            tgt += "  ERRORS: %d" % r["errors"]
        print("%-32s %10s %15s %9s %9s %8s %8s %9s %9s %9s  %s" % (
            r["label"],
            "%.0f" % r["rps"] if r["rps"] else "-",
            "(%.0f-%.0f)" % (r["rps_min"], r["rps_max"]) if r["rps_min"] else "",
            fmt_ms(r["p50_ms"]), fmt_ms(r["p99_ms"]),
            "%.2fx" % r["vs_proxy"] if r["vs_proxy"] else "-",
            "%.2fx" % r["vs_direct"] if r["vs_direct"] else "-",
            fmt_us(r["cpu_us_per_req"].get("server")), fmt_us(r["cpu_us_per_req"].get("upstream")),
            fmt_us(r["cpu_us_per_req"].get("store")), tgt))
    if rows:
        print("  (cpu/req: CPU of the row's server process per request, all its threads: nginx's"
              " worker, idemd, the Express app; +upstr: nginx's upstream worker when it is another"
              " process; +store: every process of the row's Redis or PostgreSQL server, a Redis"
              " Cluster's nodes summed, replicas included. nginx direct and nginx proxy_pass run in the upstream's"
              " own worker.)")
    if meta.get("https_upstream_skipped"):
        print("  (idemd new key, https upstream: skipped: %s)" % meta["https_upstream_skipped"])
        missed.append("idemd new key, https upstream: not measured: %s" % meta["https_upstream_skipped"])
    print()
    for r in rows:
        m = r.get("idemd")
        if not m:
            continue
        bits = ["outcomes " + ", ".join("%s=%d" % kv for kv in sorted(m["outcomes"].items()))]
        if m.get("store_batches"):
            bits.append("store commits %d (%.1f ops each, mean %.2fms)"
                        % (m["store_batches"], m.get("store_ops_per_batch", 0),
                           m.get("store_commit_mean_ms", 0)))
        if m.get("store_errors"):
            bits.append("STORE ERRORS %d" % m["store_errors"])
        print("  %-28s %s" % (r["label"] + ":", "; ".join(bits)))
    bound_rows = [by[n] for n in BOUND_ROWS if n in by and by[n]["cpu_us_per_req"].get("client")]
    if bound_rows:
        cpus = int(meta.get("cpus") or 1)
        print()
        print("CPU per request of every process, and the req/s %d CPUs allow at that cost"
              " (bound = %d s of CPU a second / the sum; measured / bound near 1: CPU-bound):"
              % (cpus, cpus))
        print("  %-32s %8s %8s %8s %8s %8s %8s %8s %9s %7s" % (
            "row", "wrk", "server", "upstr", "store", "(mast.)", "(repl.)", "sum", "bound", "meas."))
        for r in bound_rows:
            c = r["cpu_us_per_req"]
            total = sum(c.get(k) or 0 for k in ("client", "server", "upstream", "store"))
            r["cpu_us_per_req_all"] = total
            r["rps_bound"] = cpus * 1e6 / total if total else None
            print("  %-32s %8s %8s %8s %8s %8s %8s %8s %9s %7s" % (
                r["label"], fmt_us(c.get("client")), fmt_us(c.get("server")),
                fmt_us(c.get("upstream")), fmt_us(c.get("store")), fmt_us(c.get("masters")),
                fmt_us(c.get("replicas")), fmt_us(total),
                "%.0f" % r["rps_bound"] if r["rps_bound"] else "-",
                "%.2f" % (r["rps"] / r["rps_bound"]) if r["rps_bound"] and r["rps"] else "-"))
    if versus_express:
        print()
        ad = meta.get("express_adapter")
        print("idemd / express-idempotency (Node %s, express %s, express-idempotency %s, store: %s)"
              % (meta.get("node", "?"), meta.get("express", "?"), meta.get("express_idempotency", "?"),
                 {"map": "a Map in memory", "default": "the package's in-memory array"}.get(ad, ad)))
        if meta.get("express_rss_kib"):
            print("  (the Express app's RSS at the end: %.0f MiB; its store keeps every key)"
                  % (int(meta["express_rss_kib"]) / 1024.0))
        for v in versus_express:
            print("  %-8s %-30s %6.2fx  p99 %s vs %s%s" % (
                v["path"], by[v["idemd_row"]]["label"], v["rps_ratio"],
                fmt_ms(v["idemd_p99_ms"]), fmt_ms(v["express_p99_ms"]),
                ("  target >=1.0x %s" % ("MET" if v["met"] else "MISSED")) if v["target"] else ""))
    hs = read_handshakes(work, meta)
    if hs:
        print()
        print("TLS handshakes, one worker each, the same certificate (EC P-256): %s `openssl s_time -new`"
              " clients for %ss, median of %d rounds" % (meta.get("hs_clients"), meta.get("hs_seconds"),
                                                       max(len(hs[s]["rounds"]) for s in ("nginx", "idemd")
                                                           if s in hs)))
        for server, key in (("nginx", "nginx_tls"), ("idemd", "idemd_tls")):
            if server not in hs:
                continue
            h = hs[server]
            print("  %-6s %8s handshakes/s %15s  %9s CPU a handshake  (%s)" % (
                server, "%.0f" % h["per_s"] if h["per_s"] else "-",
                "(%.0f-%.0f)" % (h["per_s_min"], h["per_s_max"]) if h["per_s_min"] else "",
                fmt_us(h["cpu_us_per_handshake"]), meta.get(key, "?")))
        if "rate_ratio" in hs:
            print("  idemd / nginx: %.2fx handshakes/s, %s CPU a handshake" % (
                hs["rate_ratio"], "%.2fx" % hs["cpu_ratio"] if "cpu_ratio" in hs else "-"))
    steady = read_steady(work, meta)
    if steady:
        print()
        w = steady.get("wrk") or {}
        print("steady state, key_ttl %s: %s sync=interval, a fresh store, wrk -c%s for %ss: "
              "%s req/s, p99 %s" % (steady["ttl"], steady["embedded"], meta.get("connections"),
                                    steady["seconds"], "%.0f" % w["rps"] if w.get("rps") else "-",
                                    fmt_ms(w.get("p99_ms"))))
        hdr = "%8s %12s %10s %10s %10s %11s %9s" % ("t", "on disk", "records", "new", "swept",
                                                   "answered", "RSS")
        print(hdr)
        print("-" * len(hdr))
        for smp in steady["samples"]:
            print("%7.0fs %12s %10d %10d %10d %11d %9s" % (
                smp["seconds"], fmt_bytes(smp["bytes_on_disk"]), smp["records"], smp["new"],
                smp["swept"], smp["answered"], fmt_bytes(smp["rss_kib"] * 1024)))
        v = steady["verdict"]
        if v["flat"] is None:
            line = "no verdict: %s" % v["why"]
            missed.append("steady state: " + line)
        else:
            line = "%s: at most %s at %s against %s at %s (%+.1f%%; limit %s)" % (
                "FLAT" if v["flat"] else "GREW", fmt_bytes(v["end_bytes"]), fmt_span(v["end_seconds"]),
                fmt_bytes(v["reference_bytes"]), fmt_span(v["reference_seconds"]),
                (v["growth"] or 0) * 100, fmt_bytes(v["limit_bytes"]))
            if not v["flat"]:
                missed.append("steady state: the store grew after the first TTL, " + line)
        print("verdict: %s" % line)
        print("  (rule: %s)" % v["rule"])
        errs = (w.get("non_2xx_3xx") or 0) + sum((w.get("socket_errors") or {}).values())
        if errs:
            missed.append("steady state: %d non-2xx answers, socket errors %s"
                          % (w.get("non_2xx_3xx") or 0, w.get("socket_errors")))
        if not steady.get("wrk") or not w.get("rps"):
            missed.append("steady state: no wrk summary")

    if missed:
        print()
        print("not met / errors:")
        for s in missed:
            print("  - " + s)

    os.makedirs(results_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    doc = {"meta": meta, "rows": rows, "versus_express": versus_express, "not_met": missed}
    if steady:
        doc["steady"] = steady
    if hs:
        doc["handshakes"] = hs
    out = os.path.join(results_dir, "bench-%s.json" % stamp)
    for p in (out, os.path.join(results_dir, "latest.json")):
        with open(p, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    print()
    print("results: %s" % out)
    if os.environ.get("BENCH_STRICT") == "1" and missed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
