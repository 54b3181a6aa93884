"""README.md stays runnable in a plain checkout: every command in its code
blocks is either run here, against the binaries Bazel built from this tree
(`tools/dev run` and `tools/dev ctl` are those binaries behind a build), or
named with the test that covers it (packaging, root and systemd). A command
this file does not know fails the test, so a new README command comes with
its check. Nothing outside the repository is read: the runfiles tree is a
plain checkout's files, with no ../shared beside it.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

import hicache

README = "README.md"
HICACHED = os.environ["HICACHED"]
HICACHECTL = os.path.join(os.path.dirname(os.path.dirname(HICACHED)), "client", "hicachectl")

# Commands another test covers, by the test (a Bazel target or a tool), and
# why they do not run here.
COVERED_ELSEWHERE = {
    "tools/dev test": "the suite this test is part of (.ci/run calls it)",
    "tools/dev package": "//tests/packaging:deb_package_test, //tests/python:python_wheel_test",
    "python3 -m venv ~/venvs/sched": "//tests/python:python_wheel_test (venvs, pip)",
    "~/venvs/sched/bin/pip install dist/hicache-*.whl": "//tests/python:python_wheel_test",
    "sudo apt install ./dist/hicached_*.deb":
        "//tests/packaging:deb_package_test (unpacked into a root, its daemon run) and "
        "tools/fresh_debian_check (apt install in a new Debian root)",
    "sudoedit /etc/hicached/hicached.flags": "//tests/deploy:k8s_manifests_test checks every "
                                             "flag of the packaged flagfile",
    "sudo systemctl enable --now hicached": "//tests/deploy:systemd_unit_test, "
                                            "tools/fresh_debian_check",
    'sudo usermod -aG hicache "$USER"': "//tests/integration:hicachectl_test "
                                        "(PermissionDeniedSaysWhatToDo)",
    "hicachectl --socket=/run/hicached/hicached.sock health":
        "tools/fresh_debian_check (the packaged daemon's socket); run here on a test socket",
}


def readme_commands(text):
    """Each command of README's indented code blocks, as (command, comment),
    with continuation lines (an open quote) joined."""
    commands = []
    lines = text.split("\n")
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            block = []
            while i < len(lines) and (lines[i].startswith("    ") or (
                    not lines[i].strip() and i + 1 < len(lines)
                    and lines[i + 1].startswith("    "))):
                block.append(lines[i][4:])
                i += 1
            pending = ""
            for raw in block:
                if pending:
                    pending += "\n" + raw
                    if raw.count("'") % 2 == 1:
                        commands.append((pending, ""))
                        pending = ""
                    continue
                if not raw.strip():
                    continue
                if raw.count("'") % 2 == 1:
                    pending = raw
                    continue
                command, _, comment = raw.partition("  #")
                commands.append((command.strip(), comment.strip()))
            continue
        i += 1
    return commands


def run(args, env=None, timeout=120, **kwargs):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=timeout, **kwargs)


class Hicached:
    """hicached with `flags` and `env`, waited for on its socket."""

    def __init__(self, socket, flags=(), env=None):
        self.socket = socket
        self.log_path = socket + ".log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([HICACHED, *flags], env=env, stderr=log)
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(socket):
                try:
                    with hicache.Client(socket, timeout=1) as client:
                        if client.health() == "SERVING":
                            return
                except hicache.HiCacheError:
                    pass
            if self.process.poll() is not None:
                raise RuntimeError(f"hicached exited: {self.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"hicached did not start: {self.log()}")

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


class ReadmeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(README) as f:
            cls.text = f.read()
        cls.commands = readme_commands(cls.text)
        cls.dir = tempfile.mkdtemp(prefix="hicache-readme-", dir="/tmp")
        # The user's default socket: $XDG_RUNTIME_DIR/hicached.sock, what a
        # bare `tools/dev run` and `tools/dev ctl` agree on.
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("HICACHE_SOCKET", "HICACHE_TARGET")}
        cls.env["XDG_RUNTIME_DIR"] = cls.dir
        cls.ran = set()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def command(self, prefix):
        """The README's one command starting with `prefix`."""
        found = [c for c, _ in self.commands if c.startswith(prefix)]
        self.assertEqual(len(found), 1, f"README commands starting {prefix!r}: {found}")
        self.ran.add(found[0])
        return found[0]

    def ctl(self, command):
        """`tools/dev ctl ARGS` as the README writes it, run as hicachectl ARGS."""
        args = self.command(command)[len("tools/dev ctl"):].split()
        return run([HICACHECTL, *args], env=self.env)

    def test_1_quick_start_against_the_default_daemon(self):
        self.assertEqual(self.command("tools/dev run"), "tools/dev run")
        daemon = Hicached(os.path.join(self.dir, "hicached.sock"), env=self.env)
        try:
            health = self.ctl("tools/dev ctl health")
            self.assertEqual((health.returncode, health.stdout.strip()), (0, "SERVING"),
                             health.stderr)
            stats = self.ctl("tools/dev ctl stats")
            self.assertEqual(stats.returncode, 0, stats.stderr)
            self.assertIn("hicached", stats.stdout)
            as_json = self.ctl("tools/dev ctl --json stats")
            self.assertEqual(as_json.returncode, 0, as_json.stderr)
            doc = json.loads(as_json.stdout)
            self.assertEqual(set(doc), {"daemon", "cache"})

            # The Python scheduler: the snippet as written (the client finds
            # the same default socket), with Debian's python3 and the tree's
            # client instead of the venv (python_wheel_test installs that).
            snippet = self.command("~/venvs/sched/bin/python -c '")
            code = snippet[snippet.index("'") + 1:snippet.rindex("'")]
            ran = run(["/usr/bin/python3", "-c", code], env=self.env)
            self.assertEqual(ran.returncode, 0, ran.stderr)
            self.assertIn("MatchResult", ran.stdout)
            # The replay example, on the trace the repository ships.
            replay = self.command("~/venvs/sched/bin/hicache-replay")
            args = replay.split()[1:]
            self.assertEqual(args[:2], ["--trace", "bench/traces/mooncake_synthetic.jsonl"])
            self.assertTrue(os.path.isfile(args[1]), f"{args[1]} is not in the repository")
            replayed = run(["/usr/bin/python3", "-m", "hicache.replay", *args], env=self.env,
                           timeout=600)
            self.assertEqual(replayed.returncode, 0, replayed.stderr[-2000:])
            self.assertIn("requests", replayed.stdout)
        finally:
            self.assertEqual(daemon.stop(), 0, daemon.log())

    def test_2_hot_restart_and_metrics(self):
        state = self.command("hicached --state_dir=")
        state_dir = os.path.join(self.dir, "state")
        socket = os.path.join(self.dir, "state.sock")
        flags = [f"--socket={socket}", "--state_dir=" + state_dir]
        self.assertEqual(state.split()[1].split("=")[0], "--state_dir")
        daemon = Hicached(socket, flags, env=self.env)
        self.assertEqual(daemon.stop(), 0, daemon.log())
        self.assertTrue(os.path.isdir(state_dir))

        metrics = self.command("hicached --metrics_address=")
        self.assertEqual(metrics, "hicached --metrics_address=127.0.0.1:9464")
        curl = self.command("curl -s http://127.0.0.1:9464/metrics")
        socket = os.path.join(self.dir, "metrics.sock")
        # Port 0 instead of 9464 (another test may hold it); the log names
        # the port taken.
        daemon = Hicached(socket, [f"--socket={socket}", "--metrics_address=127.0.0.1:0"],
                          env=self.env)
        try:
            port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", daemon.log())
            self.assertIsNotNone(port, daemon.log())
            url = curl.split()[2].replace("9464", port.group(1))
            body = urllib.request.urlopen(url, timeout=30).read().decode()
            pattern = curl.split("grep ")[1]
            self.assertTrue([line for line in body.splitlines() if pattern in line], body[:500])
            # The packaged path's last step, on this socket.
            packaged = self.command("hicachectl --socket=/run/hicached/hicached.sock health")
            args = packaged.replace("/run/hicached/hicached.sock", socket).split()[1:]
            health = run([HICACHECTL, *args], env=self.env)
            self.assertEqual(health.stdout.strip(), "SERVING", health.stderr)
        finally:
            self.assertEqual(daemon.stop(), 0, daemon.log())

    def test_3_synopsis_matches_the_help(self):
        synopsis = self.command("hicachectl [--socket=PATH")
        helped = run([HICACHECTL, "--help"])
        for option in re.findall(r"--\w+", synopsis):
            self.assertIn(option, helped.stdout + helped.stderr)

    def test_4_every_command_is_run_or_covered(self):
        known = set(COVERED_ELSEWHERE)
        unknown = []
        for command, _ in self.commands:
            if command in known or command in self.ran:
                continue
            unknown.append(command)
        self.assertEqual(unknown, [], "README commands neither run by tests/python/"
                         "test_readme.py nor listed in its COVERED_ELSEWHERE")
        for command in COVERED_ELSEWHERE:
            self.assertIn(command, [c for c, _ in self.commands],
                          f"COVERED_ELSEWHERE names {command!r}, which README no longer has")

    def test_5_nothing_outside_the_repository(self):
        # A plain clone has nothing beside it: no ../ path in README or docs.
        for path in [README] + [os.path.join("docs", n) for n in sorted(os.listdir("docs"))
                                if n.endswith(".md")]:
            with open(path) as f:
                text = f.read()
            outside = re.findall(r"(?<![\w.])\.\./(?!deploy/|README|docs/|bench/|tools/|"
                                 r"client/|daemon/|tests/|proto/|packaging/)\S+", text)
            self.assertEqual(outside, [], path)


if __name__ == "__main__":
    unittest.main()
