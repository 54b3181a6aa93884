"""A real hicached with --metrics_address=127.0.0.1:0, and a plain-socket
HTTP scrape of its /metrics."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import hicache

# One sample line: name, optional {labels}, value.
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MetricsDaemon:
    """hicached on a temporary socket with metrics on a port it picks; the
    port is read from its start log."""

    def __init__(self, *flags):
        self.dir = tempfile.mkdtemp(prefix="hicache-metrics-", dir="/tmp")
        self.socket = os.path.join(self.dir, "d.sock")
        self.log_path = os.path.join(self.dir, "stderr.log")
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [os.environ["HICACHED"], f"--socket={self.socket}",
             "--metrics_address=127.0.0.1:0", *flags],
            stderr=self.log)
        self.port = None
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.port is None:
                found = re.search(r"Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics",
                                  self.stderr())
                if found:
                    self.port = int(found.group(1))
            if self.port is not None and os.path.exists(self.socket):
                try:
                    with hicache.Client(self.socket, timeout=1) as client:
                        if client.health() == "SERVING":
                            return
                except hicache.HiCacheError:
                    pass
            if self.process.poll() is not None:
                raise RuntimeError(self.stderr())
            time.sleep(0.05)
        raise RuntimeError("hicached did not start:\n" + self.stderr())

    def stderr(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def scrape_text(self, path="/metrics"):
        return http_get(self.port, path)[1]

    def scrape(self):
        return parse(self.scrape_text())

    def scrape_until(self, predicate, timeout=10.0):
        """Scrapes until predicate(samples) holds (the namespace series are
        refreshed at most once a second); returns the last samples."""
        deadline = time.time() + timeout
        while True:
            samples, _ = self.scrape()
            if predicate(samples) or time.time() > deadline:
                return samples
            time.sleep(0.1)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


def http_get(port, path="/metrics", timeout=10):
    """A plain HTTP/1.0 GET over a socket: (status code, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body.decode()


def parse(text):
    """{(name, frozenset(labels.items())): value} of every sample, and the
    families' declared types {name: type}."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if m is None:
            raise ValueError(f"not a sample line: {line!r}")
        labels = frozenset(LABEL.findall(m.group(3) or ""))
        samples[(m.group(1), labels)] = float(m.group(4))
    return samples, types


def value(samples, name, **labels):
    """The sample `name` with exactly these labels (0.0 when absent)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples, name, **labels):
    """Sum of the samples `name` whose labels include these."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))
