"""Starts a real hicached on a temporary unix socket for a test class."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import hicache


class Daemon:
    """A hicached on `socket` (a fresh temporary one unless given). kill()
    and start() restart it on the same socket (a daemon restart). With
    socket_flag=False no --socket is passed: `socket` is where the daemon's
    own default (under `env`) puts it."""

    def __init__(self, *flags, socket=None, start=True, env=None, socket_flag=True):
        self.dir = tempfile.mkdtemp(prefix="hicache-py-", dir="/tmp")
        self.socket = socket or os.path.join(self.dir, "d.sock")
        self.flags = flags
        self.env = env
        self.socket_flag = socket_flag
        self.process = None
        if start:
            self.start()

    def start(self):
        # The log goes to a file: a pipe nobody reads would block the daemon
        # once it fills.
        self.log_path = os.path.join(self.dir, "hicached.log")
        with open(self.log_path, "ab") as log:
            socket_flag = [f"--socket={self.socket}"] if self.socket_flag else []
            self.process = subprocess.Popen(
                [os.environ["HICACHED"], *socket_flag, "--log_level=warn", *self.flags],
                stderr=log, env=self.env)
        deadline = time.time() + 20
        while time.time() < deadline:
            if os.path.exists(self.socket):
                try:
                    with hicache.Client(self.socket, timeout=1) as client:
                        if client.health() == "SERVING":
                            return
                except hicache.HiCacheError:
                    pass
            if self.process.poll() is not None:
                raise RuntimeError(self.log())
            time.sleep(0.05)
        raise RuntimeError("hicached did not start")

    def log(self, tail: int = 4000) -> str:
        """The end of the daemon's log (stderr)."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-tail:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self):
        """SIGKILL: the daemon dies as in a crash (the socket file stays)."""
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
        return code
