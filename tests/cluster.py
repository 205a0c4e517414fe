"""A Redis Cluster of its own for the tests (SPEC section 17): three masters
with a replica each, on free loopback ports, made by Debian's redis-server
7 and `redis-cli --cluster create`.

Used by tests/blackbox/test_redis_cluster.py, and from the shell for the
store tests:

    python3 tests/cluster.py DIR     starts one, prints its redis+cluster://
                                     URL, and keeps it until stdin closes
                                     (or ^C), then stops it

Each node runs `--cluster-enabled yes` with its own config file in DIR,
no persistence (`--save '' --appendonly no`) and a short
`--cluster-node-timeout` so that a killed master's replica takes over in
seconds.  A node's bus port is its port + 10000, so the ports are chosen
from 20000-39999 with both free.  The cluster is ready when every node's
CLUSTER INFO says cluster_state:ok and every node sees the same number of
masters (polled, with a deadline).
"""

import os
import random
import shutil
import socket
import subprocess
import sys
import time

HOST = "127.0.0.1"
REDIS = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
START_TIMEOUT = 60.0   # s for the whole cluster to form on a busy machine
NODE_TIMEOUT_MS = 2000  # cluster-node-timeout: a failover within a few seconds
AVOID = {6391, 5441, 6401, 5451}  # others' services on this machine


def _free(port):
    for p in (port, port + 10000):
        if p in AVOID:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, p))
            except OSError:
                return False
    return True


def cluster_ports(n):
    """n ports p in 20000..29999, p and p + 10000 free."""
    out = []
    while len(out) < n:
        p = random.randint(20000, 29999)
        if p not in out and _free(p):
            out.append(p)
    return out


