"""hicache-replay over gRPC against a real daemon: the CLI works, writes CSV,
and gives the same hit rates as the in-process engine replay (bench/replay)
with the same capacities and policies."""

import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from daemon_fixture import Daemon

L1_BLOCKS, L2_BLOCKS = 300, 600


class ReplayTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("--page_size=64", "--kv_preset=micro",
                            f"--device_pages_per_rank={1 + L1_BLOCKS * 8}",
                            f"--host_pages_per_rank={L2_BLOCKS * 8}",
                            "--write_policy=write_through", "--eviction_policy=lru")
        cls.trace = os.environ["HICACHE_TEST_TRACE"]

    @classmethod
    def tearDownClass(cls):
        assert cls.daemon.stop() == 0

    def replay(self, *extra):
        out = subprocess.run(
            [sys.executable, "-m", "hicache.replay", "--socket", self.daemon.socket,
             "--trace", self.trace, *extra],
            check=True, capture_output=True, text=True)
        return out.stdout

    def test_matches_the_in_process_replay(self):
        summary = json.loads(self.replay("--json"))
        self.assertEqual(summary["requests"], 300)
        engine = subprocess.run(
            [os.environ["HICACHE_REPLAY_BIN"], f"--trace={self.trace}",
             f"--l1_blocks={L1_BLOCKS}", f"--l2_blocks={L2_BLOCKS}", "--policies=lru"],
            check=True, capture_output=True, text=True).stdout
        row = re.search(r"^lru\s+([\d.]+)%\s+([\d.]+)%", engine, re.M)
        self.assertIsNotNone(row, engine)
        l1, l12 = float(row.group(1)), float(row.group(2))
        # Backups complete asynchronously in both, so allow a small spread.
        self.assertAlmostEqual(100 * summary["l1_hit_rate"], l1, delta=1.5)
        self.assertAlmostEqual(100 * summary["l1_l2_hit_rate"], l12, delta=1.5)
        self.assertGreater(summary["loads"], 0)
        self.assertGreater(summary["device_evicted_pages"], 0)
        for rpc in ("LoadBack", "Allocate", "Insert"):
            self.assertGreater(summary["latency_us"][rpc]["count"], 0)

    def test_human_report_and_csv(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "series.csv")
            report = self.replay("--requests", "50", "--window-s", "5", "--csv", path)
            self.assertIn("L1+L2 hit rate", report)
            self.assertIn("latency (us)", report)
            with open(path) as f:
                rows = list(csv.DictReader(f))
            self.assertGreater(len(rows), 1)
            self.assertIn("l1_occupancy", rows[0])

    def test_plot(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hit-rate.png")
            self.replay("--requests", "60", "--window-s", "5", "--plot", path)
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_bad_trace_is_a_clear_error(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
            f.write('{"timestamp": 0}\n')
            f.flush()
            result = subprocess.run(
                [sys.executable, "-m", "hicache.replay", "--socket", self.daemon.socket,
                 "--trace", f.name], capture_output=True, text=True)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn(":1: not a Mooncake trace record", result.stderr)


if __name__ == "__main__":
    unittest.main()
