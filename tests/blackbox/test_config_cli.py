"""docs/protocol.md section 14: the idemd command line and its YAML config.

  idemd [--config FILE] [--listen ADDR:PORT] [--upstream URL] [--store URL]
        [--admin ADDR:PORT] [--workers N] [--log-format json|text]
        [--version] [--help]      (and -t: check the configuration and exit)
Flags override the file.  An invalid flag or config: one line naming the
problem (file, line, key) and exit status 2.  SIGTERM/SIGINT: exit 0.
"""

import json
import os
import re
import signal
import subprocess
import time
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

FLAGS = ["--config", "--listen", "--upstream", "--store", "--admin", "--workers",
         "--log-format", "--version", "--help"]

SPEC_DEFAULTS = """\
listen: 127.0.0.1:8080
admin: 127.0.0.1:8081
upstream: http://127.0.0.1:9000
store: lmdb:./idem-data
workers: 1
upstream_timeout: 60s
max_request_bytes: 10MiB
on_store_error: closed            # closed | open
replay_header: X-Idempotent-Replay
scope_header: Authorization
local_cache: 0                    # completed records cached in process
token_ttl: 5m
defaults:                         # every route inherits these
  key_ttl: 24h
  failure_ttl: 5m
  lease: 30s
  on_conflict: reject             # reject | wait
  on_unknown_outcome: expire      # expire | hold
  wait_timeout: 10s
  fingerprint_body: raw           # raw | json
  fingerprint_headers: []
  fingerprint_ignore: []          # JSON pointers, e.g. /client_time
  max_response_bytes: 1MiB
  release_statuses: [429, 503]
routes:                           # first match wins
  - methods: [POST, PATCH]
    path: /                       # a path prefix
    mode: required                # required | optional | token | off
"""


class Cli(h.IdemTestCase):
    def run_idemd(self, args, timeout=10.0):
        if not os.path.exists(h.IDEMD):
            self.fail("idemd binary not found at %s (set $IDEMD)" % h.IDEMD)
        try:
            p = subprocess.run([h.IDEMD] + list(args), stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=timeout, cwd=self.tmp)
        except subprocess.TimeoutExpired:
            self.fail("idemd %s did not exit within %.0fs" % (" ".join(args), timeout))
        return p.returncode, p.stdout.decode("utf-8", "replace"), \
            p.stderr.decode("utf-8", "replace")

    def write(self, text, name="idem.yaml"):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def assertUsageError(self, args, *mentions):
        """Exit 2 with one line on stderr that mentions every string given."""
        rc, out, err = self.run_idemd(args)
        self.assertEqual(rc, 2, "idemd %s: exit %d\n%s%s" % (args, rc, out, err))
        lines = [line for line in err.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, "not one line: %r" % err)
        self.assertEqual(out, "", "stdout: %r" % out)
        for m in mentions:
            if isinstance(m, re.Pattern):
                self.assertRegex(lines[0], m)
            else:
                self.assertIn(m, lines[0])
        return lines[0]


class InfoFlags(Cli):
    def test_version(self):
        rc, out, err = self.run_idemd(["--version"])
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"\d+\.\d+\.\d+")

    def test_help_names_every_flag(self):
        rc, out, err = self.run_idemd(["--help"])
        self.assertEqual(rc, 0, err)
        for flag in FLAGS:
            self.assertIn(flag, out)


