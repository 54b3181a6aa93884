"""hicache-replay: replays a Mooncake-format trace through a running hicached.

Each request behaves as a scheduler and its workers would: load-back (match +
host hits), allocate the rest, back it up per layer, insert with the backup,
release the hit. Reports L1 and L1+L2 hit rates per block (a request's walk
stops at its first block missing from both tiers), backups, loads,
evictions, client-observed latency percentiles per RPC and a hit-rate table
over trace time.

    python3 -m hicache.replay --socket /tmp/hicached.sock --trace trace.jsonl
"""

import argparse
import csv
import json
import sys
import time
from collections import defaultdict

import hicache


def read_trace(path, limit=None):
    requests = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                requests.append((int(record["timestamp"]), list(record["hash_ids"])))
            except (ValueError, KeyError) as e:
                raise SystemExit(f"{path}:{number}: not a Mooncake trace record ({e})")
            if limit is not None and len(requests) >= limit:
                break
    return requests


def percentile(values, q):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Replayer:
    def __init__(self, client, session, stream, block_tokens, page_size, num_steps):
        self.client = client
        self.session = session
        self.stream = stream
        self.block = block_tokens
        self.page = page_size
        self.steps = num_steps
        self.latency = defaultdict(list)  # RPC -> seconds
        self.blocks = self.l1_blocks = self.l12_blocks = 0

    def _timed(self, name, fn, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.latency[name].append(time.perf_counter() - start)

    def run_request(self, hash_ids):
        tokens = [h * self.block + i for h in hash_ids for i in range(self.block)]
        load = self._timed("LoadBack", self.session.load_back, tokens)
        loaded = load.loaded_tokens if load.ok else 0
        self.blocks += len(hash_ids)
        self.l1_blocks += load.device_tokens // self.block
        self.l12_blocks += (load.device_tokens + loaded) // self.block
        reuse = (load.device_tokens + loaded) // self.page
        need = -(-len(tokens) // self.page) - reuse
        try:
            if need <= 0:
                return
            try:
                fresh = self._timed("Allocate", self.session.allocate, num_pages=need)
            except hicache.HiCacheError:
                return  # No room even after eviction: a miss, not an error.
            pages = load.pages[:reuse] + fresh
            (backup,) = self._timed("BackupPrepare", self.stream.prepare,
                                    [(fresh, len(tokens) - reuse * self.page)])
            if backup:
                for step in range(self.steps):
                    self.stream.layer_stored([backup], step)
            result = self._timed("Insert", self.session.insert, tokens, pages,
                                 backup_id=backup)
            if result.uncached_pages:
                self.session.free(list(result.uncached_pages))
        finally:
            if load.node:
                self._timed("Unlock", self.session.unlock, [load.node])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="hicache-replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", default=hicache.default_socket_path())
    parser.add_argument("--trace", required=True)
    parser.add_argument("--requests", type=int, default=None, help="replay at most N")
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument("--speed", type=float, default=0.0,
                        help="time scale (1 = real time, 2 = twice as fast); 0 = as fast as possible")
    parser.add_argument("--window-s", type=float, default=60.0, help="hit-rate table window")
    parser.add_argument("--csv", help="write per-window series to this CSV file")
    parser.add_argument("--plot", help="draw hit rate and occupancy over time to this PNG")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)

    trace = read_trace(args.trace, args.requests)
    with hicache.Client(args.socket, timeout=60) as client:
        layout = client.layout()
        before = client.stats()
        with client.session("hicache-replay", lease_ms=60000) as session, \
                session.backup_stream() as stream:
            replay = Replayer(client, session, stream, args.block_tokens,
                              layout.geometry.page_size_tokens, layout.num_steps)
            windows = []
            start_wall = time.time()
            window_start, mark = None, (0, 0, 0)
            for timestamp, hash_ids in trace:
                if args.speed > 0:
                    delay = timestamp / 1000.0 / args.speed - (time.time() - start_wall)
                    if delay > 0:
                        time.sleep(delay)
                if window_start is None:
                    window_start = timestamp
                if timestamp - window_start >= args.window_s * 1000:
                    windows.append(_window(replay, client, window_start, mark, layout))
                    window_start, mark = timestamp, (replay.blocks, replay.l1_blocks,
                                                     replay.l12_blocks)
                replay.run_request(hash_ids)
            if window_start is not None:
                windows.append(_window(replay, client, window_start, mark, layout))
        after = client.stats()

    summary = {
        "requests": len(trace),
        "blocks": replay.blocks,
        "l1_hit_rate": replay.l1_blocks / max(1, replay.blocks),
        "l1_l2_hit_rate": replay.l12_blocks / max(1, replay.blocks),
        "backups": after.backups_committed - before.backups_committed,
        "loads": after.loads_done - before.loads_done,
        "device_evicted_pages": after.device_evicted_pages - before.device_evicted_pages,
        "host_evicted_pages": after.host_evicted_pages - before.host_evicted_pages,
        "latency_us": {name: {"p50": percentile(v, 0.5) * 1e6, "p99": percentile(v, 0.99) * 1e6,
                              "count": len(v)}
                       for name, v in sorted(replay.latency.items())},
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary, windows)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(windows[0].keys()) if windows else ["t"])
            writer.writeheader()
            writer.writerows(windows)
    if args.plot:
        _plot(windows, args.plot)
    return 0


