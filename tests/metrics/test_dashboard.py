"""deploy/grafana/hicached.json: valid dashboard JSON whose PromQL is well
formed and uses only series a real hicached exports -- every metric name,
every label a selector names and every exact label value it matches is
checked against a scrape of a daemon that ran real RPCs."""

import json
import os
import re
import tempfile
import unittest

import hicache
from metrics_fixture import MetricsDaemon

FUNCTIONS = {"sum", "rate", "histogram_quantile", "topk", "by", "without", "ignoring",
             "on", "label_values", "max", "min", "avg", "increase", "irate", "count"}
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^{}]*)\}")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


def exprs(dashboard):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def check_balanced(expr):
    """Raises AssertionError unless brackets nest and strings close."""
    stack, pairs, in_string = [], {")": "(", "}": "{", "]": "["}, False
    i = 0
    while i < len(expr):
        c = expr[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "({[":
            stack.append(c)
        elif c in ")}]":
            assert stack and stack.pop() == pairs[c], f"unbalanced {c!r} in {expr}"
        i += 1
    assert not in_string, f"unclosed string in {expr}"
    assert not stack, f"unclosed {stack} in {expr}"


class DashboardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.environ["HICACHE_DASHBOARD"]) as f:
            cls.dashboard = json.load(f)
        # --state_dir: the journal and hot-restart series exist (as under the
        # packaged flagfile).
        cls.state_dir = tempfile.mkdtemp()
        daemon = MetricsDaemon("--cp_size=2", "--page_size=4", "--kv_preset=tiny-draft",
                               "--device_pages_per_rank=16", "--host_pages_per_rank=32",
                               f"--state_dir={cls.state_dir}")
        try:
            with hicache.Client(daemon.socket) as client, \
                    client.session("dashboard", namespace="dash") as s, \
                    s.backup_stream() as stream:
                tokens = list(range(100, 112))
                pages = s.allocate(num_pages=3, mode="zigzag")
                (backup,) = stream.prepare([(pages, len(tokens))])
                for step in range(3):
                    stream.layer_stored([backup], step)
                s.insert(tokens, pages, backup_id=backup)
                stream.wait_committed(backup)
                client.evict(device_pages_per_lane=[15, 15])
                loaded = s.load_back(tokens)
                s.unlock([loaded.node])
                s.match([tokens])
                cls.scrape = daemon.scrape_text()
        finally:
            assert daemon.stop() == 0
        cls.scrape += "\n" + cls.group_scrapes()
        cls.labels = {}  # metric name -> {label: {values}}
        for line in cls.scrape.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ", line)
            labels = cls.labels.setdefault(m.group(1), {})
            for name, _, val in MATCHER.findall(m.group(3) or ""):
                labels.setdefault(name, set()).add(val)

    @staticmethod
    def group_scrapes():
        """Scrapes of a CP group of two daemons (the leader with rank 0, a
        follower with rank 1): the CP group panels' series exist only there."""
        flags = ("--cp_size=2", "--page_size=4", "--kv_preset=tiny-draft",
                 "--device_pages_per_rank=16", "--host_pages_per_rank=32",
                 "--cp_group=dash", "--cp_group_bind=127.0.0.1", "--insecure_tcp_for_testing")
        leader = MetricsDaemon(*flags, "--ranks=0", "--cp_group_member=leader",
                               "--listen_tcp=127.0.0.1:0", "--cp_group_digest_interval_ms=20")
        follower = None
        try:
            found = re.search(r"CP group dash: leading on (\S+)", leader.stderr())
            assert found, leader.stderr()
            follower = MetricsDaemon(*flags, "--ranks=1", "--cp_group_member=follower",
                                     f"--cp_group_leader={found.group(1)}")
            # The leader reports a member's data path once it has joined, and
            # the age of its last matched digest once one has matched.
            wanted = "hicache_cp_group_last_digest_match_age_seconds"
            samples = leader.scrape_until(lambda s: any(name == wanted for name, _ in s),
                                          timeout=60)
            assert any(name == wanted for name, _ in samples), leader.stderr()
            return leader.scrape_text() + "\n" + follower.scrape_text()
        finally:
            if follower is not None:
                assert follower.stop() == 0
            assert leader.stop() == 0

    def test_dashboard_structure(self):
        d = self.dashboard
        self.assertEqual(d["uid"], "hicached")
        self.assertTrue(d["title"])
        ids = [p["id"] for p in d["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        titles = " ".join(p["title"] for p in d["panels"]).lower()
        for topic in ("hit rate", "latency", "occupancy", "throughput", "failures",
                      "layer", "sessions", "journal", "hot restart", "cp group"):
            self.assertIn(topic, titles)
        for panel in d["panels"]:
            pos = panel["gridPos"]
            self.assertLessEqual(pos["x"] + pos["w"], 24, panel["title"])
            if panel["type"] == "row":
                continue
            self.assertTrue(panel["targets"], panel["title"])
            refs = [t["refId"] for t in panel["targets"]]
            self.assertEqual(len(refs), len(set(refs)), panel["title"])
        names = {v["name"] for v in d["templating"]["list"]}
        self.assertEqual(names, {"datasource", "instance"})

    def test_promql_is_well_formed(self):
        count = 0
        for title, expr in exprs(self.dashboard):
            count += 1
            check_balanced(expr)
            for metric, body in SELECTOR.findall(expr):
                self.assertEqual(MATCHER.sub("", body).replace(",", "").strip(), "",
                                 f"{title}: bad matchers {{{body}}}")
            for ident in IDENT.findall(re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
                if ident.startswith("hicache_") or ident in FUNCTIONS:
                    continue
                # Otherwise a label name in by (...) or a matcher, or le.
                self.assertRegex(ident, r"^[a-z_]+$", f"{title}: {ident}")
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
                for label in group.split(","):
                    self.assertRegex(label.strip(), r"^[a-zA-Z_][a-zA-Z0-9_]*$", expr)
            for window in re.findall(r"\[([^\]]*)\]", expr):
                self.assertIn(window, ("$__rate_interval", "5m", "1m"), expr)
        self.assertGreater(count, 20)

    def test_every_metric_label_and_value_is_exported(self):
        used = set()
        for title, expr in exprs(self.dashboard):
            stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
            for name in re.findall(r"\bhicache_[a-zA-Z0-9_]+", stripped):
                used.add(name)
                self.assertIn(name, self.labels, f"{title}: {name} is not exported")
            for metric, body in SELECTOR.findall(expr):
                exported = self.labels.get(metric, {})
                for label, op, val in MATCHER.findall(body):
                    if label == "instance":  # Added by Prometheus.
                        continue
                    self.assertIn(label, exported, f"{title}: {metric} has no label {label}")
                    if op in ("=", "!="):
                        self.assertIn(val, exported[label], f"{title}: {metric}{{{label}={val}}}")
        for query in re.findall(r"label_values\((\w+)", json.dumps(self.dashboard["templating"])):
            self.assertIn(query, self.labels)
        self.assertGreater(len(used), 25)


if __name__ == "__main__":
    unittest.main()
