"""Finding the daemon (hicache.endpoint): one resolution order shared with
hicachectl and the C++ client -- arguments, $HICACHE_TARGET,
$HICACHE_SOCKET, the packaged socket if it exists, the default -- and a
socket that is missing or closed to this user fails at once with words that
say why, in the client and in hicache-replay (one line, no traceback)."""

import os
import socket
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import grpc

import hicache
from daemon_fixture import Daemon


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HICACHE_TARGET", "HICACHE_SOCKET")}
    env.update(extra)
    return env


class ResolveTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.packaged = os.path.join(self.dir, "hicached.sock")

    def resolved(self, target=None, socket_path=None):
        e = hicache.resolve_endpoint(target, socket_path, packaged_path=self.packaged)
        return (e.source, e.target, e.socket_path)

    def test_each_source_in_turn(self):
        with mock.patch.dict(os.environ, clean_env(XDG_RUNTIME_DIR="/run/user/7"), clear=True):
            self.assertEqual(self.resolved(), ("default", "unix:/run/user/7/hicached.sock",
                                               "/run/user/7/hicached.sock"))
            open(self.packaged, "w").close()
            self.assertEqual(self.resolved(),
                             ("packaged", f"unix:{self.packaged}", self.packaged))
            os.environ["HICACHE_SOCKET"] = ""
            self.assertEqual(self.resolved()[0], "packaged")
            os.environ["HICACHE_SOCKET"] = "/srv/h.sock"
            self.assertEqual(self.resolved(),
                             ("HICACHE_SOCKET", "unix:/srv/h.sock", "/srv/h.sock"))
            os.environ["HICACHE_TARGET"] = "node7:7000"
            self.assertEqual(self.resolved(), ("HICACHE_TARGET", "node7:7000", ""))
            os.environ["HICACHE_TARGET"] = "unix:///srv/t.sock"
            self.assertEqual(self.resolved(),
                             ("HICACHE_TARGET", "unix:///srv/t.sock", "/srv/t.sock"))
            self.assertEqual(self.resolved(socket_path="/x.sock"),
                             ("socket", "unix:/x.sock", "/x.sock"))
            self.assertEqual(self.resolved("host:1", None), ("target", "host:1", ""))

    def test_the_client_uses_it(self):
        with mock.patch.dict(os.environ, clean_env(HICACHE_SOCKET="/srv/h.sock"), clear=True):
            client = hicache.Client()
            self.assertEqual(client.target, "unix:/srv/h.sock")
            self.assertEqual(client.endpoint_source, "HICACHE_SOCKET")
            client.close()


class SocketProblemTest(unittest.TestCase):
    def test_missing_not_a_socket_and_fine(self):
        d = tempfile.mkdtemp()
        path = os.path.join(d, "s.sock")
        self.assertEqual(hicache.socket_problem(path),
                         (grpc.StatusCode.UNAVAILABLE, f"no daemon at {path} (no such socket)"))
        open(path, "w").close()
        code, message = hicache.socket_problem(path)
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("is not a socket", message)
        os.unlink(path)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        self.assertIsNone(hicache.socket_problem(path))
        listener.close()

    def outsider(self, path):
        """socket_problem(path) as a user outside the socket's group: root's
        child drops to nobody (root may open anything)."""
        code = ("import os, sys, hicache\n"
                "if os.getuid() == 0:\n"
                "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
                "p = hicache.socket_problem(sys.argv[1])\n"
                "print(p[0].name + ': ' + p[1] if p else 'OK')\n")
        return subprocess.run([sys.executable, "-c", code, path], check=True,
                              capture_output=True, text=True,
                              env=dict(os.environ)).stdout.strip()

    @unittest.skipUnless(os.getuid() == 0, "needs root to act as another user")
    def test_permission_denied_names_the_group(self):
        d = tempfile.mkdtemp()
        os.chmod(d, 0o755)
        path = os.path.join(d, "s.sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        os.chmod(path, 0o660)
        result = self.outsider(path)
        self.assertTrue(result.startswith(
            f"PERMISSION_DENIED: permission denied: this user may not connect to the socket "
            f"{path} (group root, mode 0660): add this user to group root"), result)
        os.chmod(path, 0o666)
        os.chmod(d, 0o750)  # As /run/hicached: root:hicache 0750.
        result = self.outsider(path)
        self.assertTrue(result.startswith(
            f"PERMISSION_DENIED: permission denied: this user may not enter the directory {d}"),
            result)
        listener.close()


class FastFailureTest(unittest.TestCase):
    """No daemon: the client and hicache-replay say so at once, before any
    call waits: the client here has an hour's timeout, and a replay that
    waited would end with DEADLINE_EXCEEDED after 60 s, not these words.
    (No wall-clock bound is asserted: the suite runs on busy machines.)"""

    def setUp(self):
        self.missing = os.path.join(tempfile.mkdtemp(), "none.sock")

    def test_health_fails_at_once(self):
        with hicache.Client(self.missing, timeout=3600) as client:
            with self.assertRaises(hicache.HiCacheError) as raised:
                client.health()
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn(f"no daemon at {self.missing} (no such socket)",
                      raised.exception.details)

    def test_replay_prints_one_line(self):
        result = subprocess.run(
            [sys.executable, "-m", "hicache.replay", "--socket", self.missing,
             "--conversations", "2", "--requests", "2"],
            capture_output=True, text=True, check=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stderr,
                         f"hicache-replay: UNAVAILABLE: no daemon at {self.missing} "
                         "(no such socket)\n")
        # A trace that is not there: exit 2, one line.
        result = subprocess.run(
            [sys.executable, "-m", "hicache.replay", "--socket", self.missing,
             "--trace", "/nonexistent/trace.jsonl"],
            capture_output=True, text=True, check=False)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stderr.count("\n"), 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertIn("/nonexistent/trace.jsonl", result.stderr)

    def test_environment_reaches_a_daemon(self):
        daemon = Daemon()
        try:
            env = clean_env(HICACHE_SOCKET=daemon.socket)
            out = subprocess.run(
                [sys.executable, "-c", "import hicache; print(hicache.Client().health())"],
                capture_output=True, text=True, check=True, env=env).stdout
            self.assertEqual(out.strip(), "SERVING")
        finally:
            self.assertEqual(daemon.stop(), 0)


class PublicApiTest(unittest.TestCase):
    """Everything hicache exports says what it does (issue 31): a docstring
    on every public class and on each of its public methods."""

    def test_every_public_name_has_a_docstring(self):
        import inspect  # pylint: disable=import-outside-toplevel
        missing = []
        for name in hicache.__all__:
            value = getattr(hicache, name)
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if not inspect.getdoc(value):
                missing.append(name)
            if inspect.isclass(value) and not issubclass(value, BaseException):
                for attr, member in vars(value).items():
                    if attr.startswith("_") or not callable(member):
                        continue
                    if not inspect.getdoc(member):
                        missing.append(f"{name}.{attr}")
        self.assertEqual(missing, [])


if __name__ == "__main__":
    unittest.main()