def _window(replay, client, window_start, mark, layout):
    blocks = replay.blocks - mark[0]
    stats = client.stats()
    lanes = layout.geometry.cp_size
    device_pages = layout.geometry.device_pages_per_rank * lanes
    host_pages = layout.geometry.host_pages_per_rank * lanes
    return {
        "t_s": window_start / 1000.0,
        "blocks": blocks,
        "l1_hit_rate": (replay.l1_blocks - mark[1]) / max(1, blocks),
        "l1_l2_hit_rate": (replay.l12_blocks - mark[2]) / max(1, blocks),
        "l1_occupancy": sum(l.allocated for l in stats.lanes) / max(1, device_pages),
        "l2_occupancy": sum(l.host_used for l in stats.lanes) / max(1, host_pages),
    }


def _print_summary(s, windows):
    print(f"requests {s['requests']}, blocks {s['blocks']}")
    print(f"L1 hit rate     {100 * s['l1_hit_rate']:.2f}%")
    print(f"L1+L2 hit rate  {100 * s['l1_l2_hit_rate']:.2f}%")
    print(f"backups {s['backups']}, loads {s['loads']}, evicted pages: "
          f"device {s['device_evicted_pages']}, host {s['host_evicted_pages']}")
    print("latency (us)    p50       p99      calls")
    for name, v in s["latency_us"].items():
        print(f"  {name:<13} {v['p50']:8.1f}  {v['p99']:8.1f}  {v['count']:7d}")
    if windows:
        print("   t(s)  blocks   L1 hit  L1+L2 hit  L1 occ  L2 occ")
        for w in windows:
            print(f"{w['t_s']:7.0f} {w['blocks']:7d}  {100 * w['l1_hit_rate']:6.1f}%"
                  f"     {100 * w['l1_l2_hit_rate']:6.1f}%  {100 * w['l1_occupancy']:5.1f}%"
                  f"  {100 * w['l2_occupancy']:5.1f}%")


def _plot(windows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: apt-get install python3-matplotlib")
    t = [w["t_s"] for w in windows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    top.plot(t, [100 * w["l1_hit_rate"] for w in windows], label="L1")
    top.plot(t, [100 * w["l1_l2_hit_rate"] for w in windows], label="L1+L2")
    top.set_ylabel("hit rate (%)")
    top.legend()
    bottom.plot(t, [100 * w["l1_occupancy"] for w in windows], label="L1")
    bottom.plot(t, [100 * w["l2_occupancy"] for w in windows], label="L2")
    bottom.set_ylabel("occupancy (%)")
    bottom.set_xlabel("trace time (s)")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