class CheckConfig(Cli):
    def test_t_accepts_a_valid_config_and_exits_without_serving(self):
        port = h.free_port()
        path = self.write("listen: 127.0.0.1:%d\ndefaults:\n  lease: 5s\n" % port)
        rc, out, err = self.run_idemd(["--config", path, "-t"])
        self.assertEqual(rc, 0, err)
        with self.assertRaises(OSError):
            h.request(port, "GET", "/", timeout=1)

    def test_t_rejects_an_invalid_config(self):
        path = self.write("defaults:\n  lease: forever\n")
        rc, out, err = self.run_idemd(["-t", "--config", path])
        self.assertEqual(rc, 2, err)
        self.assertIn("idem.yaml", err)
        self.assertIn("lease", err)

    def test_spec_defaults_written_out_are_a_valid_config(self):
        path = self.write(SPEC_DEFAULTS)
        rc, out, err = self.run_idemd(["--config", path, "-t"])
        self.assertEqual(rc, 0, err)

    def test_every_duration_and_size_form_is_accepted(self):
        path = self.write("upstream_timeout: 250ms\nmax_request_bytes: 512\ntoken_ttl: 24h\n"
                          "defaults:\n  key_ttl: 5m\n  lease: 30s\n  wait_timeout: 1500ms\n"
                          "  max_response_bytes: 64KiB\n  failure_ttl: 1h\n")
        rc, out, err = self.run_idemd(["--config", path, "-t"])
        self.assertEqual(rc, 0, err)

    def test_every_enum_value_is_accepted(self):
        path = self.write(
            "on_store_error: open\ndefaults:\n  on_conflict: wait\n"
            "  on_unknown_outcome: hold\n  fingerprint_body: json\n"
            "routes:\n"
            "  - {methods: [POST], path: /a, mode: required}\n"
            "  - {methods: [POST], path: /b, mode: optional}\n"
            "  - {methods: [POST], path: /d, mode: \"off\"}\n"
            "  - methods: [GET]\n    path: /e\n    mode: off\n")
        rc, out, err = self.run_idemd(["--config", path, "-t"])
        self.assertEqual(rc, 0, err)

    def test_token_routes_are_accepted(self):
        path = self.write("routes:\n"
                          "  - {methods: [POST], path: /a, mode: required}\n"
                          "  - {methods: [POST], path: /c, mode: token}\n")
        rc, out, err = self.run_idemd(["--config", path, "-t"])
        self.assertEqual(rc, 0, err)


class BadFlags(Cli):
    def test_unknown_flag(self):
        self.assertUsageError(["--bogus"], "--bogus")

    def test_flag_without_its_value(self):
        self.assertUsageError(["--listen"], "--listen")

    def test_workers_not_a_number(self):
        self.assertUsageError(["--workers", "abc", "-t"], "--workers")

    def test_workers_zero(self):
        self.assertUsageError(["--workers", "0", "-t"], "--workers")

    def test_workers_negative(self):
        self.assertUsageError(["--workers", "-3", "-t"], "--workers")

    # a bad value names the setting (as "--listen" or "listen") and the value

    def test_listen_without_port(self):
        self.assertUsageError(["--listen", "nonsense", "-t"], "listen", "nonsense")

    def test_listen_port_out_of_range(self):
        self.assertUsageError(["--listen", "127.0.0.1:99999", "-t"], "listen", "99999")

    def test_admin_without_port(self):
        self.assertUsageError(["--admin", "127.0.0.1", "-t"], "admin", "127.0.0.1")

    def test_upstream_not_http(self):
        self.assertUsageError(["--upstream", "ftp://127.0.0.1:21", "-t"], "upstream",
                              "ftp://127.0.0.1:21")

    def test_unknown_log_format(self):
        self.assertUsageError(["--log-format", "xml", "-t"], "--log-format")

    def test_t_checks_the_store_url(self):
        self.assertUsageError(["--store", "nosuchstore://x", "-t"], "store")

    def test_unknown_store_scheme(self):
        # without -t, in case the URL is only looked at when the store opens
        lp, ap = h.free_ports(2)
        self.assertUsageError(["--store", "nosuchstore://x", "--listen", "127.0.0.1:%d" % lp,
                               "--admin", "127.0.0.1:%d" % ap], "store")

    def test_stray_argument(self):
        self.assertUsageError(["stray", "-t"], "stray")


class BadConfig(Cli):
    def assertConfigError(self, text, line, key):
        path = self.write(text)
        msg = self.assertUsageError(["--config", path, "-t"], "idem.yaml", key)
        self.assertRegex(msg, r"(:%d\b|line %d\b)" % (line, line),
                         "line %d not named: %r" % (line, msg))

    def test_missing_file(self):
        path = os.path.join(self.tmp, "nope.yaml")
        self.assertUsageError(["--config", path, "-t"], "nope.yaml")

    def test_unknown_top_level_key(self):
        self.assertConfigError("workers: 1\n\nlisten_addr: 127.0.0.1:1\n", 3, "listen_addr")

    def test_unknown_key_in_defaults(self):
        self.assertConfigError("defaults:\n  lease: 1s\n  leese: 2s\n", 3, "leese")

    def test_bad_duration(self):
        self.assertConfigError("defaults:\n  key_ttl: 1h\n  lease: 3x\n", 3, "lease")

    def test_bad_size(self):
        self.assertConfigError("max_request_bytes: 10XB\n", 1, "max_request_bytes")

    def test_bad_enum(self):
        self.assertConfigError("defaults:\n  on_conflict: maybe\n", 2, "on_conflict")

    def test_bad_on_store_error(self):
        self.assertConfigError("upstream_timeout: 1s\non_store_error: sometimes\n", 2,
                               "on_store_error")

    def test_bad_route_mode(self):
        self.assertConfigError("routes:\n  - methods: [POST]\n    path: /\n    mode: always\n",
                               4, "mode")

    def test_unknown_key_in_a_route(self):
        self.assertConfigError("routes:\n  - methods: [POST]\n    path: /\n    colour: red\n",
                               4, "colour")

    def test_bad_release_status(self):
        self.assertConfigError("defaults:\n  release_statuses: [429, teapot]\n", 2,
                               "release_statuses")

    def test_bad_listen(self):
        self.assertConfigError("workers: 1\nlisten: nonsense\n", 2, "listen")

    def test_bad_upstream(self):
        self.assertConfigError("upstream: ftp://127.0.0.1:21\n", 1, "upstream")

    def test_bad_workers(self):
        self.assertConfigError("workers: many\n", 1, "workers")

    def test_yaml_syntax_error(self):
        path = self.write("defaults:\n  lease: 1s\n   key_ttl: [unclosed\n")
        self.assertUsageError(["--config", path, "-t"], "idem.yaml")


