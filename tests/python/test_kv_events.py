"""KV events against real daemons (docs/kv-events.md): a Python subscriber
(pyzmq + msgpack, as a router would) rebuilds, from the events alone, the
set of (topic, block hash, medium) the daemon holds, and compares it with
DumpTree at quiescence. The daemon runs its default policies (write_ahead +
tinylfu) with small pools, so the workload (a Mooncake trace through
hicache-replay, plus a second namespace that declares its own instance and
model) causes device and host evictions and load-backs; then a SIGKILL and
a hot restart. Checked at C = 1 and C = 4, by a subscriber that listened
from the start and, after the restart, by one that joined late and caught
up through the replay socket.

Every BlockStored is also checked against the documented hash (XXH3-64,
seeded by the namespace, chained over little-endian int32 tokens), so the
subscriber's hashes are computed independently of the daemon's code."""

import os
import struct
import subprocess
import sys
import tempfile
import threading
import unittest

import msgpack
import xxhash
import zmq

import hicache
from hicache.client import pb
from daemon_fixture import Daemon

PAGE, BLOCK = 64, 16
INSTANCE = "testnode"
END_SEQ = -1


def topic_of(ns, declared=None):
    """The daemon's default topic for `ns` unless `declared` maps it."""
    if declared and ns in declared:
        return declared[ns]
    return f"kv@{INSTANCE}@{ns or 'default'}"


def seed_of(ns):
    return xxhash.xxh3_64_intdigest(ns.encode(), seed=0)


def chain(previous, tokens):
    """The hashes of whole blocks of `tokens` after a block hashed `previous`."""
    out = []
    for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        previous = xxhash.xxh3_64_intdigest(
            struct.pack(f"<{BLOCK}i", *tokens[i:i + BLOCK]), seed=previous)
        out.append(previous)
    return out


class Subscriber:
    """Collects every batch of the PUB socket (topic, seq, payload) in arrival
    order; fills gaps from the replay socket on request."""

    def __init__(self, endpoint, replay_endpoint):
        self.ctx = zmq.Context()
        self.replay_endpoint = replay_endpoint
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.cond = threading.Condition()
        self.arrived = []  # (topic, seq, payload), in arrival order.
        self.batches = {}  # (topic, seq) -> payload.
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.sub, zmq.POLLIN)
        while not self.stopped:
            if not poller.poll(100):
                continue
            topic, seq, payload = self.sub.recv_multipart()
            self._add(topic.decode(), struct.unpack(">q", seq)[0], payload, live=True)

    def _add(self, topic, seq, payload, live):
        with self.cond:
            if live:
                self.arrived.append((topic, seq, payload))
            self.batches.setdefault((topic, seq), payload)
            self.cond.notify_all()

    def replay(self, start=0, topic=None):
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        frames = [b"", struct.pack(">q", start)]
        if topic is not None:
            frames.append(topic.encode())
        dealer.send_multipart(frames)
        count = 0
        while True:
            empty, topic_b, seq_b, payload = dealer.recv_multipart()
            seq = struct.unpack(">q", seq_b)[0]
            if seq == END_SEQ:
                break
            self._add(topic_b.decode(), seq, payload, live=False)
            count += 1
        dealer.close()
        return count

    def wait(self, predicate):
        with self.cond:
            while not predicate():
                self.cond.wait()

    def close(self):
        self.stopped = True
        self.thread.join()
        self.sub.close(linger=0)
        self.ctx.term()


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float) and dp_rank == 0, batch
    return events


class Index:
    """A router's view: (topic, hash, medium), from batches applied in each
    topic's sequence order. Records every contradiction."""

    def __init__(self, declared):
        self.held = set()
        self.errors = []
        self.counts = {}  # (event type, medium) -> blocks.
        self.namespaces = {t: ns for ns, t in declared.items()}

    def apply(self, topic, events):
        ns = self.namespaces.get(topic)
        if ns is None:
            ns = topic.split("@", 2)[2]
            ns = "" if ns == "default" else ns
        for e in events:
            kind = e["type"]
            key = (kind, e.get("medium"))
            self.counts[key] = self.counts.get(key, 0) + len(e.get("block_hashes", [None]))
            if kind == "AllBlocksCleared":
                self.held = {k for k in self.held if k[0] != topic}
            elif kind == "BlockStored":
                expected_keys = ["type", "block_hashes", "parent_block_hash", "token_ids",
                                 "block_size", "lora_id", "medium", "lora_name"]
                if list(e) != expected_keys:
                    self.errors.append(f"BlockStored keys {list(e)}")
                if e["block_size"] != BLOCK or e["lora_id"] is not None:
                    self.errors.append(f"bad BlockStored {e}")
                parent = e["parent_block_hash"]
                want = chain(seed_of(ns) if parent is None else parent, e["token_ids"])
                if want != e["block_hashes"]:
                    self.errors.append(f"hashes do not follow from the tokens on {topic}")
                for h in e["block_hashes"]:
                    key = (topic, h, e["medium"])
                    if key in self.held:
                        self.errors.append(f"stored twice {key}")
                    self.held.add(key)
            elif kind == "BlockRemoved":
                if list(e) != ["type", "block_hashes", "medium"]:
                    self.errors.append(f"BlockRemoved keys {list(e)}")
                for h in e["block_hashes"]:
                    key = (topic, h, e["medium"])
                    if key not in self.held:
                        self.errors.append(f"removed but not stored {key}")
                    self.held.discard(key)
            else:
                self.errors.append(f"unknown event {kind}")


