"""/metrics of a real hicached (CP = 2, P = 4) over real HTTP: the exposition
parses, and RPC counts and latencies (per method and code), hit tokens per
tier, backups, loads, layer timings, pools, sessions, streams and namespaces
move with real RPCs. A bad --metrics_address exits 2, a port in use exits 1,
and hostile clients cannot create series (method names, namespaces)."""

import os
import socket
import subprocess
import tempfile
import time
import unittest

import grpc

import hicache
from metrics_fixture import MetricsDaemon, http_get, parse, total, value

HICACHE = "hicache.v1.HiCache"


def rpcs(samples, method, code):
    return value(samples, "hicache_rpcs_total", service=HICACHE, method=method, code=code)


class MetricsDaemonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = MetricsDaemon("--cp_size=2", "--page_size=4", "--kv_preset=tiny-draft",
                                   "--device_pages_per_rank=16", "--host_pages_per_rank=32")
        cls.client = hicache.Client(cls.daemon.socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.daemon.stop() == 0

    def test_exposition_parses_and_other_paths_are_404(self):
        status, text = http_get(self.daemon.port, "/metrics")
        self.assertEqual(status, 200)
        samples, types = parse(text)
        lines = [l for l in text.splitlines() if l and not l.startswith("#")]
        self.assertEqual(len(lines), len(samples), "duplicate series")
        for (name, _), _ in samples.items():
            family = name
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name[:-len(suffix)] in types:
                    family = name[:-len(suffix)]
            self.assertIn(family, types, name)
            if name.startswith("hicache_") and types[family] == "counter":
                self.assertTrue(name.endswith("_total"), name)
        self.assertEqual(total(samples, "hicache_build_info", backend="cpu"), 1.0)
        self.assertEqual(value(samples, "hicache_page_tokens"), 4.0)
        # Both lanes and both ranks, with the reserved page 0 excluded.
        for lane in ("0", "1"):
            self.assertEqual(total(samples, "hicache_device_pages", lane=lane), 15.0)
            self.assertEqual(total(samples, "hicache_host_pages", rank=lane), 32.0)
        self.assertEqual(http_get(self.daemon.port, "/nothing")[0], 404)

    def test_rpc_counts_latency_and_error_codes(self):
        before, _ = self.daemon.scrape()
        with self.client.session("metrics-rpc") as s:
            s.match([[1, 2, 3, 4]])
            with self.assertRaises(hicache.HiCacheError) as bad:
                s.match([[1, 2, 3, 4]] * 5000)  # Over --max_items_per_request.
            self.assertEqual(bad.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        after, _ = self.daemon.scrape()
        self.assertEqual(rpcs(after, "MatchPrefix", "OK") - rpcs(before, "MatchPrefix", "OK"), 1)
        self.assertEqual(rpcs(after, "MatchPrefix", "INVALID_ARGUMENT")
                         - rpcs(before, "MatchPrefix", "INVALID_ARGUMENT"), 1)
        self.assertGreaterEqual(rpcs(after, "OpenSession", "OK")
                                - rpcs(before, "OpenSession", "OK"), 1)
        self.assertGreaterEqual(rpcs(after, "CloseSession", "OK")
                                - rpcs(before, "CloseSession", "OK"), 1)
        labels = dict(service=HICACHE, method="MatchPrefix", code="OK")
        count = value(after, "hicache_rpc_duration_seconds_count", **labels)
        self.assertEqual(count, rpcs(after, "MatchPrefix", "OK"))
        self.assertGreater(value(after, "hicache_rpc_duration_seconds_sum", **labels), 0)
        self.assertEqual(value(after, "hicache_rpc_duration_seconds_bucket", le="+Inf", **labels),
                         count)
        self.assertEqual(value(after, "hicache_rpcs_in_flight", service=HICACHE,
                               method="MatchPrefix"), 0)
        # The health checks of the fixture are counted too.
        self.assertGreater(value(after, "hicache_rpcs_total", service="grpc.health.v1.Health",
                                 method="Check", code="OK"), 0)

    def test_hits_backups_loads_layers_sessions_and_streams(self):
        before, _ = self.daemon.scrape()
        tokens = list(range(500, 512))
        with self.client.session("metrics-cache", namespace="metrics-ns") as s, \
                s.backup_stream() as stream:
            pages = s.allocate(num_pages=3, mode="zigzag")
            (backup,) = stream.prepare([(pages, len(tokens))])
            self.assertNotEqual(backup, 0)
            # The stream's first answer came back, so the daemon is serving
            # it (opening a stream does not wait for the server: scraping
            # before that was a race a sanitizer build lost).
            open_, _ = self.daemon.scrape()
            self.assertGreaterEqual(value(open_, "hicache_sessions", role="scheduler"), 1)
            self.assertGreaterEqual(value(open_, "hicache_rpcs_in_flight", service=HICACHE,
                                          method="BackupSession"), 1)
            for step in range(3):
                stream.layer_stored([backup], step)
            result = s.insert(tokens, pages, backup_id=backup)
            self.assertTrue(result.backup_attached)
            self.assertEqual(stream.wait_committed(backup), result.node)
            self.assertEqual(s.match([tokens])[0].device_tokens, 12)
            cached = self.daemon.scrape_until(lambda samples: value(
                samples, "hicache_namespace_tokens", tenant="metrics-ns", tier="device") == 12)
            self.assertEqual(value(cached, "hicache_namespace_tokens", tenant="metrics-ns",
                                   tier="device"), 12)
            self.assertEqual(value(cached, "hicache_namespace_sessions", tenant="metrics-ns"), 1)
            self.client.evict(device_pages_per_lane=[15, 15])
            loaded = s.load_back(tokens)
            self.assertTrue(loaded.ok)
            self.assertEqual(loaded.loaded_tokens, 12)
            s.unlock([loaded.node])
        after, _ = self.daemon.scrape()

        def moved(name, **labels):
            return total(after, name, **labels) - total(before, name, **labels)

        self.assertGreaterEqual(moved("hicache_hit_tokens_total", tier="device"), 12)
        self.assertGreaterEqual(moved("hicache_hit_tokens_total", tier="host"), 12)
        self.assertGreaterEqual(moved("hicache_backups_started_total"), 1)
        self.assertGreaterEqual(moved("hicache_backups_committed_total"), 1)
        self.assertGreaterEqual(moved("hicache_loads_started_total"), 1)
        self.assertGreaterEqual(moved("hicache_loads_done_total"), 1)
        self.assertGreater(moved("hicache_transfer_bytes_total", direction="to_host"), 0)
        self.assertGreater(moved("hicache_transfer_bytes_total", direction="to_device"), 0)
        self.assertGreaterEqual(moved("hicache_evicted_pages_total", tier="device"), 3)
        # 3 layers x 2 ranks each way.
        self.assertGreaterEqual(moved("hicache_layer_copy_seconds_count", op="backup"), 6)
        self.assertGreaterEqual(moved("hicache_layer_copy_seconds_count", op="load"), 6)
        for layer in ("first", "last"):
            self.assertGreaterEqual(
                moved("hicache_layer_ready_seconds_count", op="load", layer=layer), 2)
        self.assertGreaterEqual(moved("hicache_layer_copies_total"), 12)
        self.assertEqual(moved("hicache_copy_failures_total"), 0)
        self.assertEqual(value(after, "hicache_sessions", role="scheduler"), 0)
        self.assertEqual(value(after, "hicache_session_streams", role="scheduler"), 0)
        self.assertEqual(value(after, "hicache_rpcs_in_flight", service=HICACHE,
                               method="BackupSession"), 0)
        self.assertGreaterEqual(rpcs(after, "BackupSession", "OK")
                                - rpcs(before, "BackupSession", "OK"), 1)

    def test_unknown_methods_create_no_series(self):
        with grpc.insecure_channel(f"unix:{self.daemon.socket}") as channel:
            for i in range(20):
                call = channel.unary_unary(f"/evil{i}.Service/Probe{i}")
                with self.assertRaises(grpc.RpcError) as e:
                    call(b"", timeout=5)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        text = self.daemon.scrape_text()
        self.assertNotIn("evil", text)
        self.assertNotIn("Probe", text)


class NamespaceCardinalityTest(unittest.TestCase):
    """A client that spreads over many namespaces gets the top 20 and one
    tenant="__other__" series; odd bytes are escaped."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = MetricsDaemon("--page_size=4", "--kv_preset=micro",
                                   "--device_pages_per_rank=4096", "--host_pages_per_rank=256")
        cls.client = hicache.Client(cls.daemon.socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.daemon.stop() == 0

    def test_top_namespaces_and_other(self):
        names = [f"tenant-{i:02d}" for i in range(40)] + ['odd"\\\n\u00e9', "__other__"]
        for i, ns in enumerate(names):
            with self.client.session("metrics-ns", namespace=ns) as s:
                # Larger inserts for the first namespaces: they are the top.
                tokens = list(range(1000 * i, 1000 * i + 4 * (60 - i)))
                pages = s.allocate(num_pages=len(tokens) // 4)
                s.insert(tokens, pages)
        samples = self.daemon.scrape_until(
            lambda samples: value(samples, "hicache_namespace_nodes", tenant="__other__")
            == len(names) - 20)
        series = {dict(labels)["tenant"]
                  for (name, labels) in samples if name == "hicache_namespace_tokens"}
        self.assertEqual(len(series), 21, sorted(series))
        self.assertIn("__other__", series)
        for i in range(20):
            self.assertIn(f"tenant-{i:02d}", series)
        self.assertEqual(value(samples, "hicache_namespaces"), len(names))
        for tier in ("device", "host"):
            self.assertEqual(total(samples, "hicache_namespace_tokens", tier=tier),
                             value(samples, "hicache_tree_tokens", tier=tier))
        self.assertEqual(value(samples, "hicache_namespace_nodes", tenant="__other__"),
                         len(names) - 20)

    def test_z_odd_bytes_are_escaped(self):  # After test_top_namespaces_and_other.
        raw = 'x"\\\ny\u00e9'
        # The daemon's escaping (printable ASCII kept, '\\' doubled, other bytes \xHH),
        # then the exposition format's (backslash, quote, newline).
        label = "".join("\\\\" if c == 0x5C else chr(c) if 0x20 <= c < 0x7F else f"\\x{c:02x}"
                        for c in raw.encode())
        exposed = label.replace("\\", "\\\\").replace('"', '\\"')
        expected = f'hicache_namespace_nodes{{tenant="{exposed}"}} 1'
        with self.client.session("metrics-odd", namespace=raw) as s:
            pages = s.allocate(num_pages=200)
            s.insert(list(range(5000, 5000 + 200 * 4)), pages)
            deadline = time.time() + 10
            text = self.daemon.scrape_text()
            while expected not in text and time.time() < deadline:
                time.sleep(0.1)
                text = self.daemon.scrape_text()
        self.assertIn(expected, text)
        parse(text)  # The raw newline did not split a line.


class ExitCodeTest(unittest.TestCase):
    def run_daemon(self, address):
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            return subprocess.run(
                [os.environ["HICACHED"], f"--socket={tmp}/d.sock",
                 f"--metrics_address={address}"],
                capture_output=True, text=True, timeout=60)

    def test_bad_address_is_a_configuration_error(self):
        for address in ("localhost:9464", "127.0.0.1", "127.0.0.1:65536", "127.0.0.1:x",
                        "[::1:9464", "1.2.3:80", ":9464"):
            result = self.run_daemon(address)
            self.assertEqual(result.returncode, 2, (address, result.stderr))
            self.assertIn("metrics_address", result.stderr)

    def test_port_in_use_fails_start(self):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            result = self.run_daemon(f"127.0.0.1:{port}")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn(f"cannot serve metrics on 127.0.0.1:{port}", result.stderr)


if __name__ == "__main__":
    unittest.main()
