"""The Python client against a real hicached (CP = 2, P = 4)."""

import time
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

    def test_errors_are_subclasses_per_status_code(self):
        import pickle  # pylint: disable=import-outside-toplevel
        error = hicache.HiCacheError(grpc.StatusCode.NOT_FOUND, "gone", "Unlock")
        self.assertIsInstance(error, hicache.NotFoundError)
        self.assertEqual((error.code, error.details, error.call),
                         (grpc.StatusCode.NOT_FOUND, "gone", "Unlock"))
        self.assertIs(type(hicache.HiCacheError(grpc.StatusCode.UNKNOWN, "?", "X")),
                      hicache.HiCacheError)
        stale = hicache.StaleHandleError("old", "Free")
        self.assertIsInstance(stale, hicache.FailedPreconditionError)
        copy = pickle.loads(pickle.dumps(error))
        self.assertIsInstance(copy, hicache.NotFoundError)
        self.assertEqual(str(copy), str(error))
        self.assertIsInstance(pickle.loads(pickle.dumps(stale)), hicache.StaleHandleError)
        # What a real call raises: the subclass, still a HiCacheError.
        with self.client.session("py-errors") as s:
            with self.assertRaises(hicache.NotFoundError) as raised:
                s.unlock(handles=[424242])
            self.assertIsInstance(raised.exception, hicache.HiCacheError)
            with self.assertRaises(hicache.InvalidArgumentError):
                s.admit([hicache.AdmitItem([1, 2, 3], reserve_tokens=-1)])

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

    def wait_for(self, predicate, timeout=10.0):
        deadline = time.time() + timeout
        while not predicate():
            self.assertLess(time.time(), deadline, "timed out")
            time.sleep(0.01)

    def assert_nothing_held(self):
        stats = self.client.stats()
        self.assertEqual(stats.session_pages, 0)
        self.assertEqual(stats.session_locks, 0)

    def test_admit_and_complete_one_round_trip_each(self):
        self.assertEqual(self.client.daemon_info().settings.write_policy,
                         "write_ahead")
        tokens = list(range(2000, 2010))  # 10 tokens: 2 pages and a tail.
        with self.client.session("py-admit") as s:
            (a,) = s.admit([hicache.AdmitItem(tokens, reserve_tokens=7, mode="round_robin",
                                              backup="never")])
            self.assertTrue(a.admitted)
            self.assertFalse(a.load)
            self.assertEqual((a.device_tokens, a.device_pages, a.lock_handle), (0, [], 0))
            self.assertEqual(len(a.pages), 5)  # ceil((10 + 7) / 4)
            # The mode lays the input's pages; the output reserve takes any lanes.
            self.assertEqual([p % 2 for p in a.pages[:3]], [0, 1, 0])
            self.assertEqual(a.backup_id, 0)
            self.assertEqual(self.client.stats().session_pages, 5)
            # The output reserve was not used: its pages are freed with the insert.
            (done,) = s.complete([hicache.CompleteItem(tokens, a.pages[:3],
                                                       free_pages=a.pages[3:])])
            self.assertFalse(done.deferred)
            self.assertEqual(done.cached_tokens, 10)
            self.assert_nothing_held()
            # The same input again: the hit is page-floored and locked, the
            # tail page is recomputed.
            (b,) = s.admit([tokens])
            self.assertEqual(b.device_tokens, 8)
            self.assertEqual(b.device_pages, a.pages[:2])
            self.assertNotEqual(b.lock_handle, 0)
            self.assertEqual(len(b.pages), 1)
            self.assertEqual(b.request_pages, list(b.device_pages) + list(b.pages))
            self.assertEqual(len(b.request_pages), 3)
            self.assertEqual(self.client.stats().session_locks, 1)
            (done,) = s.complete([hicache.CompleteItem(tokens, b.request_pages,
                                                       lock_handles=[b.lock_handle])])
            self.assertFalse(done.deferred)
            self.assert_nothing_held()
            # exact_tail reports the cached sub-page tail; the default floors it.
            self.assertEqual(s.match([tokens])[0].device_tokens, 8)
            self.assertEqual(s.match([tokens], exact_tail=True)[0].device_tokens, 10)
            # Packed tokens are taken as they are.
            self.assertEqual(s.match([hicache.pack_tokens(tokens)], exact_tail=True)[0]
                             .device_tokens, 10)

    def test_pages_keep_repeated_fields_as_they_came(self):
        from hicache_proto.v1 import hicache_pb2 as pb
        device = pb.Locations(pages=[7, 9, 11]).pages
        pages = hicache.Pages(device, [2, 4])
        self.assertEqual(len(pages), 5)
        self.assertEqual(list(pages), [7, 9, 11, 2, 4])
        self.assertEqual(pages, [7, 9, 11, 2, 4])
        self.assertEqual((pages[0], pages[3], pages[-1]), (7, 2, 4))
        self.assertEqual(pages[1:4], [9, 11, 2])
        with self.assertRaises(IndexError):
            pages[5]  # pylint: disable=pointless-statement
        self.assertEqual(pages + [6], [7, 9, 11, 2, 4, 6])
        self.assertEqual([5] + pages, [5, 7, 9, 11, 2, 4])
        self.assertEqual(repr(pages), "Pages([7, 9, 11, 2, 4])")
        self.assertNotEqual(pages, [7, 9])

    def test_admit_backup_choices_and_workers_layers(self):
        tokens = list(range(2100, 2112))
        with self.client.session("py-admit-backup") as s, s.backup_stream() as stream:
            never, always = s.admit([
                hicache.AdmitItem(list(range(2200, 2204)), backup="never"),
                hicache.AdmitItem(tokens, backup="always", mode="zigzag")])
            self.assertEqual(never.backup_id, 0)
            self.assertNotEqual(always.backup_id, 0)
            committed = self.client.stats().backups_committed
            stream.layers_stored([always.backup_id], self.client.layout().num_steps)
            done_never, done_always = s.complete([
                hicache.CompleteItem(list(range(2200, 2204)), never.pages),
                hicache.CompleteItem(tokens, always.pages, backup_id=always.backup_id)])
            self.assertFalse(done_never.backup_attached)
            self.assertTrue(done_always.backup_attached)
            self.wait_for(lambda: self.client.stats().backups_committed > committed)
            self.assertEqual(stream.error_count, 0)
            self.assert_nothing_held()
            self.assertEqual(s.match([tokens], peek=True)[0].device_tokens, 12)

    def test_admit_host_hit_loads_back_with_the_extend(self):
        tokens = list(range(2300, 2312))
        more = tokens + list(range(2400, 2406))  # 12 cached + 6 new.
        with self.client.session("py-admit-load") as s, s.backup_stream() as stream:
            (a,) = s.admit([hicache.AdmitItem(tokens, backup="always")])
            stream.layers_stored([a.backup_id], self.client.layout().num_steps)
            committed = self.client.stats().backups_committed
            s.complete([hicache.CompleteItem(tokens, a.pages, backup_id=a.backup_id)])
            self.wait_for(lambda: self.client.stats().backups_committed > committed)
            self.client.evict(device_pages_per_lane=[15, 15])
            (b,) = s.admit([hicache.AdmitItem(more, reserve_tokens=2)])
            self.assertTrue(b.admitted)
            self.assertTrue(b.load)
            self.assertEqual(b.host_hit_tokens, 12)
            self.assertEqual(b.pages, [])  # Nothing allocated: load first.
            extend = len(more) - b.device_tokens - b.host_hit_tokens + 2
            # An extend the device cannot keep room for makes the load a miss.
            missed = s.load_back(more, extend_tokens=1 << 20)
            self.assertEqual(missed.loaded_tokens, 0)
            self.assertEqual(missed.miss_reason, "over_quota")
            if missed.lock_handle:
                s.unlock(handles=[missed.lock_handle])
            loaded = s.load_back(more, extend_tokens=extend)
            self.assertTrue(loaded.ok)
            self.assertEqual(loaded.device_tokens + loaded.loaded_tokens, 12)
            self.assertNotEqual(loaded.lock_handle, 0)
            fresh = s.allocate(num_pages=5 - 3)  # ceil((18 + 2) / 4) - 3 reused.
            handles = [h for h in (b.lock_handle, loaded.lock_handle) if h]
            (done,) = s.complete([hicache.CompleteItem(more, loaded.pages[:3] + fresh[:2],
                                                       lock_handles=handles)])
            self.assertFalse(done.deferred)
            self.assertEqual(done.cached_tokens, 18)
            self.assert_nothing_held()
            # Batched, one extend per item.
            with self.assertRaises(ValueError):
                s.load_back_batch([tokens, more], extend_tokens=[0])

    def test_admit_first_come_first_served_when_full(self):
        with self.client.session("py-hog") as hog, self.client.session("py-late") as late:
            hogged = hog.allocate(num_pages=28)  # Of 30: the tree is evicted.
            big, small = late.admit([list(range(2500, 2516)), list(range(2600, 2602))])
            # The first does not fit; the second would, but waits its turn.
            self.assertFalse(big.admitted)
            self.assertFalse(small.admitted)
            self.assertEqual(self.client.stats().session_pages, 28)
            hog.free(hogged)
            (big,) = late.admit([list(range(2500, 2516))])
            self.assertTrue(big.admitted)
            late.complete([hicache.CompleteItem(list(range(2500, 2516)), big.pages)])
            self.assert_nothing_held()

    def test_admit_and_complete_errors(self):
        tokens = list(range(2700, 2708))
        with self.client.session("py-flow-errors") as s:
            # No backups: a page under one is refused first (FAILED_PRECONDITION)
            # and would hide the checks below.
            (a,) = s.admit([hicache.AdmitItem(tokens, backup="never")])
            (b,) = s.admit([hicache.AdmitItem(tokens[:4] + [9999] * 4, backup="never")])
            pages_before = self.client.stats().session_pages
            locks_before = self.client.stats().session_locks
            # A bad lock handle: NOT_FOUND, and nothing changed (no insert,
            # no page freed, no lock released).
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.complete([hicache.CompleteItem(tokens, a.pages,
                                                 lock_handles=[424242])])
            self.assertEqual(raised.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertIn("lock_handles[0] = 424242", raised.exception.details)
            self.assertEqual(raised.exception.call, "Complete")
            self.assertEqual(s.match([tokens], peek=True)[0].device_tokens, 0)
            self.assertEqual(self.client.stats().session_pages, pages_before)
            self.assertEqual(self.client.stats().session_locks, locks_before)
            # A page both inserted and freed.
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.complete([hicache.CompleteItem(tokens, a.pages, free_pages=a.pages[:1])])
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            # Pages that are not the session's.
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.complete([hicache.CompleteItem(tokens, [777777, 777778])])
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            # Admit: an empty request, a bad reserve; a bad choice is caught here.
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.admit([[]])
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.admit([hicache.AdmitItem(tokens, reserve_tokens=-1)])
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            with self.assertRaises(ValueError):
                s.admit([hicache.AdmitItem(tokens, mode="diagonal")])
            with self.assertRaises(ValueError):
                s.admit([hicache.AdmitItem(tokens, backup="sometimes")])
            # The failed calls changed nothing: both requests still complete.
            s.complete([hicache.CompleteItem(tokens, a.pages)])
            s.complete([hicache.CompleteItem(tokens[:4] + [9999] * 4, b.request_pages,
                                             lock_handles=[b.lock_handle] if b.lock_handle
                                             else [])])
            self.assert_nothing_held()

    def test_deferred_complete_keeps_everything_for_the_retry(self):
        first = list(range(2800, 2812))
        second = first[:8] + list(range(2900, 2904))  # Diverges inside first's node.
        with self.client.session("py-defer") as s, s.backup_stream() as stream:
            (a,) = s.admit([hicache.AdmitItem(first, backup="always")])
            # Attached, but no layer is stored yet: first's node is pending.
            (done,) = s.complete([hicache.CompleteItem(first, a.pages, backup_id=a.backup_id)])
            self.assertTrue(done.backup_attached)
            (b,) = s.admit([hicache.AdmitItem(second, backup="always")])
            self.assertTrue(b.tail_blocked)  # Told up front: no backup for it.
            self.assertEqual(b.backup_id, 0)
            self.assertEqual(b.device_tokens, 8)
            item = hicache.CompleteItem(second, b.request_pages, lock_handles=[b.lock_handle])
            (deferred,) = s.complete([item])
            self.assertTrue(deferred.deferred)
            stats = self.client.stats()
            self.assertEqual(stats.session_locks, 1)  # Still b's.
            self.assertEqual(stats.session_pages, 1)
            committed = stats.backups_committed
            stream.layers_stored([a.backup_id], self.client.layout().num_steps)
            self.wait_for(lambda: self.client.stats().backups_committed > committed)
            (retried,) = s.complete([item])
            self.assertFalse(retried.deferred)
            self.assertEqual(retried.cached_tokens, 12)
            self.assert_nothing_held()

    def test_backup_stream_errors_are_attributed(self):
        with self.client.session("py-stream-errors") as s, s.backup_stream() as stream:
            pages = s.allocate(num_pages=1)
            stream.layer_stored([424242], 0)  # Not a backup: an error, no reply.
            (backup,) = stream.prepare([(pages, 4)])  # Its own reply all the same.
            self.assertNotEqual(backup, 0)
            with self.assertRaises(hicache.HiCacheError) as raised:
                stream.prepare([([777777], 4)])  # Not the session's page.
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual(stream.error_count, 2)
            ((code, message),) = stream.errors()
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("424242", message)
            (again,) = stream.prepare([(s.allocate(num_pages=1), 4)])
            self.assertNotIn(again, (0, backup))

    def test_backup_stream_senders_deliver_bursts_in_order(self):
        # Sent from the calling thread (direct, grpcio internals) or through
        # gRPC's request-iterator thread: the same stream either way.
        steps = self.client.layout().num_steps
        for n, direct in enumerate((True, "caller", False)):
            with self.subTest(direct=direct), \
                    self.client.session(f"py-senders-{direct}") as s, \
                    s.backup_stream(direct=direct) as stream:
                self.assertEqual(stream.direct, bool(direct))
                backups = []
                for i in range(8):
                    tokens = list(range(3000 + 100 * i + 20 * n, 3004 + 100 * i + 20 * n))
                    pages = s.allocate(num_pages=1)
                    (backup,) = stream.prepare([(pages, 4)])
                    backups.append((tokens, pages, backup))
                # A burst: most messages wait for the one in flight.
                for _, _, backup in backups:
                    stream.layers_stored([backup], steps)
                for tokens, pages, backup in backups:
                    self.assertTrue(s.insert(tokens, pages, backup_id=backup).backup_attached)
                for tokens, pages, backup in backups:
                    self.assertIsNotNone(stream.wait_committed(backup))
                    self.assertEqual(stream.steps_done(backup), steps * 2)
                self.assertEqual(stream.error_count, 0)

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
        # Two and a half leases: the keep-alive thread (every lease / 3)
        # renews it. A lease of 2 s leaves a busy machine's scheduler room.
        with self.client.session("py-lease", lease_ms=2000) as s:
            time.sleep(5.0)
            s.allocate(num_pages=1)


if __name__ == "__main__":
    unittest.main()