def build_index(batches, declared, skip_topics=()):
    """Applies each topic's batches from seq 0, in order, without gaps."""
    index = Index(declared)
    topics = sorted({t for t, _ in batches if t not in skip_topics})
    for topic in topics:
        seqs = sorted(s for t, s in batches if t == topic)
        if seqs != list(range(len(seqs))):
            index.errors.append(f"{topic}: sequence numbers {seqs[:5]}... have a gap")
            continue
        for seq in seqs:
            index.apply(topic, decode(batches[(topic, seq)]))
    return index


def dump_expected(client, declared, skip_namespaces=()):
    """(topic, hash, medium) of every whole page of every node, per its tier."""
    nodes, token = [], ""
    while True:
        page = client.call("DumpTree", pb.DumpTreeRequest(
            all_namespaces=True, include_tokens=True, limit=10000, page_token=token))
        nodes.extend(page.nodes)
        token = page.next_page_token
        if not token:
            break
    by_id = {n.id: n for n in nodes}
    ends = {}  # node id -> hash of its last whole block

    def end_hash(n):
        if n.id in ends:
            return ends[n.id]
        parent = by_id.get(n.parent)
        start = seed_of(n.namespace) if parent is None else end_hash(parent)
        whole = len(n.tokens) // PAGE * PAGE
        hashes = chain(start, list(n.tokens[:whole]))
        ends[n.id] = hashes[-1] if hashes else start
        return ends[n.id]

    expected = set()
    for n in nodes:
        if n.namespace in skip_namespaces or len(n.tokens) < PAGE:
            continue
        parent = by_id.get(n.parent)
        start = seed_of(n.namespace) if parent is None else end_hash(parent)
        whole = len(n.tokens) // PAGE * PAGE
        for h in chain(start, list(n.tokens[:whole])):
            if n.tier in ("device", "both"):
                expected.add((topic_of(n.namespace, declared), h, "GPU"))
            if n.tier in ("host", "both"):
                expected.add((topic_of(n.namespace, declared), h, "CPU"))
    return expected