class Node:
    def __init__(self, topdir, port, tls=None):
        self.port = port
        self.dir = os.path.join(topdir, "node-%d" % port)
        os.makedirs(self.dir, exist_ok=True)
        self.log = os.path.join(self.dir, "redis.log")
        self.tls = tls
        self.proc = None

    def argv(self):
        a = [REDIS, "--bind", HOST, "--dir", self.dir, "--save", "", "--appendonly", "no",
             "--cluster-enabled", "yes", "--cluster-config-file",
             os.path.join(self.dir, "nodes.conf"),
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
             "--logfile", self.log]
        if self.tls:
            a += ["--port", "0", "--tls-port", str(self.port), "--tls-cluster", "yes",
                  "--tls-replication", "yes", "--tls-cert-file", self.tls["server"],
                  "--tls-key-file", self.tls["server_key"], "--tls-ca-cert-file",
                  self.tls["ca"], "--tls-auth-clients", "no",
                  # the bus always wants a client certificate (clientAuth)
                  "--tls-client-cert-file", self.tls["client_a"],
                  "--tls-client-key-file", self.tls["client_a_key"]]
        else:
            a += ["--port", str(self.port)]
        return a

    def start(self):
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Cluster:
    """masters masters with replicas replicas each; tls: the paths of
    tests/certs.py (ca, server, server_key) for a TLS-only cluster."""

    def __init__(self, topdir, masters=3, replicas=1, tls=None):
        self.topdir = topdir
        self.tls = tls
        self.nmasters = masters
        self.replicas = replicas
        ports = cluster_ports(masters * (1 + replicas))
        self.nodes = [Node(topdir, p, tls) for p in ports]

    # -- commands -------------------------------------------------------

    def cli(self, port, *args, timeout=20):
        """redis-cli's answer to one command on the node at port (raw)."""
        argv = [REDIS_CLI, "-h", HOST, "-p", str(port)]
        if self.tls:
            argv += ["--tls", "--cacert", self.tls["ca"]]
        argv += [str(a) for a in args]
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        return r.stdout.decode("utf-8", "replace").strip()

    def info(self, port):
        try:
            text = self.cli(port, "CLUSTER", "INFO", timeout=5)
        except subprocess.TimeoutExpired:
            return {}
        out = {}
        for line in text.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                out[k.strip()] = v.strip()
        return out

    def nodes_table(self, port):
        """CLUSTER NODES of the node at port: a list of dicts."""
        rows = []
        for line in self.cli(port, "CLUSTER", "NODES").splitlines():
            f = line.split()
            if len(f) < 8:
                continue
            addr = f[1].split("@")[0]
            rows.append({"id": f[0], "port": int(addr.rsplit(":", 1)[1]),
                         "flags": f[2].split(","), "master": f[3],
                         "link": f[7], "slots": f[8:]})
        return rows

    def masters(self):
        """Ports of the live masters that hold slots, as the first live node sees them."""
        for n in self.nodes:
            if n.alive():
                return sorted(r["port"] for r in self.nodes_table(n.port)
                              if "master" in r["flags"] and "fail" not in r["flags"]
                              and "fail?" not in r["flags"] and r["slots"])
        return []

    def replica_of(self, master_port):
        for n in self.nodes:
            if n.alive():
                tab = self.nodes_table(n.port)
                mid = [r["id"] for r in tab if r["port"] == master_port][0]
                return [r["port"] for r in tab if r["master"] == mid][0]
        raise AssertionError("no live node")

    def node(self, port):
        return [n for n in self.nodes if n.port == port][0]

    def keyslot(self, key):
        return int(self.cli(self.nodes[0].port, "CLUSTER", "KEYSLOT", key))

    def url(self, **params):
        live = [n for n in self.nodes if n.alive()]
        hosts = ",".join("%s:%d" % (HOST, n.port) for n in live[:2])
        q = "&".join("%s=%s" % (k, v) for k, v in params.items())
        return "%s://%s%s" % ("rediss+cluster" if self.tls else "redis+cluster", hosts,
                              "?" + q if q else "")

    # -- life -----------------------------------------------------------

    def start(self):
        for n in self.nodes:
            n.start()
        deadline = time.monotonic() + START_TIMEOUT
        for n in self.nodes:
            while self.cli(n.port, "PING", timeout=5) != "PONG":
                if not n.alive() or time.monotonic() > deadline:
                    raise AssertionError("redis-server %d did not start: %s"
                                         % (n.port, self.log_tail(n)))
                time.sleep(0.05)
        argv = [REDIS_CLI]
        if self.tls:
            argv += ["--tls", "--cacert", self.tls["ca"]]
        argv += ["--cluster", "create"] + ["%s:%d" % (HOST, n.port) for n in self.nodes]
        argv += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=START_TIMEOUT)
        if r.returncode != 0:
            raise AssertionError("redis-cli --cluster create failed:\n%s"
                                 % (r.stdout + r.stderr).decode("utf-8", "replace")[-2000:])
        self.wait_ok(deadline, replicas=self.nmasters * self.replicas)
        return self

    def wait_ok(self, deadline=None, masters=None, replicas=0):
        """Until every live node says cluster_state:ok and knows the same
        count of masters with slots (masters: that count), and at least
        replicas replicas are attached (as the first live node sees it)."""
        deadline = deadline or time.monotonic() + START_TIMEOUT
        want = masters or self.nmasters
        while True:
            live = [n for n in self.nodes if n.alive()]
            infos = [self.info(n.port) for n in live]
            if all(i.get("cluster_state") == "ok" and i.get("cluster_size") == str(want)
                   for i in infos):
                tab = self.nodes_table(live[0].port) if replicas else []
                if sum(1 for r in tab if "slave" in r["flags"] and r["master"] != "-"
                       and r["link"] == "connected") >= replicas:
                    return
            if time.monotonic() > deadline:
                raise AssertionError("cluster not ok: %r" % infos)
            time.sleep(0.1)

    def add_master(self, deadline=None):
        """Start one more node, empty, and have it meet the cluster; return
        its port once every live node knows it by its id, it knows them all,
        and it says cluster_state:ok (it has learnt the slots)."""
        deadline = deadline or time.monotonic() + START_TIMEOUT
        n = Node(self.topdir, cluster_ports(1)[0], self.tls)
        self.nodes.append(n)
        n.start()
        while self.cli(n.port, "PING", timeout=5) != "PONG":
            if not n.alive() or time.monotonic() > deadline:
                raise AssertionError("redis-server %d did not start" % n.port)
            time.sleep(0.05)
        first = [m for m in self.nodes if m.alive() and m is not n][0]
        out = self.cli(first.port, "CLUSTER", "MEET", HOST, n.port)
        if out != "OK":
            raise AssertionError("CLUSTER MEET: %s" % out)
        myid = self.cli(n.port, "CLUSTER", "MYID")
        while True:
            # Known by its own id (not a handshake's provisional one).
            seen = [any(r["id"] == myid and r["link"] == "connected"
                        and "handshake" not in r["flags"]
                        for r in self.nodes_table(m.port))
                    for m in self.nodes if m.alive()]
            known = [r for r in self.nodes_table(n.port) if r["link"] == "connected"
                     and "handshake" not in r["flags"] and "fail" not in r["flags"]]
            if (all(seen) and len(known) >= sum(1 for m in self.nodes if m.alive()) - 1
                    and self.info(n.port).get("cluster_state") == "ok"):
                return n.port
            if time.monotonic() > deadline:
                raise AssertionError("node %d not seen by every node" % n.port)
            time.sleep(0.1)

    def stop(self):
        for n in self.nodes:
            n.stop()

    def log_tail(self, n):
        try:
            with open(n.log, "rb") as f:
                return f.read().decode("utf-8", "replace")[-2000:]
        except OSError:
            return ""


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: cluster.py DIR\n")
        return 2
    c = Cluster(sys.argv[1])
    try:
        c.start()
        sys.stdout.write(c.url() + "\n")
        sys.stdout.flush()
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
