"""Automatic session reopen: a real hicached is killed and restarted on the
same socket; the session reopens by itself, calls on_reopen exactly once,
keeps working, and refuses ids from before (StaleHandleError)."""

import threading
import time
import unittest

import grpc

import hicache
from daemon_fixture import Daemon

FLAGS = ("--page_size=4", "--kv_preset=tiny-draft", "--device_pages_per_rank=32",
         "--host_pages_per_rank=32")


class Recorder:
    def __init__(self):
        self.calls = []
        self.event = threading.Event()

    def __call__(self, session, old_id):
        self.calls.append((old_id, session.id, session.generation))
        self.event.set()


class ReopenTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon(*FLAGS)
        self.client = hicache.Client(self.daemon.socket)

    def tearDown(self):
        self.client.close()
        self.daemon.stop()

    def _state(self, s, base):
        """Caches 8 tokens and returns (tokens, locked hit, pages held)."""
        tokens = list(range(base, base + 8))
        (a,) = s.admit([tokens])
        s.complete([hicache.CompleteItem(tokens, a.request_pages)])
        hit = s.match([tokens], lock=True)[0]
        self.assertEqual(hit.device_tokens, 8)
        self.assertNotEqual(hit.lock_handle, 0)
        held = s.allocate(num_pages=2)
        return tokens, hit, held

    def _restart(self):
        self.daemon.kill()
        self.daemon.start()

    def test_a_call_reopens_the_session_and_stale_ids_are_refused(self):
        reopened = Recorder()
        with self.client.session("reopen", on_reopen=reopened) as s:
            tokens, hit, held = self._state(s, 100)
            (admitted,) = s.admit([list(range(300, 310))])
            old_id = s.id
            self._restart()
            # A call that names no daemon state is sent again on the new
            # session: the new daemon has an empty cache.
            self.assertEqual(s.match([tokens])[0].device_tokens, 0)
            self.assertEqual(reopened.calls, [(old_id, s.id, 1)])
            self.assertNotEqual(s.id, old_id)
            self.assertEqual((s.generation, s.reopens), (1, 1))
            # Ids from before are refused before anything is sent.
            stale = [
                lambda: s.unlock(handles=[hit.lock_handle]),
                lambda: s.lock([hit.last_device_node]),
                lambda: s.free(held),
                lambda: s.insert(tokens, held),
                lambda: s.complete([hicache.CompleteItem(tokens, hit.device_pages,
                                                         lock_handles=[hit.lock_handle])]),
                lambda: s.complete([hicache.CompleteItem(list(range(300, 310)),
                                                         admitted.request_pages)]),
                # The admit's own page views, their slices and sums keep the tag.
                lambda: s.complete([hicache.CompleteItem(list(range(300, 310)),
                                                         admitted.pages)]),
                lambda: s.insert(list(range(300, 308)), admitted.pages[:2]),
                lambda: s.free(admitted.pages[2:] + []),
                lambda: s.free([] + held[:1]),
                lambda: s.insert(tokens, hit.device_pages[:1] + held[:1]),
            ]
            for call in stale:
                with self.assertRaises(hicache.StaleHandleError) as raised:
                    call()
                self.assertEqual(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn("reopened", str(raised.exception))
            self.assertEqual(self.client.stats().session_pages, 0)
            # The session works on: fresh ids are accepted.
            fresh_tokens, fresh_hit, fresh_held = self._state(s, 200)
            s.unlock(handles=[fresh_hit.lock_handle])
            s.free(fresh_held)
            self.assertEqual(s.match([fresh_tokens])[0].device_tokens, 8)
            stats = self.client.stats()
            self.assertEqual((stats.session_pages, stats.session_locks), (0, 0))
        self.assertEqual(len(reopened.calls), 1)

    def test_a_call_naming_state_raises_stale_after_reopening(self):
        reopened = Recorder()
        with self.client.session("reopen-state", on_reopen=reopened) as s:
            _, hit, _ = self._state(s, 400)
            self._restart()
            # The handle is of the current generation until the session
            # learns it was lost: the daemon answers NOT_FOUND, the session
            # reopens and the call raises StaleHandleError (not retried).
            with self.assertRaises(hicache.StaleHandleError) as raised:
                s.unlock(handles=[hit.lock_handle])
            self.assertIn("reopened", raised.exception.details)
            self.assertEqual(len(reopened.calls), 1)
            # Now refused without a round trip, and no second reopen.
            with self.assertRaises(hicache.StaleHandleError):
                s.unlock(handles=[hit.lock_handle])
            self.assertEqual(s.allocate(num_pages=1).generation, 1)
        self.assertEqual(len(reopened.calls), 1)

    def test_the_keep_alive_reopens_an_idle_session(self):
        reopened = Recorder()
        with self.client.session("reopen-idle", lease_ms=900, on_reopen=reopened) as s:
            old_id = s.id
            self._restart()
            self.assertTrue(reopened.event.wait(15), "the keep-alive did not reopen")
            self.assertEqual(reopened.calls[0][0], old_id)
            time.sleep(1.0)  # Several more keep-alives: still one reopen.
            self.assertEqual(len(reopened.calls), 1)
            sessions = self.client.call("ListSessions", hicache.client.pb.ListSessionsRequest())
            self.assertIn(s.id, [info.session_id for info in sessions.sessions])
            self.assertEqual(len(s.allocate(num_pages=1)), 1)

    def test_without_auto_reopen_the_loss_is_reported(self):
        reopened = Recorder()
        with self.client.session("no-reopen", auto_reopen=False, on_reopen=reopened) as s:
            self._restart()
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.match([[1, 2, 3, 4]])
            self.assertEqual(raised.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertEqual(reopened.calls, [])

    def test_mutating_calls_fail_fast_while_the_daemon_is_down(self):
        with self.client.session("down") as s:
            self.daemon.kill()
            start = time.monotonic()
            with self.assertRaises(hicache.HiCacheError) as raised:
                s.allocate(num_pages=1)
            self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertLess(time.monotonic() - start, 5)
            self.assertIn(self.daemon.socket, raised.exception.details)
            self.daemon.start()
            self.assertEqual(len(s.allocate(num_pages=1)), 1)  # Reopened.
            self.assertEqual(s.generation, 1)


class TaggingTest(unittest.TestCase):
    """The generation tags on ids and page lists, without a daemon."""

    def test_handles_are_ints_that_pickle_as_plain_ints(self):
        import pickle  # pylint: disable=import-outside-toplevel
        handle = hicache.client._handle_type(3)(7)  # pylint: disable=protected-access
        self.assertEqual((handle, handle.generation, handle + 1), (7, 3, 8))
        self.assertEqual({handle: 1}[7], 1)
        plain = pickle.loads(pickle.dumps(handle))
        self.assertIs(type(plain), int)
        self.assertEqual(plain, 7)

    def test_page_lists_keep_the_oldest_tag(self):
        old, new = hicache.PageList([1, 2, 3], 0), hicache.PageList([4], 1)
        self.assertEqual(old[1:].generation, 0)
        self.assertEqual((new + old).generation, 0)
        self.assertEqual(([9] + new).generation, 1)
        self.assertEqual(new + [5], [4, 5])
        pages = hicache.Pages(new, [7])
        self.assertEqual(pages.generation, 1)
        self.assertEqual((pages + old).generation, 0)
        self.assertEqual(pages[1:], [7])
        self.assertEqual(pages[1:].generation, 1)
        self.assertIsNone(hicache.Pages([1], [2]).generation)


if __name__ == "__main__":
    unittest.main()
