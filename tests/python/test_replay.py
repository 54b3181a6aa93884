"""hicache-replay over gRPC against real daemons (API v1.1: Admit before and
Complete after each request): the CLI works, writes CSV, gives the same hit
rates as the in-process engine replay (bench/replay) with the same
capacities and policies, honours each write policy, and never leaves a page
or a lock held -- also when inserts are deferred and retried or given up,
and when backups complete late (--backup-lag: slow transfers). With
--deterministic two runs against fresh daemons give the same counts."""

import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import hicache
from daemon_fixture import Daemon

L1_BLOCKS, L2_BLOCKS = 300, 600


def run_replay(socket, *args, check=True):
    return subprocess.run(
        [sys.executable, "-m", "hicache.replay", "--socket", socket, *args],
        check=check, capture_output=True, text=True)


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
        return run_replay(self.daemon.socket, "--trace", self.trace, *extra).stdout

    def test_matches_the_in_process_replay(self):
        summary = json.loads(self.replay("--json"))
        self.assertEqual(summary["requests"], 300)
        self.assertEqual(summary["workload"], "mooncake")
        self.assertEqual(summary["write_policy"], "write_through")
        engine = subprocess.run(
            [os.environ["HICACHE_REPLAY_BIN"], f"--trace={self.trace}",
             f"--l1_blocks={L1_BLOCKS}", f"--l2_blocks={L2_BLOCKS}", "--policies=lru",
             "--write_policies=write_through"],
            check=True, capture_output=True, text=True).stdout
        row = re.search(r"^write_through\s+lru\s+([\d.]+)%\s+([\d.]+)%", engine, re.M)
        self.assertIsNotNone(row, engine)
        l1, l12 = float(row.group(1)), float(row.group(2))
        # Backups complete asynchronously in both, so allow a small spread.
        self.assertAlmostEqual(100 * summary["l1_hit_rate"], l1, delta=1.5)
        self.assertAlmostEqual(100 * summary["l1_l2_hit_rate"], l12, delta=1.5)
        self.assertGreater(summary["loads"], 0)
        self.assertGreater(summary["device_evicted_pages"], 0)
        self.assertGreater(summary["backups_prepared"], 0)
        for rpc in ("Admit", "Complete", "LoadBack", "Allocate"):
            self.assertGreater(summary["latency_us"][rpc]["count"], 0, rpc)
        self.assertEqual(summary["latency_us"]["Admit"]["count"], 300)
        request = summary["request_latency_us"]
        self.assertEqual(request["count"], 300)
        self.assertGreater(request["p50"], 0)
        self.assertGreaterEqual(request["p99"], request["p50"])
        self.assertEqual(summary["held_pages_at_end"], 0)
        self.assertEqual(summary["held_locks_at_end"], 0)
        self.assertEqual(summary["stream_errors"], 0)

    def test_kv_event_overhead_report(self):
        """bench/replay --kv_events: runs without and with KV events side by
        side, a subscriber in its own process, and reports what it measured
        (what the subscriber got depends on when it joined: not asserted)."""
        out = subprocess.run(
            [os.environ["HICACHE_REPLAY_BIN"], f"--trace={self.trace}",
             f"--l1_blocks={L1_BLOCKS}", f"--l2_blocks={L2_BLOCKS}",
             "--policies=tinylfu", "--kv_events", "--kv_events_runs=2",
             "--kv_events_block_size=64"],
            check=True, capture_output=True, text=True).stdout
        rates = re.search(r"kv events \(blocks of 64\): (\d+) req/s without, "
                          r"(\d+) with \(medians of 2\)", out)
        self.assertIsNotNone(rates, out)
        self.assertGreater(int(rates.group(1)), 0)
        self.assertGreater(int(rates.group(2)), 0)
        cpu = re.search(r"the requests' thread ([\d.]+) us without, ([\d.]+) "
                        r"with", out)
        self.assertIsNotNone(cpu, out)
        self.assertGreater(float(cpu.group(1)), 0)
        sent = re.search(r"published (\d+) events \((\d+) blocks\) in (\d+) "
                         r"batches, (\d+) dropped; the subscriber received "
                         r"(\d+) batches", out)
        self.assertIsNotNone(sent, out)
        events, blocks, batches, dropped, received = map(int, sent.groups())
        self.assertGreater(events, 0)
        self.assertGreaterEqual(blocks, events - batches)
        self.assertEqual(dropped, 0)
        self.assertLessEqual(received, batches)

    def test_human_report_and_csv(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "series.csv")
            report = self.replay("--requests", "50", "--window-s", "5", "--csv", path)
            self.assertIn("L1+L2 hit rate", report)
            self.assertIn("latency (us)", report)
            self.assertRegex(report, r"request latency \(us\): p50 [\d.]+, p99 [\d.]+")
            self.assertIn("held at the end: 0 pages, 0 locks", report)
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

    def test_deterministic_report(self):
        report = self.replay("--requests", "40", "--deterministic")
        self.assertIn("(write_through, deterministic)", report)
        self.assertRegex(report, r"waited for backups to settle \d+ times .*; timeouts 0")
        summary = json.loads(self.replay("--requests", "40", "--deterministic", "--json"))
        self.assertTrue(summary["deterministic"])
        self.assertIsNone(summary["seed"])  # A trace has no randomness.
        self.assertEqual(summary["settle_timeouts"], 0)
        # Settled at the end: every backup prepared has committed.
        self.assertGreaterEqual(summary["backups"], summary["backups_prepared"])
        self.assertEqual(summary["held_pages_at_end"], 0)

    def test_bad_trace_is_a_clear_error(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
            f.write('{"timestamp": 0}\n')
            f.flush()
            result = run_replay(self.daemon.socket, "--trace", f.name, check=False)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn(":1: not a Mooncake trace record", result.stderr)

    def test_entry_point(self):
        result = subprocess.run(
            [sys.executable, "client/python/hicache-replay", "--socket", self.daemon.socket,
             "--conversations", "4", "--requests", "20", "--json"],
            check=True, capture_output=True, text=True)
        self.assertEqual(json.loads(result.stdout)["requests"], 20)


# Small enough that conversations evict (device) and write back (host).
CONVERSATION_DAEMON = ("--page_size=16", "--kv_preset=tiny", "--device_pages_per_rank=400",
                       "--host_pages_per_rank=1200", "--eviction_policy=lru")
CONVERSATIONS = ("--conversations", "12", "--requests", "300", "--system-tokens", "512",
                 "--user-tokens", "96", "--output-tokens", "48", "--turns", "6", "--json")
# A slow transfer backend: one copy thread, and every backup's layers stored
# 64 requests late (copies still in flight while later requests run).
SLOW_DAEMON = CONVERSATION_DAEMON + ("--transfer_workers=1",)
SLOW = ("--backup-lag", "64")
# Summary fields that vary from run to run even when the cache does not.
TIMING_FIELDS = ("latency_us", "request_latency_us", "settle_wait_us")


class ConversationReplayTest(unittest.TestCase):
    """The multi-turn workload against a daemon per write policy."""

    def run_policy(self, policy, *extra, daemon_flags=CONVERSATION_DAEMON,
                   workload=CONVERSATIONS):
        daemon = Daemon(*daemon_flags, f"--write_policy={policy}")
        try:
            summary = json.loads(run_replay(daemon.socket, *workload, *extra).stdout)
            with hicache.Client(daemon.socket) as client:
                stats = client.stats()
                self.assertEqual(stats.session_pages, 0)
                self.assertEqual(stats.session_locks, 0)
                self.assertEqual(stats.sessions, 0)
        finally:
            self.assertEqual(daemon.stop(), 0)
        self.assertEqual(summary["workload"], "conversations")
        self.assertEqual(summary["write_policy"], policy)
        requests = int(workload[workload.index("--requests") + 1])
        self.assertEqual(summary["requests"], requests)
        self.assertEqual(summary["request_latency_us"]["count"], requests)
        self.assertGreaterEqual(summary["request_latency_us"]["p99"],
                                summary["request_latency_us"]["p50"])
        # Nothing leaked: no page or lock of the replay's session was held
        # after its last request, nor after it closed.
        self.assertEqual(summary["held_pages_at_end"], 0)
        self.assertEqual(summary["held_locks_at_end"], 0)
        self.assertEqual(summary["pages_after_close"], 0)
        self.assertEqual(summary["stream_errors"], 0)
        self.assertEqual(summary["backups_attached"], summary["backups_prepared"])
        self.assertGreater(summary["device_evicted_pages"], 0)
        return summary

    def test_write_through_backs_up_every_new_input(self):
        s = self.run_policy("write_through")
        self.assertEqual(s["not_admitted"], 0)
        # Turns extend their conversation and share the system prompt.
        self.assertGreater(s["l1_hit_rate"], 0.5)
        self.assertGreater(s["backups_prepared"], 250)
        self.assertEqual(s["backups_attached"], s["backups_prepared"])
        self.assertGreaterEqual(s["backups"], s["backups_prepared"])
        self.assertEqual(s["backups_rolled_back"], 0)
        # The daemon's own backups (write-through at hits) can still defer
        # an insert now and then; the retry completes it.
        self.assertEqual(s["deferred_gave_up"], 0)

    def test_write_back_prepares_no_backup(self):
        s = self.run_policy("write_back")
        self.assertEqual(s["backups_prepared"], 0)
        self.assertNotIn("BackupPrepare", s["latency_us"])
        # The daemon writes back what it evicts; those come back as loads.
        self.assertGreater(s["backups"], 0)
        self.assertGreater(s["loads"], 0)
        self.assertGreater(s["l1_l2_hit_rate"], s["l1_hit_rate"])

    def test_write_through_selective_prepares_no_backup(self):
        s = self.run_policy("write_through_selective")
        self.assertEqual(s["backups_prepared"], 0)
        self.assertNotIn("BackupPrepare", s["latency_us"])

    def test_a_pool_too_small_for_some_requests(self):
        # 120 pages of 16 tokens: long turns cannot be admitted at all
        # (not a failure of the replay), the rest load back what was
        # evicted to host; a load that misses prepares no backup.
        s = self.run_policy(
            "write_through",
            daemon_flags=("--page_size=16", "--kv_preset=tiny", "--device_pages_per_rank=120",
                          "--host_pages_per_rank=400", "--eviction_policy=lru"),
            workload=("--conversations", "8", "--requests", "200", "--system-tokens", "512",
                      "--user-tokens", "200", "--output-tokens", "100", "--turns", "10",
                      "--json"))
        self.assertGreater(s["not_admitted"], 0)
        self.assertGreater(s["loads"], 0)
        self.assertGreater(s["backups_prepared"], 0)
        self.assertIn("LoadBack", s["latency_us"])
        self.assertIn("BackupPrepare", s["latency_us"])

    def test_deferred_inserts_are_retried(self):
        # Layers stored 4 requests late: a turn often arrives while its
        # previous turn's backup is still in flight, and its insert defers.
        s = self.run_policy("write_through", "--backup-lag", "4")
        self.assertGreater(s["deferred_inserts"], 0)
        self.assertEqual(s["deferred_then_completed"], s["deferred_inserts"])
        self.assertEqual(s["deferred_gave_up"], 0)

    def assert_deterministic(self, policy, *extra, daemon_flags=CONVERSATION_DAEMON):
        """Two --deterministic replays against fresh daemons: the same
        counts (hits, backups, loads, evictions, deferrals), field by field.
        Returns the summary."""
        runs = []
        for _ in range(2):
            s = self.run_policy(policy, "--deterministic", *extra, daemon_flags=daemon_flags)
            self.assertTrue(s["deterministic"])
            self.assertEqual(s["seed"], 1)
            self.assertEqual(s["settle_timeouts"], 0)
            for field in TIMING_FIELDS:
                self.assertIn(field, s)
                del s[field]
            runs.append(s)
        self.assertEqual(runs[0], runs[1])
        return runs[0]

    def test_deterministic_write_through(self):
        s = self.assert_deterministic("write_through")
        # Every backup settles before the next call: each one commits, none
        # is in flight when a turn extends its node, so nothing defers.
        self.assertGreater(s["backups_prepared"], 250)
        self.assertEqual(s["deferred_inserts"], 0)
        # Every backup prepared committed (as did the daemon's own).
        self.assertGreaterEqual(s["backups"], s["backups_prepared"])
        self.assertEqual(s["backups_rolled_back"], 0)
        self.assertGreater(s["loads"], 0)

    def test_deterministic_write_back(self):
        s = self.assert_deterministic("write_back")
        self.assertEqual(s["backups_prepared"], 0)
        self.assertGreater(s["backups"], 0)  # Write-backs of eviction victims.
        self.assertGreater(s["loads"], 0)
        self.assertGreater(s["host_evicted_pages"], 0)

    def test_slow_transfers_leak_nothing(self):
        # Without --deterministic: a turn's insert often defers behind its
        # previous turn's backup; every deferred insert completes on retry.
        s = self.run_policy("write_through", *SLOW, daemon_flags=SLOW_DAEMON)
        self.assertGreater(s["deferred_inserts"], 10)
        self.assertEqual(s["deferred_then_completed"], s["deferred_inserts"])
        self.assertEqual(s["deferred_gave_up"], 0)
        self.assertEqual(s["backups_rolled_back"], 0)
        # --deterministic: the same, run after run; once the lagging layers
        # are stored and the backups settled, the first retry completes.
        s = self.assert_deterministic("write_through", *SLOW, daemon_flags=SLOW_DAEMON)
        self.assertGreater(s["deferred_inserts"], 10)
        self.assertEqual(s["defer_retries"], s["deferred_inserts"])
        self.assertEqual(s["deferred_then_completed"], s["deferred_inserts"])
        self.assertEqual(s["deferred_gave_up"], 0)
        # run_policy asserted held_pages_at_end == held_locks_at_end == 0.

    def test_slow_transfers_given_up_free_everything(self):
        # No retry: every deferred insert gives up, and frees its pages,
        # rolls back its backup and releases its locks -- nothing stays held.
        for mode in ((), ("--deterministic",)):
            with self.subTest(mode=mode):
                s = self.run_policy("write_through", *SLOW, "--defer-retries", "0", *mode,
                                    daemon_flags=SLOW_DAEMON)
                self.assertGreater(s["deferred_inserts"], 10)
                self.assertEqual(s["deferred_gave_up"], s["deferred_inserts"])
                self.assertEqual(s["deferred_then_completed"], 0)
                self.assertEqual(s["held_pages_at_end"], 0)
                self.assertEqual(s["held_locks_at_end"], 0)

    def test_deferred_inserts_given_up_free_everything(self):
        s = self.run_policy("write_through", "--backup-lag", "4", "--defer-retries", "0")
        self.assertGreater(s["deferred_inserts"], 0)
        self.assertEqual(s["deferred_gave_up"], s["deferred_inserts"])
        self.assertEqual(s["deferred_then_completed"], 0)


if __name__ == "__main__":
    unittest.main()
