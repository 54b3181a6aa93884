"""gRPC's service-config retries and wait_for_ready in hicache.Client.

A fake HiCache server (grpcio, on a unix socket) answers UNAVAILABLE and
counts attempts: reads are retried by gRPC (RETRY_POLICY's maxAttempts),
mutating calls are sent once. A real hicached that starts after the call
was made answers a read (it waited for the socket), while a mutating call
made before it was up failed at once."""

import json
import os
import shutil
import tempfile
import threading
import time
import unittest
from concurrent import futures

import grpc

import hicache
from hicache.client import pb
from daemon_fixture import Daemon


class Counting:
    """A HiCache (+ Health) service whose methods answer UNAVAILABLE, but
    OpenSession, which opens session "s-fake"."""

    def __init__(self):
        self.calls = {}
        self.lock = threading.Lock()

    def handler(self, name, response):
        def handle(request, context):
            del request
            with self.lock:
                self.calls[name] = self.calls.get(name, 0) + 1
            if name == "OpenSession":
                return pb.OpenSessionResponse(session_id="s-fake", lease_ms=60000)
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake: try again")
            return response()
        return handle

    def generic(self):
        methods = {name: grpc.unary_unary_rpc_method_handler(
            self.handler(name, response), request_deserializer=request.FromString,
            response_serializer=response.SerializeToString)
            for name, request, response in (
                ("OpenSession", pb.OpenSessionRequest, pb.OpenSessionResponse),
                ("GetStats", pb.GetStatsRequest, pb.GetStatsResponse),
                ("GetLayout", pb.GetLayoutRequest, pb.GetLayoutResponse),
                ("KeepAlive", pb.KeepAliveRequest, pb.KeepAliveResponse),
                ("Allocate", pb.AllocateRequest, pb.AllocateResponse),
                ("Admit", pb.AdmitRequest, pb.AdmitResponse),
                ("MatchPrefix", pb.MatchPrefixRequest, pb.MatchPrefixResponse),
                ("Evict", pb.EvictRequest, pb.EvictResponse))}
        return grpc.method_handlers_generic_handler("hicache.v1.HiCache", methods)


class ServiceConfigTest(unittest.TestCase):
    def test_the_config_retries_only_reads(self):
        config = json.loads(hicache.service_config())
        (method,) = config["methodConfig"]
        names = {(n["service"], n["method"]) for n in method["name"]}
        self.assertEqual(names, set(hicache.READ_METHODS))
        self.assertIn(("hicache.v1.HiCache", "GetStats"), names)
        self.assertIn(("grpc.health.v1.Health", "Check"), names)
        for mutating in ("Allocate", "Free", "Insert", "Admit", "Complete", "Lock", "Unlock",
                         "MatchPrefix", "OpenSession", "CloseSession", "Evict", "Pin"):
            self.assertNotIn(("hicache.v1.HiCache", mutating), names)
        self.assertTrue(method["waitForReady"])
        self.assertEqual(method["retryPolicy"]["retryableStatusCodes"], ["UNAVAILABLE"])
        self.assertFalse(json.loads(hicache.service_config(False))["methodConfig"][0]
                         ["waitForReady"])


class RetriesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hicache-retry-", dir="/tmp")
        self.socket = os.path.join(self.dir, "fake.sock")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_reads_are_retried_and_mutations_are_sent_once(self):
        fake = Counting()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((fake.generic(),))
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        try:
            with hicache.Client(self.socket, timeout=10) as client:
                for read in (client.daemon_info, client.layout):
                    with self.assertRaises(hicache.HiCacheError) as raised:
                        read()
                    self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
                with client.session("fake", lease_ms=60000) as s:
                    for mutate in (lambda: s.allocate(num_pages=1),
                                   lambda: s.admit([[1, 2, 3, 4]]),
                                   lambda: s.match([[1, 2, 3, 4]], lock=True),
                                   lambda: client.evict([1])):
                        with self.assertRaises(hicache.HiCacheError) as raised:
                            mutate()
                        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
                    s.close = lambda: None  # The fake cannot close it.
        finally:
            server.stop(0)
        attempts = hicache.client.RETRY_POLICY["maxAttempts"]
        self.assertEqual(fake.calls, {"GetStats": attempts, "GetLayout": attempts,
                                      "OpenSession": 1, "Allocate": 1, "Admit": 1,
                                      "MatchPrefix": 1, "Evict": 1})

    def test_a_read_waits_for_a_daemon_that_is_starting(self):
        daemon = Daemon("--page_size=4", "--kv_preset=tiny-draft",
                        "--device_pages_per_rank=16", "--host_pages_per_rank=16",
                        socket=self.socket, start=False)
        client = hicache.Client(self.socket, timeout=30)
        starter = threading.Timer(1.0, daemon.start)
        try:
            # Nothing listens yet: a mutating call with a short deadline is
            # not retried, nor does it wait for the socket.
            start = time.monotonic()
            with self.assertRaises(hicache.HiCacheError) as raised:
                client.call("Allocate", pb.AllocateRequest(session_id="x"), timeout=2)
            self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertLess(time.monotonic() - start, 1.5)
            starter.start()
            start = time.monotonic()
            info = client.daemon_info()  # Issued before the socket exists.
            waited = time.monotonic() - start
            self.assertGreater(waited, 0.5)
            # Found again within about a second (RECONNECT_BACKOFF), not
            # after gRPC's default backoff (up to minutes).
            self.assertLess(waited, 4)
            self.assertEqual(info.geometry.page_size_tokens, 4)
            self.assertEqual(client.health(), "SERVING")
        finally:
            client.close()  # Before the daemon drains its connections.
            starter.cancel()
            if starter.is_alive():
                starter.join()
            if daemon.process is not None:
                daemon.stop()

    def test_a_session_opened_before_the_daemon_is_up_waits_for_it(self):
        daemon = Daemon("--page_size=4", "--kv_preset=tiny-draft",
                        "--device_pages_per_rank=16", "--host_pages_per_rank=16",
                        socket=self.socket, start=False)
        starter = threading.Timer(0.5, daemon.start)
        starter.start()
        try:
            with hicache.Client(self.socket, timeout=30) as client, \
                    client.session("early") as s:
                self.assertEqual(len(s.allocate(num_pages=2)), 2)
                self.assertEqual(s.match([[1, 2, 3, 4]])[0].device_tokens, 0)
        finally:
            starter.join()
            if daemon.process is not None:
                daemon.stop()

    def test_without_wait_for_ready_a_read_fails_once_its_retries_are_spent(self):
        with hicache.Client(self.socket, timeout=30, wait_for_ready=False) as client:
            start = time.monotonic()
            with self.assertRaises(hicache.HiCacheError) as raised:
                client.daemon_info()
            self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertLess(time.monotonic() - start, 10)
            with self.assertRaises(hicache.HiCacheError) as raised:
                client.wait_until_ready(0.3)
            self.assertEqual(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)


if __name__ == "__main__":
    unittest.main()
