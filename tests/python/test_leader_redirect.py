"""CP group redirects in hicache.Client (docs/python-client.md), against fakes
and against two real hicached processes (RealDaemonsTest).

Fake HiCache servers (grpcio, plain TCP on 127.0.0.1 with OS-chosen ports):
a follower refuses a scheduler's OpenSession with FAILED_PRECONDITION and
the leader's target in the `hicache-leader` trailer; the client opens the
session on the leader instead (its settings kept), at most one hop, and
never follows a trailer that is not a valid host:port target."""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import unittest
from concurrent import futures

import grpc

import hicache
from hicache.client import pb
from daemon_fixture import Daemon

FLAGS = ("--page_size=4", "--kv_preset=tiny-draft", "--device_pages_per_rank=16",
         "--host_pages_per_rank=16", "--insecure_tcp_for_testing")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeDaemon:
    """OpenSession: a redirect to `leaders` (one trailer each) for a
    scheduler, else a session. KeepAlive, CloseSession and Allocate answer
    OK. Counts the calls."""

    def __init__(self, leaders=(), listen=None):
        self.leaders = list(leaders)
        self.calls = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((self._generic(),))
        if listen is None:
            port = self.server.add_insecure_port("127.0.0.1:0")
            self.target = f"127.0.0.1:{port}"
        else:
            self.server.add_insecure_port(listen)
            self.target = listen
        self.server.start()

    def stop(self):
        self.server.stop(0)

    def count(self, name):
        with self.lock:
            return self.calls.get(name, 0)

    def _handler(self, name, response):
        def handle(request, context):
            with self.lock:
                self.calls[name] = self.calls.get(name, 0) + 1
            if name == "OpenSession":
                if request.role == pb.ROLE_SCHEDULER and self.leaders:
                    context.set_trailing_metadata(
                        tuple(("hicache-leader", leader) for leader in self.leaders))
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  "not the CP group leader; the leader is " + self.leaders[0])
                return pb.OpenSessionResponse(session_id="s-" + request.client_name,
                                              lease_ms=60000)
            if name == "Allocate":
                return pb.AllocateResponse(allocations=[pb.Locations(pages=[7])])
            return response()
        return handle

    def _generic(self):
        methods = {name: grpc.unary_unary_rpc_method_handler(
            self._handler(name, response), request_deserializer=request.FromString,
            response_serializer=response.SerializeToString)
            for name, request, response in (
                ("OpenSession", pb.OpenSessionRequest, pb.OpenSessionResponse),
                ("KeepAlive", pb.KeepAliveRequest, pb.KeepAliveResponse),
                ("CloseSession", pb.CloseSessionRequest, pb.CloseSessionResponse),
                ("Allocate", pb.AllocateRequest, pb.AllocateResponse))}
        return grpc.method_handlers_generic_handler("hicache.v1.HiCache", methods)


class ValidLeaderTargetTest(unittest.TestCase):
    def test_host_port_only(self):
        for good in ("leader:7443", "10.0.0.1:1", "[::1]:5000", "dns:///leader.example:443",
                     "a-b.example:65535"):
            self.assertTrue(hicache.valid_leader_target(good), good)
        for bad in ("", "leader", "leader:0", "leader:65536", "leader:+1", "unix:/tmp/x.sock",
                    "ipv4:1.2.3.4:5", "x:1/path", "user@x:1", "-x:1", ".x:1", "a b:1",
                    "[zz]:1", "x\x00:1", "x:1\n", "x:1\r", "\u00e9t\u00e9:1", "x:\u0661",
                    "a" * 255 + ":1", None, b"x:1", 5):
            self.assertFalse(hicache.valid_leader_target(bad), repr(bad))
        self.assertTrue(hicache.valid_leader_target("a" * 253 + ":1"))


