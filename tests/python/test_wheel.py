"""The wheel (tools/build_wheel) installs with pip and works against a real
hicached:

(a) in a venv with --system-site-packages, on Debian's python3-grpcio and
    python3-protobuf (pip installs the wheel and grpcio-health-checking at
    Debian's grpcio version, fetched from PyPI, and nothing else);
(b) in a plain venv, with the newest grpcio and protobuf from PyPI.
Both are skipped, saying why, when PyPI cannot be reached. Downloads are cached in
    ~/.cache/hicache/pip where that is writable.

Each venv runs a smoke script from outside the checkout (no PYTHONPATH):
health, open a session, admit, complete, match; then a short replay
(python -m hicache.replay) and the hicache-replay command.
"""

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import unittest

from daemon_fixture import Daemon

ROOT = os.getcwd()  # run_python_tests.sh starts in the runfiles root.
PYTHON = "/usr/bin/python3"

# A scheduler as a user writes it, with annotations: mypy --strict must
# accept it against the installed package.
TYPED_SCRIPT = r'''
from typing import List

import hicache


def cached_tokens(client: hicache.Client, prompts: List[List[int]]) -> List[int]:
    with client.session("typed") as session:
        hits: List[hicache.MatchResult] = session.match(prompts)
        return [hit.device_tokens + hit.host_hit_tokens for hit in hits]


def main() -> int:
    try:
        with hicache.Client() as client:
            status: str = client.health()
            print(status, cached_tokens(client, [[1, 2, 3, 4]]))
            (admitted,) = client.session("typed-admit").admit(
                [hicache.AdmitItem([5, 6, 7, 8], reserve_tokens=4)])
            print(admitted.admitted, len(admitted.request_pages))
    except hicache.UnavailableError as e:
        print("no daemon:", e.details)
        return 1
    except hicache.HiCacheError as e:
        print(e.code.name, e.details)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

SMOKE = r'''
import json, os, sys
import google.protobuf, grpc
import hicache
from grpc_health.v1 import health_pb2  # The grpcio-health-checking dependency.
from hicache.v1 import hicache_pb2

here = os.path.dirname(hicache.__file__)
assert "site-packages" in here, here
assert hicache_pb2.__file__.startswith(here), hicache_pb2.__file__
assert "site-packages" in health_pb2.__file__, health_pb2.__file__
base = int(sys.argv[2])  # Each venv its own tokens (one daemon for all).
tokens = list(range(base, base + 10))  # 10 tokens: P = 4, two pages and a tail.
with hicache.Client(sys.argv[1]) as client:
    assert client.health() == "SERVING"
    with client.session("wheel-smoke") as s:
        (a,) = s.admit([hicache.AdmitItem(tokens, reserve_tokens=3)])
        assert a.admitted and len(a.pages) == 4, a
        (done,) = s.complete([hicache.CompleteItem(tokens, a.pages[:3],
                                                   free_pages=a.pages[3:])])
        assert not done.deferred and done.cached_tokens == 10, done
        hit = s.match([tokens])[0]
        assert hit.device_tokens == 8, hit
        (b,) = s.admit([tokens])
        assert b.device_tokens == 8 and b.lock_handle, b
        s.complete([hicache.CompleteItem(tokens, b.request_pages,
                                         lock_handles=[b.lock_handle])])
    stats = client.stats()
    assert stats.session_pages == 0 and stats.session_locks == 0, stats
print(json.dumps({"hicache": hicache.__version__, "grpcio": grpc.__version__,
                  "protobuf": google.protobuf.__version__, "module": hicache.__file__}))
