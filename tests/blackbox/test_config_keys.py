"""The documentation of idem.yaml against the table of keys idemd reads.

`idemd --list-config-keys` prints config.c's table of keys, one a line:
the dotted name ("listen", "defaults.key_ttl", "routes[].path",
"listen_tls.address"), what SIGHUP does ("yes", "restart", "partly"), the
default and a one-line doc.  This test fails when docs/configuration.md or
docs/man/idem.yaml.5.scd lacks a key of the table, documents a key the table
does not have, or (configuration.md) says otherwise than the table about
SIGHUP.  So a key added to config.c without its documentation, or taken out
of it with its documentation left behind, fails here.

docs/configuration.md: every table whose first column is "key" is a table
of keys; its heading says which mapping (see SECTIONS), and its "SIGHUP"
column says "yes", "restart" or "partly".  The man page: every entry
"*NAME:*" at the start of a line under TOP-LEVEL KEYS (nested keys written
"*listen_tls.address:*"), POLICY KEYS or ROUTES.
"""

import re
import subprocess
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

DOC = h.REPO / "docs" / "configuration.md"
MAN = h.REPO / "docs" / "man" / "idem.yaml.5.scd"

# heading of a table of keys in configuration.md -> prefix of its names
SECTIONS = [
    ("Top-level keys", ""),
    ("TLS: `listen_tls` and `upstream_tls`", ""),  # written dotted already
    ("`defaults`: the policy", "defaults."),
    ("`routes`", "routes[]."),
]
MAN_SECTIONS = {"TOP-LEVEL KEYS": "", "POLICY KEYS": "defaults.", "ROUTES": "routes[]."}
NAME = re.compile(r"^`([a-z_][a-z0-9_.]*)`$")


def table_keys():
    p = subprocess.run([h.IDEMD, "--list-config-keys"], capture_output=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise AssertionError("idemd --list-config-keys: exit %d: %s"
                             % (p.returncode, p.stderr.decode("utf-8", "replace")))
    keys = {}
    for line in p.stdout.decode("utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) != 4 or not all(fields):
            raise AssertionError("not NAME\\tSIGHUP\\tDEFAULT\\tDOC: %r" % line)
        keys[fields[0]] = fields[1]
    return keys


def cells(line):
    """The cells of a Markdown table row; "\\|" inside one is text."""
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)]


def doc_keys(text):
    """{dotted name: SIGHUP column} of configuration.md's tables of keys,
    and the problems found reading them."""
    found, problems = {}, []
    heading = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if not line.startswith("| key |"):
            i += 1
            continue
        header = cells(line)
        prefix = None
        for title, p in SECTIONS:
            if heading == title:
                prefix = p
        if prefix is None:
            problems.append("a table of keys under an unknown heading %r: add it to "
                            "SECTIONS" % heading)
            prefix = "?"
        if "SIGHUP" not in header:
            problems.append("the table of keys under %r has no SIGHUP column" % heading)
        col = header.index("SIGHUP") if "SIGHUP" in header else None
        i += 2  # the header and its separator
        while i < len(lines) and lines[i].startswith("|"):
            row = cells(lines[i])
            m = NAME.match(row[0])
            if m:
                name = prefix + m.group(1)
                if name in found:
                    problems.append("%s: documented twice" % name)
                found[name] = row[col] if col is not None and col < len(row) else None
            i += 1
    return found, problems


def man_keys(text):
    found = set()
    section = None
    for line in text.splitlines():
        if line.startswith("# "):
            section = line[2:].strip()
            continue
        m = re.match(r"^\*([a-z_][a-z0-9_.]*):\*", line)
        if m and section in MAN_SECTIONS:
            found.add(MAN_SECTIONS[section] + m.group(1))
    return found


class ConfigKeys(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.keys = table_keys()

    def test_the_table_lists_every_mapping(self):
        for name in ("listen", "defaults", "routes", "defaults.key_ttl", "routes[].path",
                     "listen_tls.address", "upstream_tls.verify"):
            self.assertIn(name, self.keys)
        self.assertEqual(set(self.keys.values()) - {"yes", "restart", "partly"}, set())
        for name in ("listen", "admin", "store", "workers", "listen_tls.address"):
            self.assertEqual(self.keys[name], "restart", name)
        for name in ("routes", "defaults.key_ttl", "jwt_keys", "log_format",
                     "listen_tls.cert_file"):
            self.assertEqual(self.keys[name], "yes", name)

    def test_configuration_md_documents_exactly_the_table(self):
        found, problems = doc_keys(DOC.read_text(encoding="utf-8"))
        self.assertEqual(problems, [])
        self.assertEqual(sorted(set(self.keys) - set(found)), [],
                         "keys of idemd that docs/configuration.md does not document")
        self.assertEqual(sorted(set(found) - set(self.keys)), [],
                         "keys docs/configuration.md documents that idemd does not have")
        wrong = {k: (found[k], self.keys[k]) for k in found
                 if k in self.keys and found[k] != self.keys[k]}
        self.assertEqual(wrong, {}, "SIGHUP column (docs, idemd) that differ")

    def test_the_man_page_documents_exactly_the_table(self):
        found = man_keys(MAN.read_text(encoding="utf-8"))
        self.assertEqual(sorted(set(self.keys) - found), [],
                         "keys of idemd that idem.yaml(5) does not document")
        self.assertEqual(sorted(found - set(self.keys)), [],
                         "keys idem.yaml(5) documents that idemd does not have")

    def test_the_readers_see_a_missing_and_an_extra_key(self):
        # the test's own parsers, on a document it makes: a check that finds
        # nothing because it reads nothing would pass every time
        doc = ("### Top-level keys\n\n| key | default | SIGHUP |\n|---|---|---|\n"
               "| `listen` | x | restart |\n| `no_such_key` | y | yes |\n\n"
               "### `routes`\n\n| key | default | SIGHUP |\n|---|---|---|\n"
               "| `path` | `a` \\| `b` | yes |\n| any key of `defaults` | | |\n")
        found, problems = doc_keys(doc)
        self.assertEqual(problems, [])
        self.assertEqual(found, {"listen": "restart", "no_such_key": "yes",
                                 "routes[].path": "yes"})
        man = "# TOP-LEVEL KEYS\n\n*listen:* _a_\n\tx\n\n# POLICY KEYS\n\n*lease:* _d_\n"
        self.assertEqual(man_keys(man), {"listen", "defaults.lease"})


if __name__ == "__main__":
    unittest.main()