class RedirectTest(unittest.TestCase):
    def setUp(self):
        self.daemons = []

    def tearDown(self):
        for daemon in self.daemons:
            daemon.stop()

    def daemon(self, *leaders):
        daemon = FakeDaemon(leaders)
        self.daemons.append(daemon)
        return daemon

    def client(self, target, **kwargs):
        client = hicache.Client(target=target, timeout=10, insecure_tcp_for_testing=True,
                                **kwargs)
        self.addCleanup(client.close)
        return client

    def test_a_scheduler_session_is_opened_on_the_leader(self):
        leader = self.daemon()
        follower = self.daemon(leader.target)
        client = self.client(follower.target)
        with client.session("sched", lease_ms=60000) as s:
            self.assertEqual(s.id, "s-sched")
            self.assertEqual(s.target, leader.target)
            self.assertEqual(list(s.allocate(num_pages=1)), [7])
        self.assertEqual(follower.count("OpenSession"), 1)
        self.assertEqual(leader.count("OpenSession"), 1)
        self.assertEqual(leader.count("Allocate"), 1)
        self.assertEqual(leader.count("CloseSession"), 1)
        self.assertEqual(follower.count("Allocate"), 0)
        self.assertEqual(follower.count("CloseSession"), 0)
        self.assertEqual(client.target, follower.target)  # The caller's client is unchanged.

    def test_a_scheduler_on_a_unix_follower_follows_to_a_tcp_leader(self):
        # The follower is reached on its unix socket; the TCP options given
        # to that client are the leader's.
        leader = self.daemon()
        directory = tempfile.mkdtemp(prefix="hicache-redirect-")
        self.addCleanup(shutil.rmtree, directory, True)
        sock_path = os.path.join(directory, "f.sock")
        follower = FakeDaemon([leader.target], listen=f"unix:{sock_path}")
        self.daemons.append(follower)
        client = hicache.Client(socket_path=sock_path, timeout=10,
                                insecure_tcp_for_testing=True)
        self.addCleanup(client.close)
        with client.session("sched", lease_ms=60000) as s:
            self.assertEqual(s.target, leader.target)
        self.assertEqual(follower.count("OpenSession"), 1)
        self.assertEqual(leader.count("OpenSession"), 1)

    def test_a_worker_session_stays_where_it_was_opened(self):
        follower = self.daemon("leader.example:7443")
        with self.client(follower.target).session("w", role="worker", lease_ms=60000) as s:
            self.assertEqual(s.target, follower.target)

    def test_follow_leader_false_raises_with_the_leader(self):
        follower = self.daemon("leader.example:7443")
        with self.assertRaises(hicache.HiCacheError) as raised:
            self.client(follower.target, follow_leader=False).session("sched")
        self.assertEqual(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(raised.exception.leader, "leader.example:7443")

    def test_at_most_one_hop(self):
        third = self.daemon()
        second = self.daemon(third.target)
        first = self.daemon(second.target)
        with self.assertRaises(hicache.HiCacheError) as raised:
            self.client(first.target).session("sched")
        error = raised.exception
        self.assertEqual(error.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn(second.target, error.details)
        self.assertIn(third.target, error.details)
        self.assertIn("one hop", error.details)
        self.assertIsNone(error.leader)
        self.assertEqual(third.count("OpenSession"), 0)

    def test_garbage_or_oversized_trailers_are_not_followed(self):
        for leaders in (("unix:/tmp/evil.sock",), ("evil:1/path",), ("user@evil:1",),
                        ("a" * 300 + ":1",), ("127.0.0.1:1", "127.0.0.1:2")):
            follower = self.daemon(*leaders)
            with self.assertRaises(hicache.HiCacheError) as raised:
                self.client(follower.target).session("sched")
            self.assertEqual(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIsNone(raised.exception.leader, leaders)
            self.assertEqual(follower.count("OpenSession"), 1)

    def test_an_unreachable_leader_names_both(self):
        follower = self.daemon("127.0.0.1:1")
        with self.assertRaises(hicache.HiCacheError) as raised:
            self.client(follower.target, wait_for_ready=False).session("sched")
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("127.0.0.1:1", raised.exception.details)
        self.assertIn(follower.target, raised.exception.details)

    def test_for_target_keeps_the_tls_settings(self):
        client = hicache.Client(target="daemon.example:1", root_certificates=b"not a pem",
                                tls_server_name="hicached.internal", timeout=3,
                                channel_options=(("grpc.max_receive_message_length", 1 << 20),))
        self.addCleanup(client.close)
        other = client.for_target("leader.example:2")
        self.addCleanup(other.close)
        self.assertTrue(other.tls)
        self.assertEqual(other.target, "leader.example:2")
        self.assertEqual(other._settings, client._settings)  # pylint: disable=protected-access
        with self.assertRaises(ValueError):
            client.for_target("unix:/tmp/evil.sock")


class RealDaemonsTest(unittest.TestCase):
    """Two real hicached processes on plain loopback TCP: one is made a
    follower of the other with the test-only --cp_group_test_non_leader_of."""

    @classmethod
    def setUpClass(cls):
        cls.leader_target = f"127.0.0.1:{_free_port()}"
        cls.follower_target = f"127.0.0.1:{_free_port()}"
        cls.leader = Daemon(*FLAGS, f"--listen_tcp={cls.leader_target}")
        try:
            cls.follower = Daemon(*FLAGS, f"--listen_tcp={cls.follower_target}",
                                  f"--cp_group_test_non_leader_of={cls.leader_target}")
        except BaseException:
            cls.leader.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.follower.stop()
        cls.leader.stop()

    def client(self, target, **kwargs):
        client = hicache.Client(target=target, timeout=10, insecure_tcp_for_testing=True,
                                **kwargs)
        self.addCleanup(client.close)
        return client

    def test_a_scheduler_opened_on_the_follower_works_on_the_leader(self):
        with self.client(self.follower_target).session("sched", lease_ms=60000) as s:
            self.assertEqual(s.target, self.leader_target)
            s.insert([1, 2, 3, 4], s.allocate(num_pages=1))
            self.assertEqual(s.match([[1, 2, 3, 4]])[0].device_tokens, 4)
        self.assertEqual(self.client(self.leader_target).stats().nodes, 1)
        with hicache.Client(self.follower.socket, timeout=10) as local:
            with self.assertRaises(hicache.HiCacheError) as raised:
                local.stats()  # A tree read: the follower redirects it.
            self.assertEqual(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertEqual(raised.exception.leader, self.leader_target)
            self.assertIn(f"the leader is {self.leader_target}", raised.exception.details)
            for name, request in (("MatchPrefix", pb.MatchPrefixRequest(session_id="x")),
                                  ("Allocate", pb.AllocateRequest(session_id="x")),
                                  ("DumpTree", pb.DumpTreeRequest())):
                with self.assertRaises(hicache.HiCacheError) as raised:
                    local.call(name, request)
                self.assertEqual(raised.exception.leader, self.leader_target, name)

    def test_the_follower_serves_workers_and_its_own_layout(self):
        follower = self.client(self.follower_target)
        self.assertEqual(follower.layout().geometry.page_size_tokens, 4)
        self.assertEqual(follower.health(), "SERVING")
        with follower.session("w", role="worker", lease_ms=60000) as s:
            self.assertEqual(s.target, self.follower_target)
        with self.assertRaises(hicache.HiCacheError) as raised:
            self.client(self.follower_target, follow_leader=False).session("sched")
        self.assertEqual(raised.exception.leader, self.leader_target)

    def test_the_flag_is_refused_without_insecure_tcp_or_with_a_bad_target(self):
        for flags in (("--cp_group_test_non_leader_of=127.0.0.1:1",),
                      ("--insecure_tcp_for_testing",
                       "--cp_group_test_non_leader_of=unix:/tmp/evil.sock")):
            result = subprocess.run([os.environ["HICACHED"], *flags, "--socket=/nonexistent/x"],
                                    capture_output=True, timeout=30, check=False)
            self.assertEqual(result.returncode, 2, result.stderr.decode(errors="replace"))
            self.assertIn(b"cp_group_test_non_leader_of", result.stderr)


if __name__ == "__main__":
    unittest.main()