'''


def _pip_cache():
    """~/.cache/hicache/pip of the user (Bazel may point HOME elsewhere),
    or None where it cannot be written (a sandbox)."""
    home = pwd.getpwuid(os.getuid()).pw_dir
    cache = os.path.join(home, ".cache", "hicache", "pip")
    try:
        os.makedirs(cache, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=cache)
        probe.close()
        return cache
    except OSError:
        return None


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


# Bounded so the whole test stays inside its Bazel timeout (BUILD: large).
_PYPI_INSTALL_SECONDS = 360

# pip's messages for a download that failed on the network.
_NETWORK_ERRORS = ("ReadTimeoutError", "ConnectTimeoutError", "ConnectionError",
                   "NewConnectionError", "Max retries exceeded", "Connection reset",
                   "IncompleteRead", "ProtocolError", "SSLError",
                   "Temporary failure in name resolution", "HTTP error 5",
                   "THESE PACKAGES DO NOT MATCH THE HASHES")


def _network_failure(output):
    """The first line of pip's output naming a network failure, or ''."""
    for line in output.splitlines():
        if any(marker in line for marker in _NETWORK_ERRORS):
            return line.strip()[:200]
    return ""


def _run(args, timeout=300, **kwargs):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=_clean_env(), **kwargs)


class WheelTest(unittest.TestCase):
    base = 0

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="hicache-wheel-", dir="/tmp")
        built = _run([os.path.join(ROOT, "tools", "build_wheel"),
                      os.path.join(cls.dir, "dist")])
        if built.returncode != 0:
            raise RuntimeError(f"tools/build_wheel failed:\n{built.stdout}")
        cls.wheel = built.stdout.strip().splitlines()[-1]
        cls.daemon = Daemon("--page_size=4", "--kv_preset=tiny-draft",
                            "--device_pages_per_rank=32", "--host_pages_per_rank=32")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def _venv(self, name, *flags):
        venv = os.path.join(self.dir, name)
        made = _run([PYTHON, "-m", "venv", *flags, venv])
        self.assertEqual(made.returncode, 0, made.stdout)
        return venv

    def _smoke(self, venv):
        """Runs SMOKE and the replay entry points in `venv`; returns the
        versions SMOKE reports."""
        python = os.path.join(venv, "bin", "python")
        script = os.path.join(self.dir, "smoke.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SMOKE)
        WheelTest.base += 1000
        ran = _run([python, script, self.daemon.socket, str(self.base)], cwd=self.dir,
                   timeout=120)
        self.assertEqual(ran.returncode, 0,
                         f"{ran.stdout}\n(hicached exit status: {self.daemon.process.poll()}; "
                         f"its log:\n{self.daemon.log()})")
        report = json.loads(ran.stdout.strip().splitlines()[-1])
        self.assertTrue(report["module"].startswith(venv), report)
        # The replay tool runs from the installed package, against the daemon.
        replay = _run([python, "-m", "hicache.replay", "--socket", self.daemon.socket,
                       "--conversations", "4", "--turns", "3", "--system-tokens", "8",
                       "--user-tokens", "4", "--output-tokens", "4", "--requests", "12",
                       "--seed", str(self.base), "--json"], cwd=self.dir, timeout=120)
        self.assertEqual(replay.returncode, 0, replay.stdout)
        summary = json.loads(replay.stdout[replay.stdout.index("{"):])
        self.assertEqual((summary["requests"], summary["held_pages_at_end"]), (12, 0))
        help_run = _run([os.path.join(venv, "bin", "hicache-replay"), "--help"], cwd=self.dir,
                        timeout=60)
        self.assertEqual(help_run.returncode, 0, help_run.stdout)
        self.assertIn("--trace", help_run.stdout)
        return report

    def test_wheel_contents(self):
        import zipfile  # pylint: disable=import-outside-toplevel
        with zipfile.ZipFile(self.wheel) as wheel:
            names = set(wheel.namelist())
        for name in ("hicache/__init__.py", "hicache/client.py", "hicache/replay.py",
                     "hicache/py.typed", "hicache/errors.py", "hicache/endpoint.py",
                     "hicache/session.py", "hicache/streams.py", "hicache/items.py",
                     "hicache/pages.py", "hicache/rpc.py", "hicache/replay_workloads.py",
                     "hicache/replay_report.py",
                     "hicache/v1/hicache_pb2.py", "hicache/v1/hicache_pb2_grpc.py"):
            self.assertIn(name, names)
        # Nothing outside the package, and no health stubs of its own: they
        # come from grpcio-health-checking, a declared dependency.
        tops = {n.split("/")[0] for n in names}
        self.assertEqual({t for t in tops if not t.endswith(".dist-info")}, {"hicache"})
        self.assertFalse([n for n in names if "grpc_health" in n])
        with zipfile.ZipFile(self.wheel) as wheel:
            metadata = next(wheel.read(n).decode() for n in names
                            if n.endswith(".dist-info/METADATA"))
        self.assertRegex(metadata, r"Requires-Dist: grpcio-health-checking \(?>=1\.51")

    def test_debian_grpcio_and_protobuf(self):
        venv = self._venv("debian", "--system-site-packages")
        pip = os.path.join(venv, "bin", "pip")
        # Debian has no grpcio-health-checking: the one package fetched from
        # PyPI, at Debian's grpcio version (a pure-Python wheel); everything
        # else must come from Debian's packages (--no-index).
        import grpc  # pylint: disable=import-outside-toplevel
        wheelhouse = os.path.join(self.dir, "wheelhouse")
        cache = _pip_cache()
        cache_args = ["--cache-dir", cache] if cache else ["--no-cache-dir"]
        try:
            fetched = _run([pip, "download", "--no-deps", "--dest", wheelhouse, "--timeout",
                            "10", "--retries", "1", *cache_args,
                            f"grpcio-health-checking=={grpc.__version__}"], timeout=120)
        except subprocess.TimeoutExpired:
            self.skipTest("PyPI is not reachable for grpcio-health-checking: over 120s")
        if fetched.returncode != 0:
            reason = fetched.stdout.strip().splitlines()[-1:] or ["no output"]
            print(f"\n  SKIP: PyPI is not reachable: {reason[0]}", file=sys.stderr)
            self.skipTest(f"PyPI is not reachable for grpcio-health-checking: {reason[0]}")
        installed = _run([pip, "install", "--no-index", "--find-links", wheelhouse,
                          self.wheel])
        self.assertEqual(installed.returncode, 0, installed.stdout)
        report = self._smoke(venv)
        print(f"\n  debian venv: {report}", file=sys.stderr)
        self.assertTrue(report["grpcio"].startswith("1.51"), report)
        # The package is typed (py.typed): a strictly checked scheduler
        # script that uses it passes mypy --strict (Debian's mypy, looking
        # into the venv's site-packages).
        script = os.path.join(self.dir, "typed_scheduler.py")
        with open(script, "w") as f:
            f.write(TYPED_SCRIPT)
        checked = _run([PYTHON, "-m", "mypy", "--strict", "--no-incremental",
                        "--python-executable", os.path.join(venv, "bin", "python"), script],
                       cwd=self.dir)
        self.assertEqual(checked.returncode, 0, checked.stdout)

    def test_newest_grpcio_and_protobuf_from_pypi(self):
        cache = _pip_cache()
        cache_args = ["--cache-dir", cache] if cache else ["--no-cache-dir"]
        venv = self._venv("pypi")
        pip = os.path.join(venv, "bin", "pip")
        try:
            probe = _run([pip, "download", "--no-deps", "--dest",
                          os.path.join(self.dir, "probe"), "--timeout", "10",
                          "--retries", "1", *cache_args, "protobuf"], timeout=120)
        except subprocess.TimeoutExpired:
            print("\n  SKIP: PyPI is not reachable: the probe took over 120s",
                  file=sys.stderr)
            self.skipTest("PyPI is not reachable: the probe took over 120s")
        if probe.returncode != 0:
            reason = probe.stdout.strip().splitlines()[-1:] or ["no output"]
            print(f"\n  SKIP: PyPI is not reachable: {reason[0]}", file=sys.stderr)
            self.skipTest(f"PyPI is not reachable: {reason[0]}")
        # PyPI answered the probe, but it is still someone else's service: a
        # download that fails or stalls half-way is a skip that says so, not
        # a failure of the wheel. Anything else (a resolver conflict, a bad
        # wheel) fails.
        try:
            installed = _run([pip, "install", "--upgrade", "--timeout", "30",
                              "--retries", "2", *cache_args, self.wheel, "grpcio",
                              "protobuf"], timeout=_PYPI_INSTALL_SECONDS)
        except subprocess.TimeoutExpired:
            print(f"\n  SKIP: PyPI install took over {_PYPI_INSTALL_SECONDS}s",
                  file=sys.stderr)
            self.skipTest(f"PyPI install took over {_PYPI_INSTALL_SECONDS}s")
        if installed.returncode != 0 and _network_failure(installed.stdout):
            reason = _network_failure(installed.stdout)
            print(f"\n  SKIP: PyPI download failed: {reason}", file=sys.stderr)
            self.skipTest(f"PyPI download failed: {reason}")
        self.assertEqual(installed.returncode, 0, installed.stdout)
        report = self._smoke(venv)
        print(f"\n  PyPI venv: {report}", file=sys.stderr)
        self.assertGreaterEqual(int(report["protobuf"].split(".")[0]), 5, report)


if __name__ == "__main__":
    unittest.main()