class Overrides(Cli):
    def test_flags_override_the_file(self):
        up = self.start_upstream()
        dead = "http://127.0.0.1:%d" % h.dead_port()
        # the file names a dead upstream and other ports; the flags win
        d = self.make_idemd(up, {"upstream": dead, "listen": "127.0.0.1:%d" % h.free_port(),
                                 "admin": "127.0.0.1:%d" % h.free_port()})
        d.start()
        r = d.post(key=h.new_key())
        self.assertEqual(r.status, 200, r)
        self.assertEqual(up.count(), 1)

    def test_config_file_alone_is_enough(self):
        up = self.start_upstream()
        d = self.make_idemd(up, {"defaults": {"lease": "5s"}}, use_flags=False)
        d.start()
        k = h.new_key()
        first = d.post(key=k)
        self.assertEqual(first.status, 200)
        self.assertReplayOf(d.post(key=k), first)
        self.assertEqual(up.count(), 1)

    def test_default_store_is_idem_data_in_the_working_directory(self):
        up = self.start_upstream()
        d = self.make_idemd(up, {}, store=False)
        d.start()
        self.assertEqual(d.post(key=h.new_key()).status, 200)
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "idem-data")),
                        os.listdir(self.tmp))

    def test_size_without_unit_is_bytes(self):
        up, d = self.setup_pair({"max_request_bytes": 512})
        self.assertEqual(d.post(key=h.new_key(), body=b"x" * 512).status, 200)
        self.assertEqual(d.post(key=h.new_key(), body=b"x" * 513).status, 413)

    def test_several_workers_serve_and_share_keys(self):
        up = self.start_upstream()
        d = self.start_idemd(up, {}, extra_args=["--workers", "4"])
        keys = [h.new_key() for _ in range(20)]
        firsts = [d.post(key=k) for k in keys]
        for k, f in zip(keys, firsts):
            self.assertReplayOf(d.post(key=k), f)
        self.assertEqual(up.count(), 20)


class Logging(Cli):
    def test_json_log_lines_are_json_objects(self):
        up = self.start_upstream()
        d = self.start_idemd(up, {}, log_format="json")
        d.post(key=h.new_key())
        d.post()  # an error too
        self.assertEqual(d.stop(), 0)
        lines = [line for line in d.log_text().splitlines() if line.strip()]
        self.assertTrue(lines, "json logging wrote nothing")
        for line in lines:
            if line.startswith("=="):  # a sanitizer's report is not a log line
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                self.fail("not a JSON log line: %r" % line)
            self.assertIsInstance(obj, dict, line)

    def test_text_log_is_not_json(self):
        up = self.start_upstream()
        d = self.start_idemd(up, {}, log_format="text")
        d.post(key=h.new_key())
        self.assertEqual(d.stop(), 0)
        lines = [line for line in d.log_text().splitlines() if line.strip()]
        self.assertTrue(lines, "text logging wrote nothing")
        self.assertFalse(lines[0].startswith("{"), lines[0])


class Signals(Cli):
    def test_sigint_exits_0(self):
        up, d = self.setup_pair()
        d.post(key=h.new_key())
        self.assertEqual(d.stop(signal.SIGINT), 0)

    def test_sigterm_exits_0(self):
        up, d = self.setup_pair()
        d.post(key=h.new_key())
        t0 = time.monotonic()
        self.assertEqual(d.stop(signal.SIGTERM), 0)
        self.assertLess(time.monotonic() - t0, 5.0)


if __name__ == "__main__":
    unittest.main()
