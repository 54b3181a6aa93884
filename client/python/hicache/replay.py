"""hicache-replay: replays a workload through a running hicached (API v1.1).

Workloads: a Mooncake trace (--trace: each hash id is a block of
--block-tokens tokens, no output reserve) or generated multi-turn
conversations (--conversations N: a long shared system prompt, then turns
that each extend their conversation's previous turn -- its input and its
output -- by a new user message and reserve pages for their own output;
each request picks its conversation by a Zipf law; a conversation that
reaches --turns starts over).

Each request behaves as a scheduler and its workers would, in one round trip
before the forward and one after it in the common case:

 1. Admit: match (page-floored), lock the device hit, allocate the rest of
    the input plus the output reserve and -- per the daemon's write policy
    (BACKUP_CHOICE_AUTO: write_through backs up, write_through_selective and
    write_back do not) -- prepare a per-layer backup of the new input pages.
 2. A host hit worth loading (Admit answers `load`): LoadBack with
    extend_tokens, then Allocate the rest; under write_through the replay
    prepares that backup itself on its backup stream.
 3. The forward: only when a backup id came back, the replay (playing the
    workers) sends layer_stored for every step on its backup stream
    (--backup-lag N sends them N requests later, as copies still in flight
    while later requests run).
 4. Complete: insert the input (attaching the backup, which covers exactly
    its new pages; the output is not cached, so the next turn recomputes
    it), release the locks, free the pages the tree did not take and the
    output reserve.

A deferred insert (Complete answers `deferred`: a backup in flight -- the
previous turn's, or one the daemon started itself -- blocks the node the
insert must split; the tree is unchanged and the item's pages, locks and
backup are still the session's) must be handled as a real scheduler must:
either retry the same item once the blocking backup has settled (committed
or rolled back), or give the request up -- roll back its backup, free its
pages, release its locks. What it must never do is drop the item: a
deferred item still holds its pages, locks and backup, until the session
ends. This replay retries: as
the forward is over, every lagging layer_stored is sent first (a scheduler
that holds acks back must release them, or the backup it waits for can never
commit); then Complete is called again after the backup stream's next event
or a backoff (0.2 ms, doubling up to 50 ms; --deterministic: after the
backups have settled, see below), at most --defer-retries times. If it is
still deferred the request gives up as above. The summary counts deferred
inserts, retries and give-ups, and the pages and locks the session still
holds at the end (held_pages_at_end, held_locks_at_end: both 0 unless
something leaked).

Backups complete asynchronously, so by default two runs can differ: whether
a backup has committed when the next call arrives decides hits, deferrals,
what eviction may take. --deterministic removes the timing: before every
call that changes the cache (Admit, LoadBack, Allocate, BackupPrepare,
Complete and each retry) and at the end, the replay waits until every backup
in flight in the daemon has settled, except those that wait for the replay
itself -- the request's own, not yet attached by Complete, and those whose
layer_stored --backup-lag still holds back. Lagging layer_stored are sent in
a fixed order (oldest first, once N newer backups were prepared, or all of
them at a deferred insert); the wait before the next call then waits for
them, so with a lag the wait happens as soon as they are sent. The daemon's
state at every call then depends only on the workload (conversations:
seeded by --seed) and the options: two runs against fresh daemons started
alike give identical counts (hits, backups, loads, evictions, deferrals);
latencies still vary and include the waits. The wait reads the daemon's
Stats (backups started, committed, rolled back: the daemon's own
write-through and write-back backups too, which no stream announces), woken
early by the backup stream's events, so a deterministic run needs the
daemon to itself. A backup that does not settle within --settle-timeout (a failed
copy, another client's) is counted in settle_timeouts; such a run is not
deterministic.

Reports L1 and L1+L2 hit rates (per block for a trace, a request's walk
stopping at its first block missing from both tiers; per token for
conversations), backups, loads, evictions, the whole-request latency (p50,
p99: Admit to Complete, retries included) and client-observed latency per
RPC, and a hit-rate table over trace time.

    python3 -m hicache.replay --socket /tmp/hicached.sock --trace trace.jsonl
    python3 -m hicache.replay --socket /tmp/hicached.sock --conversations 64 \\
        --requests 2000 --json
    python3 -m hicache.replay --conversations 64 --deterministic --backup-lag 8
"""

import argparse
import csv
import json
import random  # noqa: F401
import sys
import time
from collections import defaultdict, deque

import grpc

