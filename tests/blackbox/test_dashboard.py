"""The Grafana dashboard (docs/grafana-idemd.json) against what idemd exports.

Every metric name a query of the dashboard uses (panel targets and template
variables) must be:

  documented  a row of the metric table in docs/admin.md ("## Metrics"),
              and
  exported    in the /metrics of a running idemd (LMDB, after a keyed
              request and a sweeper round, so the store's room is known),
              unless its row in docs/admin.md says it is "absent" at times
              (a gauge only some stores can give): such a metric must then
              still be a documented one.

A histogram's series (_bucket, _sum, _count) count as the histogram.  So a
metric renamed or removed from idemd, or a typo in the dashboard, fails
here rather than as an empty panel in production.
"""

import json
import os
import re
import unittest

try:
    from . import harness as h
except ImportError:
    import harness as h

DASHBOARD = h.REPO / "docs" / "grafana-idemd.json"
ADMIN_DOC = h.REPO / "docs" / "admin.md"
NAME = re.compile(r"\bidem_[a-zA-Z0-9_]+")


def dashboard_exprs(node):
    """Every query string of the dashboard: targets' expr, and template
    variables' query and definition."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                out.append(v)
            elif k == "query" and isinstance(v, str):
                out.append(v)
            else:
                out.extend(dashboard_exprs(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(dashboard_exprs(v))
    return out


def documented_metrics():
    """name -> the text of its row, from the table under "## Metrics"."""
    text = ADMIN_DOC.read_text()
    start = text.index("## Metrics")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `idem_"):
            continue
        cell = line.split("|")[1]
        for name in re.findall(r"`(idem_[a-zA-Z0-9_]+)", cell):
            rows[name] = line
    return rows


class Dashboard(h.IdemTestCase):

    def test_dashboard_is_grafana_json(self):
        d = json.loads(DASHBOARD.read_text())
        self.assertIn("panels", d)
        self.assertTrue(d["title"])
        ids = [p["id"] for p in d["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids repeat")
        for p in d["panels"]:
            if p["type"] == "row":
                continue
            self.assertTrue(p.get("targets"), p["title"])
            for t in p["targets"]:
                self.assertTrue(t["expr"].strip(), p["title"])

    def test_every_metric_the_dashboard_queries_is_exported(self):
        names = set()
        for e in dashboard_exprs(json.loads(DASHBOARD.read_text())):
            names.update(NAME.findall(e))
        self.assertGreater(len(names), 10, "the dashboard queries hardly anything")

        up, d = self.setup_pair()
        self.assertEqual(d.post(key=h.new_key("dash")).status, 200)
        h.wait_until(lambda: h.metric_sum(d.metrics(), "idem_sweep_rounds_total") >= 1, 30,
                     what="a sweeper round")
        m = d.metrics()
        types = m["types"]
        exported = {n for n, _, _ in m["samples"]} | set(types)

        def family(name):
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[:-len(suffix)]
                if name.endswith(suffix) and types.get(base) == "histogram":
                    return base
            return name

        docs = documented_metrics()
        problems = []
        for name in sorted(names):
            fam = family(name)
            row = docs.get(fam)
            if row is None:
                problems.append("%s: not in docs/admin.md's metric table" % name)
            elif name not in exported and fam not in exported and "absent" not in row:
                problems.append("%s: not in /metrics (and docs/admin.md does not say it is "
                                "absent at times)" % name)
        self.assertEqual(problems, [])


if __name__ == "__main__":
    unittest.main()
