"""The ledger upstream of the chaos harness (`chaos.py --upstream ledger`).

Instead of the recording upstream, the two idemd forward to one idem-ledger
(examples/ledger) on a SQLite file: a real service that writes the
Idempotency-Key in the same transaction as the transfer it protects.  idemd's
own double forwards (a takeover after an owner died in the lease window) reach
the ledger with the same key, and the ledger must apply each transfer once.

  Ledger      the idem-ledger process (--db sqlite:TMP/ledger.db), its accounts
              created at start; stopped with SIGTERM at the end
  LedgerTap   one loopback listener per idemd between idemd and the ledger: it
              passes each request on unchanged (Idempotency-Key and
              Idempotency-Fence included) on a connection of its own, and
              records the forward (key, fence, instance, arrival, end, the
              ledger's status, transfer id and whether the ledger replayed
              it), so that the history check can tell idemd's double forwards
              apart.  It adds two headers to the ledger's answer,
              X-Chaos-Forward (the forward's number) and X-Chaos-Fence, which
              idemd stores and replays like any upstream header, so that every
              answer a client gets names the forward it came from.  A key's
              first forward may be held: before it reaches the ledger (a
              takeover's forward then lands first and the stale one arrives
              after it) or after the ledger answered (the transfer committed,
              idemd does not know yet); longer than the lease for some, so that
              a kill of its idemd leads to a takeover.  Later forwards of a key
              are not held.
  verdict()   reads the ledger's SQLite file and GET /stats at the end and
              judges them against the client's plan and answers

Python 3 standard library only.
"""

import http.client
import json
import os
import signal
import sqlite3
import subprocess
import time

from chaos_upstream import QuietHandler, Recorder

HOST = "127.0.0.1"
MAX_BODY = 64 * 1024
FORWARD_HEADER = "X-Chaos-Forward"
FENCE_HEADER = "X-Chaos-Fence"
LEDGER_TIMEOUT = 30.0      # s, one forward to the ledger
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-connection", "proxy-authenticate", "proxy-authorization"}
REPLAY_HEADER = "X-Idempotent-Replay"


# --------------------------------------------------------------------------
# the ledger process


