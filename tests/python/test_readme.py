"""README.md stays runnable in a plain checkout: every command in its code
blocks is either run here, against the binaries Bazel built from this tree
(`tools/dev run` and `tools/dev ctl` are those binaries behind a build), or
named with the test that covers it (packaging, root and systemd). A command
this file does not know fails the test, so a new README command comes with
its check. Nothing outside the repository is read: the runfiles tree is a
plain checkout's files, with no ../shared beside it.

docs/ is checked too: no path leaves the repository, and every command line
there (and in README) that runs hicached, hicachectl, hicache.replay,
tools/dev, bazel or a Bazel output names only flags, subcommands, targets
and repository paths that exist (docs/integrations.md's snippets run in
//tests/python:python_integrations_test).
"""

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest
import urllib.request

from daemon_fixture import Daemon

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


def joined(commands):
    """Command lines with their backslash continuations joined."""
    out, pending = [], ""
    for command, _ in commands:
        for line in command.split("\n"):
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append(pending + line)
            pending = ""
    if pending:
        out.append(pending)
    return out


class DocCommands:
    """What a documented command may name: hicached's and hicache.replay's
    flags, hicachectl's subcommands and options, tools/dev's subcommands,
    Bazel targets, and paths in the source tree at `source`."""

    TOP = ("bench/", "tools/", "deploy/", "docs/", "fuzz/", "client/", "daemon/", "tests/",
           "proto/", "packaging/", "cuda_kernels/", "version/")

    def __init__(self, source):
        self.source = source
        full = run([HICACHED, "--helpfull"])
        self.hicached_flags = set(re.findall(r"--(\w+) \(", full.stdout + full.stderr))
        assert "socket" in self.hicached_flags, full.stdout[:500]
        ctl = run([HICACHECTL, "--help"]).stdout
        self.ctl_commands = set(re.findall(r"^  ([a-z][a-z-]+) {2,}", ctl, re.M))
        self.ctl_help = {None: ctl}
        replay = run(["/usr/bin/python3", "-m", "hicache.replay", "--help"])
        self.replay_flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", replay.stdout))
        with open(os.path.join(source, "tools", "dev")) as f:
            self.dev_commands = set(re.findall(r"^    ([a-z-]+)\) ", f.read(), re.M))

    def ctl_options(self, command):
        if command not in self.ctl_help:
            self.ctl_help[command] = run([HICACHECTL, command, "--help"]).stdout
        return self.ctl_help[None] + self.ctl_help[command]

    def target_exists(self, package, name):
        build = os.path.join(self.source, package, "BUILD.bazel")
        if not os.path.isfile(build):
            return False
        with open(build) as f:
            return f'name = "{name}"' in f.read()

    def check(self, line):
        """None when `line` runs nothing this checks, else its problems."""
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            return None
        while tokens and (re.match(r"^[A-Z_]+=", tokens[0]) or tokens[0] in ("sudo", "time")):
            tokens = tokens[1:]
        if tokens[:1] == ["nice"]:
            tokens = tokens[3:]
        if not tokens:
            return None
        program, args = tokens[0], tokens[1:]
        problems = []
        for token in args:
            value = token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
            if value.startswith(self.TOP) and not re.search(r"[<>$]|\.\.\.", value):
                if not glob.glob(os.path.join(self.source, value)):
                    problems.append(f"no {value} in the repository")
        if program == "hicached" or program.endswith("/hicached"):
            for token in args:
                name = token[2:].split("=", 1)[0]
                if token.startswith("--") and name not in self.hicached_flags:
                    problems.append(f"hicached has no --{name}")
        elif program == "hicachectl" or program.endswith("/hicachectl"):
            words = [t for t in args if not t.startswith("-")]
            command = next((w for w in words if w in self.ctl_commands), None)
            if words and command is None and not words[0].startswith(("[", "<")):
                problems.append(f"hicachectl has no command {words[0]}")
            for token in args:
                token = token.strip("[]")
                if token.startswith("--") and token.split("=")[0] not in self.ctl_options(command):
                    problems.append(f"hicachectl {command or ''} has no {token.split('=')[0]}")
        elif program == "tools/dev":
            if args and args[0] not in self.dev_commands:
                problems.append(f"tools/dev has no command {args[0]}")
        elif program == "bazel":
            for token in args:
                target = re.match(r"^//([\w/]*):([\w.-]+)$", token)
                if target and not self.target_exists(*target.groups()):
                    problems.append(f"no Bazel target {token}")
        elif re.match(r"^bazel-(bin|out/[^/]+/bin)/", program):
            path = re.sub(r"^bazel-(bin|out/[^/]+/bin)/", "", program)
            if not self.target_exists(os.path.dirname(path), os.path.basename(path)):
                problems.append(f"no Bazel target for {program}")
        elif program in ("python3", "/usr/bin/python3") and args[:2] == ["-m", "hicache.replay"]:
            for token in args[2:]:
                if token.startswith("--") and token.split("=")[0] not in self.replay_flags:
                    problems.append(f"hicache.replay has no {token.split('=')[0]}")
        else:
            return None if not problems else problems
        return problems


def run(args, env=None, timeout=120, **kwargs):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=timeout, **kwargs)


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
        daemon = Daemon(socket=os.path.join(self.dir, "hicached.sock"), env=self.env,
                        socket_flag=False)
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
        self.assertEqual(state.split()[1].split("=")[0], "--state_dir")
        daemon = Daemon("--state_dir=" + state_dir, socket=socket, env=self.env)
        self.assertEqual(daemon.stop(), 0, daemon.log())
        self.assertTrue(os.path.isdir(state_dir))

        metrics = self.command("hicached --metrics_address=")
        self.assertEqual(metrics, "hicached --metrics_address=127.0.0.1:9464")
        curl = self.command("curl -s http://127.0.0.1:9464/metrics")
        socket = os.path.join(self.dir, "metrics.sock")
        # Port 0 instead of 9464 (another test may hold it); the log names
        # the port taken.
        # --log_level=info: the start log names the metrics port.
        daemon = Daemon("--metrics_address=127.0.0.1:0", "--log_level=info", socket=socket,
                        env=self.env)
        try:
            port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics",
                             daemon.log(tail=1 << 20))
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

    def test_6_docs_commands_name_what_exists(self):
        """Every command line in README and docs/ that runs hicached,
        hicachectl, hicache.replay, tools/dev, bazel or a Bazel output names
        only flags, subcommands, targets and repository paths that exist."""
        source = os.path.dirname(os.path.realpath(README))
        if not os.path.isdir(os.path.join(source, "docs")):
            self.skipTest(f"no source tree behind {README} (remote execution?)")
        checker = DocCommands(source)
        pages = [README] + [os.path.join("docs", n) for n in sorted(os.listdir("docs"))
                            if n.endswith(".md")]
        checked = 0
        for page in pages:
            with open(page) as f:
                text = f.read()
            for line in joined(readme_commands(text)):
                problems = checker.check(line)
                if problems is not None:
                    checked += 1
                    self.assertEqual(problems, [], f"{page}: {line}")
        self.assertGreater(checked, 30)

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
