"""SPEC section 16: the PostgreSQL store over TLS, through the real idemd.

PostgreSQL's TLS is libpq's: a postgres:// URL carries libpq's own
parameters (sslmode, sslrootcert, sslcert, sslkey, sslcrl, ...), which idemd
passes on as written (src/store/postgres.c takes out only table=, pool= and
timeout=).  This file proves it against real servers of its own.

The servers.  One initdb (as the postgres user when run as root: PostgreSQL
refuses root), copied into one data directory per certificate, each cluster
on its own free loopback port with `ssl = on`, its certificate and key
(from tests/certs.py, the key mode 0600 and owned by the server's user) and a
pg_hba.conf of `hostssl` lines only, so that a connection without TLS is
refused by the server itself:

  good      the CA's certificate for localhost and 127.0.0.1
  wrong     the CA's certificate for other.invalid only

What is checked, each through an idemd started on the URL:
  verify-full with the CA       a keyed POST runs once and is replayed, by
                                name (localhost) and by address (127.0.0.1)
  verify-full with another CA   idemd refuses to start: exit 2, one line on
                                stderr naming the store and the certificate
                                failure, nothing else on stderr
  verify-full, wrong name       the same, naming the host name mismatch
  verify-ca, wrong name         starts (the CA is right; the name is not
                                checked), which shows that what refused the
                                case above was the name
  sslmode=disable               the server refuses it (no hostssl match):
                                exit 2, one line
  two hosts, both failing       libpq's message, one failure per line (and
                                "Connection refused" with a second line of
                                its own), is still one line from idemd
A store that cannot be reached at start is always exit 2 (idemd opens the
store, and the PostgreSQL store connects once, before it listens); /readyz
is what tells an outage after start (tests/blackbox/test_shared_stores.py).
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

sys.path.insert(0, str(h.REPO / "tests"))
from certs import make_certs  # noqa: E402

START_TIMEOUT = 60      # s for pg_ctl start -w (a busy machine)
EXIT_TIMEOUT = 30.0     # s for idemd to give up on a store it cannot open


def _available():
    return h.pg_available() and shutil.which("openssl") is not None


_CLUSTERS = []  # stopped at exit too, even after ^C


@atexit.register
def _stop_clusters():
    for c in list(_CLUSTERS):
        c.stop()


class TlsCluster:
    """A PostgreSQL cluster that speaks TLS only, from a copy of a template
    data directory, with the certificate `cert` of certs."""

    def __init__(self, bindir, template, topdir, name, certs, cert):
        self.bin = bindir
        self.dir = os.path.join(topdir, name)
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "log")
        self.port = h.free_port()
        self.running = False
        os.makedirs(self.dir)
        h.give_to_pg_server(self.dir)
        # A copy keeps the owner when we are root (cp -a), and the modes
        # PostgreSQL insists on (0700 for the data directory).
        h.run_as_pg_server(["cp", "-a", template, self.data])
        crt = os.path.join(self.dir, "server.crt")
        key = os.path.join(self.dir, "server.key")
        shutil.copyfile(certs[cert], crt)
        shutil.copyfile(certs[cert + "_key"], key)
        os.chmod(key, 0o600)  # PostgreSQL refuses a key others can read
        h.give_to_pg_server(crt)
        h.give_to_pg_server(key)
        with open(os.path.join(self.data, "postgresql.conf"), "a", encoding="ascii") as f:
            f.write("\n# tests/blackbox/test_pg_tls.py\n"
                    "listen_addresses = '%s'\n"
                    "port = %d\n"
                    "unix_socket_directories = '%s'\n"
                    "max_connections = 20\n"
                    "shared_buffers = 16MB\n"
                    "ssl = on\n"
                    "ssl_cert_file = '%s'\n"
                    "ssl_key_file = '%s'\n" % (h.HOST, self.port, self.dir, crt, key))
        # No plain `host` line: a connection without TLS matches nothing.
        with open(os.path.join(self.data, "pg_hba.conf"), "w", encoding="ascii") as f:
            f.write("local   all all                trust\n"
                    "hostssl all all 127.0.0.1/32   trust\n")

    def start(self):
        self.running = True  # from here on, stop() must try
        _CLUSTERS.append(self)
        h.run_as_pg_server([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log,
                       "-w", "-t", str(START_TIMEOUT), "start"], log=self.log)

    def stop(self):
        if self.running:
            self.running = False
            subprocess.run(h.as_pg_server([os.path.join(self.bin, "pg_ctl"), "-D", self.data,
                                      "-m", "immediate", "-w", "stop"]),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60, check=False)
        if self in _CLUSTERS:
            _CLUSTERS.remove(self)

    def url(self, host="localhost", **params):
        """A postgres:// URL of this cluster with params as its query."""
        q = "&".join("%s=%s" % (k, v) for k, v in params.items())
        return "postgres://postgres@%s:%d/postgres%s" % (host, self.port, "?" + q if q else "")