class KvEventsTest:
    """Mixed into one TestCase per CP size."""
    CP = 1

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hicache-kv-", dir="/tmp")
        self.endpoint = f"ipc://{self.dir}/events"
        self.replay_endpoint = f"ipc://{self.dir}/replay"
        # Small pools: the 300-request trace evicts from both tiers.
        self.daemon = Daemon(
            f"--page_size={PAGE}", "--kv_preset=micro", f"--cp_size={self.CP}",
            f"--device_pages_per_rank={1 + 480 // self.CP}",
            f"--host_pages_per_rank={960 // self.CP}",
            f"--state_dir={self.dir}/state",
            f"--kv_events_endpoint={self.endpoint}",
            f"--kv_events_replay_endpoint={self.replay_endpoint}",
            f"--kv_events_block_size={BLOCK}", f"--kv_events_instance={INSTANCE}",
            "--kv_events_buffer=1000000", "--kv_events_max_queue=10000000")
        self.client = hicache.Client(self.daemon.socket, timeout=30)
        self.probes = 0

    def tearDown(self):
        self.client.close()
        self.daemon.stop()

    def probe(self, subscriber, ns=""):
        """Inserts a fresh page in `ns` and waits until its event arrives;
        returns that batch's arrival position."""
        self.probes += 1
        tokens = [900000000 + self.probes] * PAGE
        with self.client.session(f"probe-{self.probes}", namespace=ns) as s:
            pages = s.allocate(1)
            s.insert(tokens, pages)
        want = chain(seed_of(ns), tokens)
        topic = topic_of(ns)

        def arrived():
            for i, (t, _, payload) in enumerate(subscriber.arrived):
                if t == topic and any(e.get("block_hashes") == want
                                      for e in decode(payload)):
                    return i + 1
            return 0
        subscriber.wait(lambda: arrived() > 0)
        return arrived()

    def sync(self, subscriber):
        """Waits for the subscription to reach the daemon: probes until one
        arrives (a PUB socket drops what it sends before that)."""
        with subscriber.cond:
            before = len(subscriber.arrived)
        while True:
            self.probes += 1
            tokens = [800000000 + self.probes] * PAGE
            with self.client.session("sync", namespace="sync") as s:
                s.insert(tokens, s.allocate(1))
            with subscriber.cond:
                if subscriber.cond.wait_for(lambda: len(subscriber.arrived) > before, 0.2):
                    return

    def quiescent_compare(self, subscriber, declared):
        """Makes room (so the probes evict nothing and write-ahead has no
        round to run), then probe, dump, probe again: if nothing but the
        second probe arrived in between, the tree did not change across the
        dump, and the index of everything before the first probe must equal
        it."""
        lanes = self.CP
        self.client.evict(device_pages_per_lane=[64 // lanes] * lanes)
        first = self.probe(subscriber)
        expected = dump_expected(self.client, declared, skip_namespaces=("sync",))
        second = self.probe(subscriber)
        with subscriber.cond:
            between = subscriber.arrived[first:second - 1]
            later = {(t, s) for t, s, _ in subscriber.arrived[first:]}
            batches = {k: v for k, v in subscriber.batches.items() if k not in later}
        self.assertEqual(between, [], "the tree changed across the dump")
        index = build_index(batches, declared, skip_topics=(topic_of("sync"),))
        self.assertEqual(index.errors, [])
        self.assertEqual(sorted(index.held - expected)[:5], [])
        self.assertEqual(sorted(expected - index.held)[:5], [])
        self.counts = index.counts
        return expected

    def workload(self):
        subprocess.run(
            [sys.executable, "-m", "hicache.replay", "--socket", self.daemon.socket,
             "--trace", os.environ["HICACHE_TEST_TRACE"], "--requests", "300",
             "--backup-lag", "2", "--json"],
            check=True, capture_output=True, text=True)
        # A second namespace under its own declared identity.
        with self.client.session("tenant-b", namespace="tenant-b", event_instance="pod-b",
                                 event_model="model-b") as s:
            for i in range(8):
                tokens = [i * 1000 + j for j in range(3 * PAGE + 5)]
                s.insert(tokens, s.allocate(4))

    def test_index_matches_the_tree_across_a_hot_restart(self):
        declared = {"tenant-b": "kv@pod-b@model-b"}
        subscriber = Subscriber(self.endpoint, self.replay_endpoint)
        try:
            self.sync(subscriber)
            self.workload()
            stats = self.client.stats()
            self.assertGreater(stats.device_evicted_pages, 0)
            self.assertGreater(stats.host_evicted_pages + stats.host_copies_dropped, 0)
            self.assertGreater(stats.loads_done, 0)
            # The router query: tenant-b's last sequence is on device.
            hits = self.client.query_tiers([("tenant-b", [7000 + j for j in range(3 * PAGE)]),
                                            ("other", [7000 + j for j in range(3 * PAGE)])])
            self.assertEqual(hits, [(3 * PAGE, 0), (0, 0)])
            expected = self.quiescent_compare(subscriber, declared)
            self.assertTrue(any(t == "kv@pod-b@model-b" for t, _, _ in expected))
            self.assertFalse(any(t == topic_of("tenant-b") for t, _, _ in expected))
            self.assertTrue(any(m == "CPU" for _, _, m in expected))
            # Both tiers stored and removed blocks along the way.
            for key in (("BlockStored", "GPU"), ("BlockStored", "CPU"),
                        ("BlockRemoved", "GPU"), ("BlockRemoved", "CPU")):
                self.assertGreater(self.counts.get(key, 0), 100, (key, self.counts))
        finally:
            subscriber.close()

        # Crash and restart on the same state dir: the recovered host tier is
        # announced after a clear; a subscriber that joins now catches up
        # through the replay socket. The new daemon knows no declaration.
        self.daemon.kill()
        self.daemon.start()
        self.client.close()
        self.client = hicache.Client(self.daemon.socket, timeout=30)
        late = Subscriber(self.endpoint, self.replay_endpoint)
        try:
            self.sync(late)
            self.assertGreater(late.replay(0), 0)
            expected = self.quiescent_compare(late, {})
            self.assertTrue(any(m == "CPU" for _, _, m in expected))
            first = {t: decode(p)[0]["type"] for (t, s), p in late.batches.items() if s == 0}
            self.assertTrue(first)
            self.assertEqual(set(first.values()), {"AllBlocksCleared"})
        finally:
            late.close()


class KvEventsC1Test(KvEventsTest, unittest.TestCase):
    CP = 1


class KvEventsC4Test(KvEventsTest, unittest.TestCase):
    CP = 4


if __name__ == "__main__":
    unittest.main()