class Ledger:
    """One idem-ledger on a SQLite file in tmp, on a free port."""

    def __init__(self, binary, tmp, port, keys=True, threads=4):
        self.binary = binary
        self.db = os.path.join(tmp, "ledger.db")
        self.log = os.path.join(tmp, "ledger.stderr")
        self.port = port
        self.keys = keys
        self.threads = threads
        self.proc = None
        self.exit_status = None

    def argv(self):
        return [self.binary, "--listen", "%s:%d" % (HOST, self.port), "--db",
                "sqlite:%s" % self.db, "--keys", "on" if self.keys else "off",
                "--threads", str(self.threads)]

    def start(self, live, timeout=15.0):
        """Start it (the Popen joins the set live, killed at exit) and wait for
        GET /healthz."""
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=err,
                                         stderr=err)
        live.add(self.proc)
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            if self.proc.poll() is not None:
                raise RuntimeError("idem-ledger exited with %d: %s"
                                   % (self.proc.returncode, self.log_text()[-1000:]))
            try:
                status, _ = self.request("GET", "/healthz", timeout=1.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("idem-ledger not ready after %.0f s" % timeout)

    def request(self, method, path, doc=None, timeout=10.0):
        """One request straight to the ledger; return (status, JSON document)."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            body = None if doc is None else json.dumps(doc).encode()
            conn.request(method, path, body=body, headers={"Content-Type": "application/json",
                                                           "Connection": "close"})
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        try:
            return r.status, json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return r.status, None

    def create_accounts(self, openings):
        for acc, balance in openings.items():
            status, doc = self.request("POST", "/accounts", {"id": acc, "balance": balance})
            if status not in (200, 201):
                raise RuntimeError("POST /accounts %s: %d %r" % (acc, status, doc))

    def stop(self, timeout=15.0):
        """SIGTERM, wait; the exit status (None when it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            self.exit_status = None if self.proc is None else self.proc.returncode
            return self.exit_status
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.exit_status = None
        return self.exit_status

    def log_text(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


# --------------------------------------------------------------------------
# the tap between idemd and the ledger


class _Handler(QuietHandler):

    def do_GET(self):
        self._pass()

    def do_POST(self):
        self._pass()

    def _pass(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            self.close_connection = True
            return
        body = self.rfile.read(n) if n else b""
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP]
        answer = self.server.tap.forward(self.server.instance, self.command, self.path,
                                         headers, body)
        if answer is None:
            self.close_connection = True  # idemd sees a broken upstream connection
            return
        status, rheaders, rbody = answer
        try:
            self.send_response(status)
            for k, v in rheaders:
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(rbody)))
            self.end_headers()
            self.wfile.write(rbody)
            self.wfile.flush()
        except OSError:
            self.close_connection = True


class LedgerTap(Recorder):
    """instances listeners that pass requests on to the ledger and record
    each forward."""

    def __init__(self, ledger_port, instances=2):
        self.ledger_port = ledger_port
        self.plan = {}        # key -> (phase "before"|"after", ms): a first forward's hold
        super().__init__(_Handler, instances, "tap")

    def hold(self, key, phase, ms):
        with self.lock:
            self.plan[key] = (phase, ms)

    def forward(self, instance, method, path, headers, body):
        """Pass one request on; return (status, headers, body) with the two
        chaos headers added, or None when the ledger could not be asked."""
        hdr = {k.lower(): v for k, v in headers}
        key = hdr.get("idempotency-key")
        fence_raw = hdr.get("idempotency-fence")
        fence = int(fence_raw) if fence_raw is not None and fence_raw.strip().isdigit() else None
        with self.lock:
            e = {"nonce": len(self._execs) + 1, "key": key, "fence": fence, "mode": "ledger",
                 "instance": instance, "t_arr": time.monotonic(), "t_end": None,
                 "outcome": None, "status": None, "transfer": None, "replay": False}
            self._execs.append(e)
            phase, ms = (None, 0)
            if method == "POST" and key is not None and key not in self._keys:
                phase, ms = self.plan.get(key, (None, 0))
            if key is not None:
                self._keys.add(key)
        if phase == "before" and ms:
            self.stopping.wait(ms / 1000.0)
        answer = None
        conn = http.client.HTTPConnection(HOST, self.ledger_port, timeout=LEDGER_TIMEOUT)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                conn.putheader(k, v)
            conn.putheader("Connection", "close")
            conn.endheaders(body)
            r = conn.getresponse()
            rbody = r.read()
            answer = (r.status, list(r.getheaders()), rbody)
        except (OSError, http.client.HTTPException):
            answer = None
        finally:
            conn.close()
        if answer is not None and phase == "after" and ms:
            self.stopping.wait(ms / 1000.0)
        with self.lock:
            e["t_end"] = time.monotonic()
            if answer is None:
                e["outcome"] = "error"
                return None
            status, rheaders, rbody = answer
            e["status"] = status
            e["replay"] = any(k.lower() == REPLAY_HEADER.lower() and v.strip() == "true"
                              for k, v in rheaders)
            try:
                doc = json.loads(rbody.decode("utf-8"))
                e["transfer"] = doc.get("id") if isinstance(doc, dict) else None
            except (ValueError, UnicodeDecodeError):
                pass
            if 200 <= status < 300:
                e["outcome"] = "replayed" if e["replay"] else "applied"
            else:
                e["outcome"] = "refused"
        rheaders = rheaders + [(FORWARD_HEADER, str(e["nonce"])),
                               (FENCE_HEADER, "" if fence is None else str(fence))]
        return status, rheaders, rbody


# --------------------------------------------------------------------------
# the verdict


def read_db(path):
    """The ledger's SQLite file: (transfers rows, accounts {id: (balance,
    opening)}, number of key records)."""
    con = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=30)
    try:
        rows = [dict(zip(("id", "from", "to", "amount", "key"), r)) for r in con.execute(
            "SELECT id, from_id, to_id, amount, idem_key FROM transfers")]
        accounts = {r[0]: (r[1], r[2]) for r in con.execute(
            "SELECT id, balance, opening_balance FROM accounts")}
        try:
            keys = con.execute("SELECT COUNT(*) FROM idem_keys").fetchone()[0]
        except sqlite3.Error:
            keys = None
    finally:
        con.close()
    return rows, accounts, keys