@unittest.skipUnless(_available(), "needs PostgreSQL's initdb and pg_ctl, and openssl")
class PostgresOverTls(h.IdemTestCase):
    @classmethod
    def setUpClass(cls):
        cls.top = tempfile.mkdtemp(prefix="idem-bb-pgtls-")
        cls.clusters = []
        try:
            if h.running_as_root():
                os.chmod(cls.top, 0o755)  # the postgres user must reach its files
            cls.certs = make_certs(os.path.join(cls.top, "certs"))
            bindir = h.pg_bin()
            tpl_parent = os.path.join(cls.top, "template")
            os.makedirs(tpl_parent)
            h.give_to_pg_server(tpl_parent)
            template = os.path.join(tpl_parent, "data")
            h.run_as_pg_server([os.path.join(bindir, "initdb"), "-D", template, "-U", "postgres",
                           "-A", "trust", "--no-sync"])
            cls.good = TlsCluster(bindir, template, cls.top, "good", cls.certs, "server")
            cls.wrong = TlsCluster(bindir, template, cls.top, "wrong", cls.certs, "wrong_name")
            cls.clusters = [cls.good, cls.wrong]
            for c in cls.clusters:
                c.start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for c in cls.clusters:
            c.stop()
        if not h.KEEP:
            shutil.rmtree(cls.top, True)

    # helpers

    def refused_at_start(self, url):
        """Start idemd on url, which it must refuse: exit 2 with one line on
        stderr, which is returned."""
        up = self.start_upstream()
        d = self.make_idemd(up, store=url + "&table=never_made")
        d.spawn("refused")
        rc = d.wait_exit(EXIT_TIMEOUT)
        if rc is None:
            self.fail("idemd on %s still runs after %.0fs:\n%s" % (url, EXIT_TIMEOUT,
                                                                  d.log_text()))
        text = d.log_text()
        self.assertEqual(rc, 2, "idemd on %s: exit %d, stderr:\n%s" % (url, rc, text))
        lines = text.splitlines()
        self.assertEqual(len(lines), 1, "not one line:\n%s" % text)
        self.assertTrue(lines[0].startswith("idemd: --store: postgres: cannot connect: "),
                        lines[0])
        self.assertEqual(up.count(), 0)
        return lines[0]

    def runs_once_and_replays(self, url):
        up, d = self.setup_pair(store=url)
        key = h.new_key()
        first = d.post(key=key)
        self.assertEqual(first.status, 200, first)
        self.assertNotReplay(first)
        again = d.post(key=key)
        self.assertReplayOf(again, first)
        self.assertEqual(up.count(key=key), 1)
        self.assertEqual(d.admin("GET", "/readyz").status, 200)

    # cases

    def test_verify_full_with_the_ca_runs_once_and_replays(self):
        self.runs_once_and_replays(self.good.url(sslmode="verify-full",
                                                 sslrootcert=self.certs["ca"],
                                                 table="tls_by_name"))

    def test_verify_full_by_address_runs_once_and_replays(self):
        # The certificate names 127.0.0.1 too (an iPAddress SAN, which libpq
        # 14 and later match).
        self.runs_once_and_replays(self.good.url(host=h.HOST, sslmode="verify-full",
                                                 sslrootcert=self.certs["ca"],
                                                 table="tls_by_address"))

    def test_another_ca_is_refused_at_start(self):
        line = self.refused_at_start(self.good.url(sslmode="verify-full",
                                                   sslrootcert=self.certs["other_ca"]))
        self.assertIn("certificate verify failed", line)

    def test_a_certificate_for_another_name_is_refused_at_start(self):
        line = self.refused_at_start(self.wrong.url(sslmode="verify-full",
                                                    sslrootcert=self.certs["ca"]))
        self.assertIn("does not match host name", line)
        self.assertIn("other.invalid", line)

    def test_verify_ca_does_not_check_the_name(self):
        # The same server as above, accepted when only the CA is checked:
        # so what refused it under verify-full was the name.
        self.runs_once_and_replays(self.wrong.url(sslmode="verify-ca",
                                                  sslrootcert=self.certs["ca"],
                                                  table="tls_verify_ca"))

    def test_every_failure_of_several_hosts_is_on_the_one_line(self):
        # libpq tries each host of a multi-host URL and writes one failure
        # per line, the refused one with a second, indented line: idemd
        # prints them all on its one line.
        url = "postgres://postgres@%s:%d,localhost:%d/postgres?sslmode=verify-full" \
              "&sslrootcert=%s" % (h.HOST, h.dead_port(), self.good.port,
                                   self.certs["other_ca"])
        line = self.refused_at_start(url)
        self.assertIn("Connection refused; ", line)
        self.assertIn("certificate verify failed", line)

    def test_no_tls_is_refused_by_a_hostssl_only_server(self):
        line = self.refused_at_start(self.good.url(sslmode="disable"))
        self.assertIn("no pg_hba.conf entry", line)
        self.assertIn("no encryption", line)


if __name__ == "__main__":
    unittest.main()