import hicache
from hicache.items import AdmitItem, CompleteItem
from hicache.pages import Pages
# The workloads and the report live in replay_workloads.py and replay_report.py;
# their names (and `random`, which only the workloads use) stay importable from here.
from hicache.replay_report import _latency, _plot, _print_summary, _window
from hicache.replay_report import percentile  # noqa: F401
from hicache.replay_workloads import (  # noqa: F401
    Request,
    conversation_requests,
    mooncake_requests,
    read_trace,
)


class Replayer:
    def __init__(self, client, session, page_size, num_steps, write_policy,
                 backup_lag=0, defer_retries=8, deterministic=False, settle_timeout=10.0):
        self.client = client
        self.session = session
        # Opened at the first backup: a stream that is open costs every call
        # some polling work, and write_back / write_through_selective
        # daemons never need it.
        self.stream = None
        self.page = page_size
        self.steps = num_steps
        self.write_through = write_policy == "write_through"
        self.backup_lag = backup_lag
        self.defer_retries = defer_retries
        self.lagging = deque()  # Backup ids whose layers are not stored yet.
        # Backups prepared (by Admit or on the stream) that no Complete has
        # attached yet: they cannot settle before it.
        self.unattached = set()
        self.deterministic = deterministic
        self.settle_timeout = settle_timeout
        self.settle_slack = 0  # Backups that never settled (see settle()).
        self.settle_wait = []  # Seconds, per settle() that had to wait.
        self.latency = defaultdict(list)  # RPC -> seconds
        self.request_latency = []  # Seconds, whole request.
        self.units = self.l1_units = self.l12_units = 0
        self.counts = defaultdict(int)

    def backup_stream(self):
        if self.stream is None:
            self.stream = self.session.backup_stream()
        return self.stream

    def close(self):
        if self.stream is not None:
            self.stream.close()

    def _store_layers(self, backup):
        stream = self.stream or self.backup_stream()
        if self.backup_lag <= 0:
            stream.layers_stored([backup], self.steps)
            return
        self.lagging.append(backup)
        while len(self.lagging) > self.backup_lag:
            stream.layers_stored([self.lagging.popleft()], self.steps)

    def flush(self):
        """Stores the layers of every lagging backup, oldest first."""
        while self.lagging:
            self.stream.layers_stored([self.lagging.popleft()], self.steps)

    def _dead(self, backup):
        """The daemon rolled `backup` back (not attached, or dropped by a
        deferred insert) or the replay did: nothing of it is awaited any
        more, and its layers are not sent."""
        self.unattached.discard(backup)
        try:
            self.lagging.remove(backup)
        except ValueError:
            pass

    def settle(self):
        """--deterministic: waits until every backup in flight in the daemon
        has settled (committed or rolled back) except those that wait for
        this replay itself -- prepared but not yet attached by a Complete,
        or whose layer_stored --backup-lag still holds back -- so that the
        next call meets a state that depends only on the calls before it.
        The daemon's Stats count every backup started, committed and rolled
        back (its own write-through and write-back backups included, which
        no stream announces); the backup stream's events wake the wait
        early. A backup that does not settle within --settle-timeout (a
        failed copy, another client's backup) is counted in settle_timeouts
        and tolerated from then on: such a run is not deterministic."""
        if not self.deterministic:
            return
        waits_for_us = len(self.unattached.union(self.lagging)) + self.settle_slack
        start = time.monotonic()
        pause, waited = 0.0001, False
        while True:
            stats = self.client.stats()
            in_flight = (stats.backups_started - stats.backups_committed
                         - stats.backups_rolled_back)
            if in_flight <= waits_for_us:
                break
            if time.monotonic() - start > self.settle_timeout:
                self.counts["settle_timeouts"] += 1
                self.settle_slack += in_flight - waits_for_us
                break
            self._wait(pause)
            pause = min(pause * 2, 0.005)
            waited = True
        if waited:
            self.settle_wait.append(time.monotonic() - start)

    def _wait(self, seconds):
        """The stream's next event, or `seconds`."""
        if self.stream is None:
            time.sleep(seconds)
        else:
            self.stream.wait_event(self.stream.events, seconds)

    def run_request(self, request):
        clock = time.perf_counter
        latency = self.latency
        self.settle()  # Not part of the request's latency.
        start = clock()
        try:
            (admitted,) = self.session.admit([AdmitItem(request.tokens, request.reserve)])
        except hicache.HiCacheError as e:
            if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            admitted = None  # Larger than the whole pool: it can never fit.
        latency["Admit"].append(clock() - start)
        self.units += request.units
        if admitted is None or not admitted.admitted:
            self.counts["not_admitted"] += 1  # No room even after eviction: a miss.
            self.request_latency.append(clock() - start)
            return
        page = self.page
        handles = [admitted.lock_handle] if admitted.lock_handle else []
        backup = admitted.backup_id
        if backup:
            self.unattached.add(backup)
        if admitted.load:
            pages, own, backup, cached = self._load(request, admitted, handles)
            if pages is None:
                self.request_latency.append(clock() - start)
                return
            self.l1_units += admitted.device_tokens // request.unit
            self.l12_units += cached // request.unit
            keep = -(-(len(request.tokens) // 4) // page)
            item = CompleteItem(request.tokens, pages[:keep], backup_id=backup,
                                lock_handles=handles, free_pages=pages[keep:])
        else:
            own = admitted.pages
            self.l1_units += admitted.device_tokens // request.unit
            self.l12_units += admitted.device_tokens // request.unit
            # The input is cached (a backup covers exactly its new pages);
            # the output reserve's own pages are freed. The hit's pages go
            # back as they came (no Python int per page).
            new = -(-(len(request.tokens) // 4) // page) - len(admitted.device_pages)
            item = CompleteItem(request.tokens, Pages(admitted.device_pages, own[:new]),
                                backup_id=backup, lock_handles=handles,
                                free_pages=own[new:])
        if backup:
            self.counts["backups_prepared"] += 1
            self._store_layers(backup)
        self._complete(item, own)
        self.request_latency.append(clock() - start)

    def _load(self, request, admitted, handles):
        """Host hit: LoadBack (with the request's extend), then Allocate the
        rest; under write_through, prepare the backup of the new input.
        Returns (request pages, the session's own of them, backup id, cached
        tokens), or Nones when no room is left (everything released)."""
        clock = time.perf_counter
        page = self.page
        input_tokens = len(request.tokens) // 4
        extend = max(0, input_tokens - admitted.device_tokens - admitted.host_hit_tokens)
        self.settle()
        start = clock()
        load = self.session.load_back(request.tokens, extend_tokens=extend + request.reserve)
        self.latency["LoadBack"].append(clock() - start)
        if load.lock_handle:
            handles.append(load.lock_handle)
        cached = load.device_tokens + (load.loaded_tokens if load.ok else 0)
        self.counts["loads" if load.ok and load.loaded_tokens else "load_misses"] += 1
        reuse = cached // page
        need = -(-(input_tokens + request.reserve) // page) - reuse
        fresh = []
        if need > 0:
            self.settle()
            start = clock()
            try:
                fresh = self.session.allocate(num_pages=need)
            except hicache.HiCacheError as e:
                if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self.counts["not_admitted"] += 1
                if handles:
                    self.session.unlock(handles=handles)
                return None, None, 0, 0
            finally:
                self.latency["Allocate"].append(clock() - start)
        backup = 0
        new_input = input_tokens - reuse * page
        # After a miss the host hit stays a host-only node the insert puts
        # device pages under: the new pages then span two nodes and no
        # backup could attach to either, so none is prepared.
        loaded = load.ok and load.loaded_tokens > 0
        if self.write_through and new_input > 0 and loaded:
            self.settle()
            start = clock()
            (backup,) = self.backup_stream().prepare([(fresh[:-(-new_input // page)],
                                                        new_input)])
            self.latency["BackupPrepare"].append(clock() - start)
            if backup:
                self.unattached.add(backup)
        return load.pages[:reuse] + fresh, fresh, backup, cached

    def _completed(self, item, result):
        """Complete answered (not deferred): the backup is attached, or the
        daemon rolled it back."""
        if item.backup_id:
            if result.backup_attached:
                self.counts["backups_attached"] += 1
                self.unattached.discard(item.backup_id)
            else:
                self._dead(item.backup_id)

    def _complete(self, item, own):
        clock = time.perf_counter
        latency = self.latency["Complete"]
        self.settle()
        start = clock()
        (result,) = self.session.complete([item])
        latency.append(clock() - start)
        if not result.deferred:
            self._completed(item, result)
            return
        self.counts["deferred_inserts"] += 1
        self.flush()  # The forward is over: every layer of it is stored.
        wait = 0.0002
        for _ in range(self.defer_retries):
            if self.deterministic:
                self.settle()  # Every backup but this request's own has ended.
            else:
                self._wait(wait)
                wait = min(wait * 2, 0.05)
            self.counts["defer_retries"] += 1
            start = clock()
            try:
                (result,) = self.session.complete([item])
            except hicache.HiCacheError as e:
                if not (item.backup_id and e.code == grpc.StatusCode.INVALID_ARGUMENT
                        and "backup" in e.details):
                    raise
                # The daemon dropped (rolled back) the backup of the deferred
                # insert: complete without it (its pages are simply not
                # backed up).
                self.counts["deferred_backup_dropped"] += 1
                self._dead(item.backup_id)
                item.backup_id = 0
                (result,) = self.session.complete([item])
            finally:
                latency.append(clock() - start)
            if not result.deferred:
                self.counts["deferred_then_completed"] += 1
                self._completed(item, result)
                return
        self._give_up(item, own)

    def _give_up(self, item, own):
        """Releases everything of a request whose insert stays deferred: its
        backup (rolled back), its own pages, its locks."""
        self.counts["deferred_gave_up"] += 1
        deadline = time.monotonic() + 5.0
        rolled_back = False
        while own:
            try:
                self.session.free(own)
                break
            except hicache.HiCacheError as e:
                # A backup still uses the pages: roll it back (the rollback
                # travels on the stream; until the daemon read it, Free is
                # refused).
                if e.code != grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                    raise
                if item.backup_id and not rolled_back:
                    self.backup_stream().rollback(item.backup_id)
                    rolled_back = True
                time.sleep(0.0005)
        if item.backup_id and not rolled_back:
            # Its copies were done, but it may still hold host pages.
            self.backup_stream().rollback(item.backup_id)
        if item.backup_id:
            self._dead(item.backup_id)
        if item.lock_handles:
            self.session.unlock(handles=item.lock_handles)


def main(argv=None) -> int:
    """hicache-replay's entry point: a failure is one line on stderr and a
    non-zero exit (2 for a bad argument or unreadable trace, 1 for the
    daemon), never a traceback."""
    try:
        return _main(argv)
    except hicache.HiCacheError as e:
        print(f"hicache-replay: {e.code.name}: {e.details}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"hicache-replay: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    except (ValueError, json.JSONDecodeError) as e:
        print(f"hicache-replay: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hicache-replay: interrupted", file=sys.stderr)
        return 130


def _main(argv=None):
    parser = argparse.ArgumentParser(prog="hicache-replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", default=None,
                        help="the daemon's unix socket (default: $HICACHE_TARGET or "
                             "$HICACHE_SOCKET if set, else " + hicache.PACKAGED_SOCKET_PATH +
                             " if it exists, else " + hicache.default_socket_path() + ")")
    parser.add_argument("--target", default=None,
                        help="any gRPC target instead of --socket (unix:PATH or host:port)")
    workload = parser.add_mutually_exclusive_group(required=True)
    workload.add_argument("--trace", help="a Mooncake trace (JSON lines)")
    workload.add_argument("--conversations", type=int,
                          help="generate multi-turn conversations: how many at once")
    parser.add_argument("--requests", type=int, default=None,
                        help="replay at most N (conversations: default 1000)")
    parser.add_argument("--block-tokens", type=int, default=512, help="trace: tokens per hash id")
    parser.add_argument("--turns", type=int, default=8,
                        help="conversations: turns before a conversation starts over")
    parser.add_argument("--system-tokens", type=int, default=2048,
                        help="conversations: the shared system prompt")
    parser.add_argument("--user-tokens", type=int, default=192,
                        help="conversations: mean new user tokens per turn")
    parser.add_argument("--output-tokens", type=int, default=128,
                        help="conversations: mean output tokens per turn (reserved at Admit)")
    parser.add_argument("--zipf", type=float, default=1.0,
                        help="conversations: Zipf exponent of the conversation choice")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="conversations: requests per second of trace time")
    parser.add_argument("--seed", type=int, default=1,
                        help="conversations: seed of the workload (the only randomness)")
    parser.add_argument("--backup-lag", type=int, default=0,
                        help="store each backup's layers N requests later (copies in flight)")
    parser.add_argument("--defer-retries", type=int, default=8,
                        help="retries of a deferred insert before the request gives up")
    parser.add_argument("--deterministic", action="store_true",
                        help="before every call, wait until the backups in flight settled "
                             "(see above): two runs give the same counts")
    parser.add_argument("--settle-timeout", type=float, default=10.0,
                        help="--deterministic: longest wait for backups to settle (s)")
    parser.add_argument("--speed", type=float, default=0.0,
                        help="time scale (1 = real time, 2 = twice as fast); 0 = as fast as possible")
    parser.add_argument("--window-s", type=float, default=60.0, help="hit-rate table window")
    parser.add_argument("--csv", help="write per-window series to this CSV file")
    parser.add_argument("--plot", help="draw hit rate and occupancy over time to this PNG")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)

    if args.trace:
        trace = read_trace(args.trace, args.requests)
        requests = mooncake_requests(trace, args.block_tokens)
        count, unit = len(trace), "block"
    else:
        if args.conversations < 1:
            parser.error("--conversations must be at least 1")
        count, unit = args.requests or 1000, "token"
        requests = conversation_requests(count, args.conversations, args.turns,
                                         args.system_tokens, args.user_tokens,
                                         args.output_tokens, args.zipf, args.rate, args.seed)
    if args.socket and args.target:
        parser.error("give --socket or --target, not both")
    with hicache.Client(args.socket, args.target, timeout=60) as client:
        client.check_socket()  # A missing or forbidden socket fails at once.
        layout = client.layout()
        write_policy = client.daemon_info().settings.write_policy
        before = client.stats()
        with client.session("hicache-replay", lease_ms=60000) as session:
            replay = Replayer(client, session, layout.geometry.page_size_tokens,
                              layout.num_steps, write_policy, args.backup_lag,
                              args.defer_retries, args.deterministic, args.settle_timeout)
            try:
                windows = []
                start_wall = time.time()
                window_start, mark = None, (0, 0, 0)
                for request in requests:
                    timestamp = request.timestamp_ms
                    if args.speed > 0:
                        delay = timestamp / 1000.0 / args.speed - (time.time() - start_wall)
                        if delay > 0:
                            time.sleep(delay)
                    if window_start is None:
                        window_start = timestamp
                    if timestamp - window_start >= args.window_s * 1000:
                        windows.append(_window(replay, client, window_start, mark, layout))
                        window_start, mark = timestamp, (replay.units, replay.l1_units,
                                                         replay.l12_units)
                    replay.run_request(request)
                replay.flush()
                replay.settle()  # --deterministic: every backup has ended.
                if window_start is not None:
                    windows.append(_window(replay, client, window_start, mark, layout))
                held = client.stats()  # Before the session closes: what it still holds.
            finally:
                replay.close()
        after = client.stats()

    summary = {
        "workload": "mooncake" if args.trace else "conversations",
        "write_policy": write_policy,
        "deterministic": args.deterministic,
        "seed": args.seed if not args.trace else None,
        "backup_lag": args.backup_lag,
        "defer_retries_max": args.defer_retries,
        "requests": count,
        "unit": unit,
        "blocks" if unit == "block" else "tokens": replay.units,
        "l1_hit_rate": replay.l1_units / max(1, replay.units),
        "l1_l2_hit_rate": replay.l12_units / max(1, replay.units),
        "backups_prepared": replay.counts["backups_prepared"],
        "backups_attached": replay.counts["backups_attached"],
        "backups": after.backups_committed - before.backups_committed,
        "backups_rolled_back": after.backups_rolled_back - before.backups_rolled_back,
        "loads": after.loads_done - before.loads_done,
        "load_misses": replay.counts["load_misses"],
        "not_admitted": replay.counts["not_admitted"],
        "deferred_inserts": replay.counts["deferred_inserts"],
        "defer_retries": replay.counts["defer_retries"],
        "deferred_then_completed": replay.counts["deferred_then_completed"],
        "deferred_gave_up": replay.counts["deferred_gave_up"],
        "deferred_backup_dropped": replay.counts["deferred_backup_dropped"],
        "stream_errors": replay.stream.error_count if replay.stream else 0,
        "settle_timeouts": replay.counts["settle_timeouts"],
        "held_pages_at_end": held.session_pages,
        "held_locks_at_end": held.session_locks,
        "pages_after_close": after.session_pages,
        "device_evicted_pages": after.device_evicted_pages - before.device_evicted_pages,
        "host_evicted_pages": after.host_evicted_pages - before.host_evicted_pages,
        "request_latency_us": _latency(replay.request_latency),
        "latency_us": {name: _latency(v) for name, v in sorted(replay.latency.items())},
    }
    if args.deterministic:
        summary["settle_wait_us"] = _latency(replay.settle_wait)
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


if __name__ == "__main__":
    sys.exit(main())
