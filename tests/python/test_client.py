"""The Python client against a real hicached (CP = 2, P = 4)."""

import unittest

import grpc

import hicache
from daemon_fixture import Daemon


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("--cp_size=2", "--page_size=4", "--kv_preset=tiny-draft",
                            "--device_pages_per_rank=16", "--host_pages_per_rank=32",
                            "--default_lease_ms=800")
        cls.client = hicache.Client(cls.daemon.socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        assert cls.daemon.stop() == 0

    def test_health_and_layout(self):
        self.assertEqual(self.client.health(), "SERVING")
        layout = self.client.layout()
        self.assertEqual(layout.geometry.cp_size, 2)
        self.assertEqual(layout.num_steps, 3)
        self.assertEqual(len(layout.ranks), 2)
        self.assertEqual(layout.ranks[0].device.kind, "shm")

    def test_allocate_insert_match_and_namespaces(self):
        with self.client.session("py-a", namespace="tenant-a") as a, \
                self.client.session("py-b", namespace="tenant-b") as b:
            pages = a.allocate(owners=[0, 1])
            self.assertEqual([p % 2 for p in pages], [0, 1])
            inserted = a.insert(list(range(100, 108)), pages)
            self.assertFalse(inserted.deferred)
            self.assertEqual(inserted.cached_tokens, 8)
            hit = a.match([list(range(100, 108))])[0]
            self.assertEqual(hit.device_tokens, 8)
            self.assertEqual(hit.device_pages, pages)
            self.assertEqual(b.match([list(range(100, 108))])[0].device_tokens, 0)

    def test_backup_evict_and_load_back(self):
        tokens = list(range(500, 512))
        with self.client.session("py-backup") as s, s.backup_stream() as stream:
            pages = s.allocate(num_pages=3, mode="zigzag")
            (backup,) = stream.prepare([(pages, len(tokens))])
            self.assertNotEqual(backup, 0)
            for step in range(3):
                stream.layer_stored([backup], step)
            result = s.insert(tokens, pages, backup_id=backup)
            self.assertTrue(result.backup_attached)
            self.assertEqual(stream.wait_committed(backup), result.node)
            self.assertEqual(stream.steps_done(backup), 3 * 2)
            self.client.evict(device_pages_per_lane=[15, 15])
            loaded = s.load_back(tokens)
            self.assertTrue(loaded.ok)
            self.assertEqual(loaded.loaded_tokens, 12)
            self.assertEqual([p % 2 for p in loaded.pages], [p % 2 for p in pages])
            self.assertEqual(loaded.layers_loaded, 3 * 2)
            s.unlock([loaded.node])

    def test_v11_lock_handles_batched_loads_and_worker_events(self):
        tokens = list(range(700, 708))
        with self.client.session("py-v11") as s, \
                self.client.session("py-worker1", role="worker", rank=1) as w1, \
                self.client.session("py-worker0", role="worker", rank=0) as w0, \
                s.backup_stream() as stream, w0.backup_stream() as w0_stream, \
                w1.backup_stream() as w1_stream:
            events = w1.subscribe()
            pages = s.allocate(owners=[0, 1])
            (backup,) = stream.prepare([(pages, len(tokens))])
            # Each worker stores its own rank's layers: no relay.
            for step in range(3):
                w0_stream.layer_stored([backup], step)
                w1_stream.layer_stored([backup], step)
            result = s.insert(tokens, pages, backup_id=backup)
            self.assertEqual(stream.wait_committed(backup), result.node)
            seen = []
            for event in events:
                kind = event.WhichOneof("event")
                seen.append(kind)
                self.assertEqual(event.rank, 1)
                if kind == "backup_ended":
                    self.assertTrue(event.backup_ended.committed)
                    break
            self.assertEqual(seen.count("backup_step"), 3)
            events.cancel()
            # Two hits on one node: two handles, released independently.
            first, second = s.match([tokens, tokens], lock=True)
            self.assertNotEqual(first.lock_handle, second.lock_handle)
            s.unlock(handles=[first.lock_handle])
            self.assertEqual(self.client.stats().session_locks, 1)
            s.unlock(handles=[second.lock_handle])
            # A batch: one load, one miss.
            self.client.evict(device_pages_per_lane=[15, 15])
            loaded, missed = s.load_back_batch([tokens, list(range(900, 904))])
            self.assertTrue(loaded.ok)
            self.assertEqual(loaded.loaded_tokens, 8)
            self.assertEqual(loaded.layers_loaded, 3 * 2)
            self.assertNotEqual(loaded.lock_handle, 0)
            self.assertEqual(missed.loaded_tokens, 0)
            s.unlock(handles=[h for h in (loaded.lock_handle, missed.lock_handle) if h])
            self.assertEqual(self.client.stats().session_locks, 0)

    def test_lock_context_manager(self):
        with self.client.session("py-lock") as s:
            pages = s.allocate(num_pages=1)
            node = s.insert([1, 2, 3, 4], pages).node
            with s.locked([node]):
                self.assertEqual(self.client.stats().session_locks, 1)
            self.assertEqual(self.client.stats().session_locks, 0)

    def test_errors_carry_code_and_message(self):
        with self.client.session("py-errors") as s:
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.allocate(owners=[5])
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("owners[0] = 5", raised.exception.details)
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.unlock([424242])
            self.assertEqual(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        with self.assertRaises(ValueError):
            self.client.session("x", role="admin")

    def test_closing_releases_everything(self):
        with self.client.session("py-close") as s:
            s.allocate(num_pages=4)
            self.assertGreaterEqual(self.client.stats().session_pages, 4)
        stats = self.client.stats()
        self.assertEqual(stats.session_pages, 0)

    def test_keep_alive_holds_the_lease(self):
        import time
        with self.client.session("py-lease", lease_ms=300) as s:
            time.sleep(1.0)  # Three leases: the keep-alive thread renews it.
            s.allocate(num_pages=1)


if __name__ == "__main__":
    unittest.main()