def verdict(rows, accounts, stats, plan, executions, finals, ops):
    """Judge the ledger at the end of a run.

    @param rows       the transfers table: dicts id, from, to, amount, key
    @param accounts   {id: (balance, opening balance)}
    @param stats      GET /stats's document (or None when it failed)
    @param plan       {key: (from, to, amount)}: every keyed operation the
                      clients started
    @param executions the tap's forwards (key, status, outcome ...)
    @param finals     {key: [answer document, ...]}: the 2xx answers clients
                      and the verification pass got
    @param ops        the number of keyed operations
    @return dict of figures and "examples" (a few offending keys per kind)"""
    examples = {"double_effect": [], "row_mismatch": [], "balance": [], "final_mismatch": [],
                "received": []}

    def example(kind, text):
        if len(examples[kind]) < 5:
            examples[kind].append(text)

    by_key = {}
    for r in rows:
        by_key.setdefault(r["key"], []).append(r)
    received = {e["key"] for e in executions if e["status"] is not None}
    received_2xx = {e["key"] for e in executions
                    if e["status"] is not None and 200 <= e["status"] < 300}
    fig = {"rows": len(rows), "keys_applied": len(by_key), "keys_received": len(received),
           "double_effects": 0, "keys_applied_twice": 0, "row_mismatch": 0,
           "not_received": 0, "received_not_applied": 0, "balance_wrong": 0,
           "final_mismatch": 0, "finals_checked": 0, "conserved": False, "stats_agree": False}
    for key, lst in by_key.items():
        if len(lst) > 1:
            fig["double_effects"] += len(lst) - 1
            fig["keys_applied_twice"] += 1
            example("double_effect", "%s: %d transfers %s" % (key, len(lst),
                                                             ", ".join(r["id"] for r in lst)))
        if key not in received:
            fig["not_received"] += 1
            example("received", "%s: a transfer, but the ledger never received the key" % key)
        for r in lst:
            if plan.get(key) != (r["from"], r["to"], r["amount"]):
                fig["row_mismatch"] += 1
                example("row_mismatch", "%s: transfer %r, the client asked for %r"
                        % (key, r, plan.get(key)))
    for key in received_2xx - set(by_key):
        fig["received_not_applied"] += 1
        example("received", "%s: the ledger answered 2xx but holds no transfer" % key)
    # balances: the opening ones plus every distinct applied transfer once
    expected = {acc: opening for acc, (_bal, opening) in accounts.items()}
    for key in by_key:
        p = plan.get(key)
        if p is not None and p[0] in expected and p[1] in expected:
            expected[p[0]] -= p[2]
            expected[p[1]] += p[2]
    for acc, (bal, _opening) in sorted(accounts.items()):
        if bal != expected[acc]:
            fig["balance_wrong"] += 1
            example("balance", "%s: balance %d, expected %d from the applied transfers"
                    % (acc, bal, expected[acc]))
    total_open = sum(o for _b, o in accounts.values())
    fig["conserved"] = sum(b for b, _o in accounts.values()) == total_open
    fig["stats_agree"] = stats is not None and stats.get("transfers") == len(rows) and \
        stats.get("transfer_keys") == len(by_key) and stats.get("total_balance") == total_open
    for key, docs in finals.items():
        lst = by_key.get(key, [])
        for d in docs:
            fig["finals_checked"] += 1
            if len(lst) != 1 or d.get("id") != lst[0]["id"] or \
                    (d.get("from"), d.get("to"), d.get("amount")) != \
                    (lst[0]["from"], lst[0]["to"], lst[0]["amount"]):
                fig["final_mismatch"] += 1
                example("final_mismatch", "%s: answer %r, the ledger holds %r" % (key, d, lst))
    fig["within_ops"] = len(by_key) <= ops
    fig["examples"] = examples
    return fig
