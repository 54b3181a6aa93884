#!/usr/bin/python3
"""Writes the hand-made seed inputs of //fuzz:service_fuzzer.

Usage: fuzz/corpus/make_seeds.py [SEED_DIR [CRASH_DIR]]
       (default: fuzz/corpus/service and fuzz/corpus/crashes)

Each seed is a short, well-formed scenario in the input format documented at
the top of fuzz/service_fuzzer.cc; libFuzzer mutates from there. Every seed
must pass on a correct daemon: //fuzz:service_fuzzer_corpus_test replays them
all in the plain test suite. REPRODUCERS (written to CRASH_DIR, which no test
replays) are scenarios of open daemon bugs: each fails until its bug is
fixed. Keep the opcodes below in step with `enum Op`
(fuzz/service_fuzz_input.h).
"""

import os
import sys

(OPEN, CLOSE, ALLOCATE, FREE, MATCH, INSERT, LOCK, PIN, EVICT, SET_FREE_ROOM,
 PREPARE, LAYER_STORED, STORE_ALL, ROLLBACK, STREAM_END, LOAD_BACK,
 FINISH_LOAD, SETTLE, ADVANCE, KEEP_ALIVE, INSPECT, REQUEST,
 # v1.1 (appended: older inputs keep their opcodes).
 ADMIT, COMPLETE, UNLOCK_HANDLES, MATCH_EXACT, LOAD_BATCH, FINISH_LOAD_RPC,
 WORKER_STORE, SUBSCRIBE, UNSUBSCRIBE, FENCE, BACKUP_OPEN, FLOW,
 HOLD) = range(35)

# Request flags.
LOCK_HIT, ZIGZAG, ROUND_ROBIN, BACKUP, STORE_ALL_F, SKIP_LAST, WAIT, NO_INSERT = (
    1, 2, 4, 8, 16, 32, 64, 128)


def header(cp=1, write_policy=1, lfu=False, settle=True, draft=False,
           device=3, host=3, page_first=False, threshold=False, faults=0,
           extended=False):
    """cp 1..4; write_policy 0 through, 1 selective, 2 back (extended: 3
    ahead); lfu: LFU, or with extended TinyLFU (else LRU, or SLRU); device/host
    are indices into {8,16,32,64} / {8,32,64,128} pages per rank; faults 0..3:
    copy failure probability {0, 5%, 20%, 50%}."""
    h0 = ((cp - 1) | (write_policy << 2) | (lfu << 4) | (settle << 5) |
          (draft << 6) | (extended << 7))
    h1 = device | (host << 2) | (page_first << 4) | (threshold << 5) | (faults << 6)
    return bytes([h0, h1])


def tokens(base, length, diverge_at=None, token=0):
    """base 0..2: the shared base sequences; length < 41."""
    b = base | (4 if diverge_at is not None else 0)
    out = [b, length]
    if diverge_at is not None:
        out += [diverge_at, token]
    return bytes(out)


def raw_tokens(values):
    """base 3: tokens from the input over {0, 1, 2}."""
    return bytes([3, len(values)] + list(values))


def open_session(slot, ns=0, role=0, rank=0, lease=0):
    """ns 0 "", 1 "a", 2 "b"; role index 0 scheduler, 1 worker, 3 unspecified,
    7 = 99; lease index 0 default, 1 50 ms, 2 1 s, 3 2^32-1 ms."""
    return bytes([OPEN, slot, ns | (role << 2) | (lease << 6), rank])


def s(slot):
    return bytes([slot])


def request(slot, toks, flags=0):
    return bytes([REQUEST]) + s(slot) + toks + bytes([flags])


def match(slot, toks, lock=False, peek=False):
    return bytes([MATCH]) + s(slot) + bytes([(4 if lock else 0) | (8 if peek else 0)]) + toks


def allocate_owners(slot, owners):
    return bytes([ALLOCATE, slot, 0, 0, len(owners)] + list(owners))


def allocate_pages(slot, n, mode=0):
    """n < 20; mode 0 any, 1 zigzag, 2 round robin, 3 = 77 (unknown)."""
    return bytes([ALLOCATE, slot, 0, 1 | (mode << 6), n])


ALL = 237  # A count byte that reads as 4096.


def evict(cp, device_each, host_each):
    """Count bytes: below 224 they read as value % 20; ALL reads as 4096."""
    b = cp | (cp << 3)
    return bytes([EVICT, b] + [device_each] * cp + [host_each] * cp)


def load_back(slot, toks, wait=True, finish=True):
    return bytes([LOAD_BACK]) + s(slot) + toks + bytes([(1 if wait else 0) | (2 if finish else 0)])


def close(slot):
    return bytes([CLOSE, slot])


# --- v1.1 -------------------------------------------------------------------

# Token counts (reserve_tokens, extend_tokens): a byte below 208 reads as
# value % 33; these read as edge values.
NEG1, I64_MIN, I64_MAX, MAX_TOKENS, MAX_TOKENS_1 = 208, 209, 210, 211, 212


def admit_item(toks, reserve=0, mode=0, backup=0):
    """reserve: a token-count byte; mode 0 unspecified, 1 zigzag, 2 round
    robin, 3 = 77; backup 0 auto, 1 never, 2 always, 3 = 99."""
    return toks + bytes([reserve, mode | (backup << 2)])


def admit(slot, *items):
    """1 to 4 items made with admit_item()."""
    assert 1 <= len(items) <= 4
    return bytes([ADMIT, slot, len(items) - 1]) + b"".join(items)


def admit_many(slot, count, toks, reserve=0, mode=0, backup=0):
    """8 + count % 33 items sharing `toks` (each with its own last token)."""
    return bytes([ADMIT, slot, 0x80, count]) + toks + bytes([reserve, mode | (backup << 2)])


# Complete deviations (bits 1-3 of an item's byte).
AS_IS, FOREIGN_HANDLE, REPEATED_HANDLE, FREE_INSERTED, UNFINISHED, OTHER_BACKUP = (
    0, 3, 4, 5, 6, 7)


def complete_item(admitted, deviation=AS_IS, keep_uncached=False, output=None,
                  extra=b""):
    """An item from the session's admitted request `admitted` (an index, the
    session must have one); `output` adds that many output tokens (reserve
    permitting); `extra` are the deviation's operand bytes (FOREIGN_HANDLE:
    a handle pick; FREE_INSERTED: an index; OTHER_BACKUP: a backup pick)."""
    d = (1 if keep_uncached else 0) | (deviation << 1) | (0x80 if output is not None else 0)
    out = bytes([d, admitted])
    if output is not None:
        out += bytes([output])
    return out + extra


def complete(slot, *items):
    assert 1 <= len(items) <= 2
    return bytes([COMPLETE, slot, len(items) - 1]) + b"".join(items)


def unlock_handles(slot, picks, with_node=False, as_lock=False):
    """Handle picks: a byte below 128 takes one of the session's handles,
    below 224 anybody's, else a bogus one."""
    assert 1 <= len(picks) <= 4
    b = (len(picks) - 1) | (4 if with_node else 0) | (8 if as_lock else 0)
    return bytes([UNLOCK_HANDLES, slot, b] + list(picks)) + (bytes([0]) if with_node else b"")


def match_exact(slot, toks, lock=False, peek=False, floored=False):
    return bytes([MATCH_EXACT, slot, (2 if lock else 0) | (4 if peek else 0)
                  | (8 if floored else 0)]) + toks


LIVE, READ_ALL, CANCEL, KEEP = range(4)


def load_batch(slot, items, then=READ_ALL, backlog=0, both=None):
    """items: [(toks, extend byte)], sent as LoadBackRequest.items; `both`
    adds top-level tokens too (refused); then: LIVE (the server streams after
    every op), READ_ALL, CANCEL, KEEP (a FINISH_LOAD op ends it); backlog
    index: 0/1 65536, 2 four, 3 one event. load_single() sends the
    single-request form (tokens + extend_tokens)."""
    n = len(items)
    assert 1 <= n <= 3
    b = n | (0x84 if both is not None else 0) | (then << 3) | (backlog << 5)
    out = bytes([LOAD_BATCH, slot, b])
    for toks, extend in items:
        out += toks + bytes([extend])
    return out + (both or b"")


def load_single(slot, toks, extend, then=READ_ALL, backlog=0):
    return bytes([LOAD_BATCH, slot, (then << 3) | (backlog << 5)]) + toks + bytes([extend])


def finish_load_rpc(slot, pick):
    """pick below 192: a known load (anybody's); else 0 or a bogus id."""
    return bytes([FINISH_LOAD_RPC, slot, pick])


def worker_store(slot, backups, step, fences=0, fence=0):
    """backups: 1 or 2 picks (below 160: one of the last four backups, 0 the
    latest; below 224: any known one); fences 0 none,
    1 one of the worker's rank (`fence` id), 2 one per rank and one more,
    3 one of another rank."""
    out = bytes([WORKER_STORE, slot, (len(backups) - 1) | (fences << 1)] + list(backups) + [step])
    return out + (bytes([fence]) if fences == 1 else b"")


def subscribe(slot, backlog=0):
    """backlog index: 0/1 65536, 2 two, 3 one event."""
    return bytes([SUBSCRIBE, slot, backlog])


def fence_register(slot, rank, size=0):
    """size index: 64, 0, 63, 65 bytes."""
    return bytes([FENCE, slot, size << 1, rank])


def fence_release(slot, fence):
    return bytes([FENCE, slot, 1, fence])


def backup_open(slot, backlog=0):
    """backlog index: 65536, 1, 2, 8 events."""
    return bytes([BACKUP_OPEN, slot, backlog])


# Flow flags.
F_NEVER, F_ALWAYS, F_ZIGZAG, F_WORKERS, F_SKIP_LAST, F_SETTLE, F_HOLD, F_GIVE_UP = (
    1, 2, 4, 8, 16, 32, 64, 128)


def hold(ops):
    """Copies submitted from now on are held for the next `ops` (1..8) ops or
    until something waits for the copies."""
    return bytes([HOLD, ops - 1])


def release():
    return bytes([HOLD, 0x10])


def flow(slot, toks, reserve=0, flags=0):
    """A whole v1.1 request (reserve < 13)."""
    return bytes([FLOW, slot]) + toks + bytes([reserve, flags])


SEEDS = {
    # One scheduler: requests with per-layer backups, a repeat hit, a
    # request that extends a cached one, then close.
    "basic_flow": header(cp=1) + open_session(0)
    + request(0, tokens(0, 16), BACKUP)
    + match(0, tokens(0, 16))
    + request(0, tokens(0, 24), BACKUP | LOCK_HIT)
    + request(0, tokens(1, 20), BACKUP | LOCK_HIT)
    + bytes([INSPECT, 0, INSPECT, 1 | 8, 0, 0, 0, 0])
    + close(0),

    # CP = 4: zigzag and round-robin allocations, store_all backups, explicit
    # owner patterns, a partial last page.
    "cp4_zigzag": header(cp=4, device=2, host=2) + open_session(0)
    + open_session(1, rank=3) + open_session(2, role=1, rank=3)
    + request(0, tokens(0, 30), BACKUP | ZIGZAG)
    + request(0, tokens(2, 37), BACKUP | ROUND_ROBIN | STORE_ALL_F)
    + allocate_owners(1, [0, 1, 2, 3, 3, 2, 1])
    + match(1, tokens(0, 30), lock=True)
    + bytes([INSPECT, 2, 0])
    + match(2, tokens(0, 30))
    + close(2) + close(1) + close(0),

    # Write-through on the first hit; the device copy is evicted, and a
    # load-back brings it back with its recorded owners.
    "load_back": header(cp=2, write_policy=0) + open_session(0)
    + request(0, tokens(0, 32), 0)
    + match(0, tokens(0, 32))
    + bytes([SETTLE])
    + evict(2, ALL, 0)
    + bytes([SETTLE])
    + load_back(0, tokens(0, 32), wait=True, finish=True)
    + load_back(0, tokens(0, 36), wait=False, finish=False)
    + bytes([FINISH_LOAD, 1])
    + close(0),

    # Tenants: the same tokens in namespaces "a" and "b", a worker, locks and
    # pins by node id, one session closed by another.
    "namespaces": header(cp=2, settle=False) + open_session(0, ns=1)
    + open_session(1, ns=2) + open_session(2, ns=1, role=1, rank=1)
    + request(0, tokens(0, 20), BACKUP)
    + request(1, tokens(0, 20), BACKUP | LOCK_HIT)
    + match(2, tokens(0, 20), lock=True)
    + bytes([LOCK, 1, 0, 0, LOCK, 2, 4, 0, PIN, 0, 0, 2])
    + bytes([SETTLE]) + close(0) + close(1) + close(2),

    # A small device pool under pressure: evictions inside Allocate, free
    # room targets, write-back on eviction.
    "pressure": header(cp=2, write_policy=2, device=0, host=1)
    + open_session(0)
    + request(0, tokens(0, 28), BACKUP)
    + request(0, tokens(1, 28), BACKUP)
    + request(0, tokens(2, 28), BACKUP)
    + bytes([SET_FREE_ROOM, 2, 1])
    + request(0, raw_tokens([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]), 0)
    + allocate_pages(0, 6, mode=1)
    + bytes([SET_FREE_ROOM, 0, 0])
    + close(0),

    # Leases: a session with a 50 ms lease lapses; one kept alive survives.
    "lease_expiry": header(cp=1) + open_session(0, lease=1)
    + open_session(1, lease=2)
    + request(0, tokens(0, 12), BACKUP | SKIP_LAST)
    + match(0, tokens(0, 12), lock=True)
    + bytes([ADVANCE, 0, KEEP_ALIVE, 1, ADVANCE, 0, ADVANCE, 0])
    + request(1, tokens(0, 12), 0)
    + close(1),

    # Backup stream messages one by one: prepare, a layer, rollback; a stream
    # that breaks with a backup open; a request whose insert is skipped; a
    # half-closed stream.
    "backup_stream": header(cp=2, draft=True) + open_session(0)
    + allocate_pages(0, 3)
    + bytes([PREPARE, 0, 0, 0, 2, 0])
    + bytes([LAYER_STORED, 0, 0, 0, 0])
    + bytes([ROLLBACK, 0, 0, 0])
    + bytes([PREPARE, 0, 0, 0, 0, 1])
    + bytes([STORE_ALL, 0, 0, 0])
    + bytes([STREAM_END, 1])
    + request(0, tokens(0, 16), BACKUP | NO_INSERT)
    + request(0, tokens(0, 16), BACKUP | WAIT)
    + request(0, tokens(1, 16), BACKUP | SKIP_LAST)
    + bytes([STREAM_END, 0])
    + close(0),

    # Copies fail (50%): backups that never commit, loads that become misses.
    "copy_faults": header(cp=2, write_policy=2, device=1, faults=3)
    + open_session(0)
    + request(0, tokens(0, 24), BACKUP)
    + request(0, tokens(1, 24), BACKUP | STORE_ALL_F)
    + request(0, tokens(2, 24), BACKUP | LOCK_HIT)
    + evict(2, ALL, 0)
    + load_back(0, tokens(0, 24), wait=True, finish=True)
    + load_back(0, tokens(1, 24), wait=False, finish=False)
    + bytes([FINISH_LOAD, 1])
    + close(0),

    # v1.1 in one namespace: a scheduler and a worker per rank, both workers
    # subscribed; requests through Admit -> layers -> Complete, stored by the
    # workers (each its rank's share, on its own stream) or by the scheduler;
    # one whose last layer is missing, so that the next request's Complete,
    # which splits its node, is deferred; the layer is stored, the Complete
    # retried; an exact-tail locked match released by handle.
    "admit_complete": header(cp=2) + open_session(0, ns=1)
    + open_session(1, ns=1, role=1, rank=0) + open_session(2, ns=1, role=1, rank=1)
    + subscribe(1) + subscribe(2)
    + flow(0, tokens(0, 20), 6, F_ALWAYS | F_WORKERS)
    + flow(0, tokens(2, 28), 3, F_ALWAYS | F_SKIP_LAST)
    + flow(0, tokens(2, 16, diverge_at=12, token=1), 2, F_ALWAYS | F_WORKERS)
    + bytes([LAYER_STORED, 0, 0, 131, 1])
    + bytes([SETTLE])
    + complete(0, complete_item(0))
    + match_exact(0, tokens(0, 22), lock=True)
    + unlock_handles(0, [0])
    + close(1) + close(2) + close(0),

    # Admit at the edges: many items on a small pool (first come, first
    # served), reserve_tokens -1, 2^24 + 1, INT64_MAX, 2^24, unknown modes and
    # backup choices, empty tokens; Complete with a foreign handle, a repeated
    # one, a free page it also inserts, unfinished, another backup, output
    # tokens, made-up items; Unlock of bogus handles, handles with a node,
    # Lock with handles.
    "admit_edges": header(cp=1, device=1, host=0) + open_session(0)
    + open_session(1)
    + admit_many(0, 6, tokens(0, 12), reserve=4)
    + admit(0, admit_item(tokens(0, 8), NEG1), admit_item(tokens(1, 8), MAX_TOKENS_1))
    + admit(0, admit_item(tokens(2, 8), I64_MAX, mode=3))
    + admit(0, admit_item(tokens(2, 8), 2, backup=3))
    + admit(0, admit_item(tokens(2, 0), 2))
    + admit(0, admit_item(tokens(1, 16), MAX_TOKENS, mode=1, backup=2))
    + close(0)
    + flow(1, tokens(1, 16))
    + admit(1, admit_item(tokens(1, 20), 8, mode=2, backup=2),
            admit_item(tokens(2, 9), 3, backup=1))
    + complete(1, complete_item(0, FOREIGN_HANDLE, extra=bytes([200])))
    + complete(1, complete_item(0, REPEATED_HANDLE))
    + complete(1, complete_item(0, FREE_INSERTED, extra=bytes([0])))
    + complete(1, complete_item(0, UNFINISHED, output=3))
    + complete(1, complete_item(0, OTHER_BACKUP, extra=bytes([250])),
               complete_item(0))
    + complete(1, bytes([0, 250]) + tokens(0, 8) + bytes([0, 0, 0]))
    + unlock_handles(1, [250, 130, 0])
    + unlock_handles(1, [0], with_node=True)
    + unlock_handles(1, [0], as_lock=True)
    + admit_many(1, 32, tokens(2, 8), reserve=8, backup=2)
    + close(1),

    # Host hits through v1.1: write-through, the device copy evicted, an
    # Admit that answers load, a flow that loads back with extend_tokens and
    # allocates the rest; LoadBack batches with extend_tokens (in range, -1,
    # 2^24 + 1), tokens and items at once, a live stream, a kept one, a tiny
    # mailbox; FinishLoad of a known load (maybe still streaming), of another
    # session's, of an unknown one.
    "load_batch": header(cp=2, write_policy=0) + open_session(0)
    + open_session(1)
    + request(0, tokens(0, 32), 0)
    + match(0, tokens(0, 32))
    + bytes([SETTLE])
    + evict(2, ALL, 0)
    + bytes([SETTLE])
    + admit(0, admit_item(tokens(0, 36), 4))
    + flow(0, tokens(0, 36), 4, F_ALWAYS)
    + evict(2, ALL, 0)
    + bytes([SETTLE])
    + load_batch(0, [(tokens(0, 32), 8), (tokens(1, 20), 0)], then=LIVE)
    + load_single(0, tokens(0, 24), NEG1)
    + load_batch(0, [(tokens(0, 24), MAX_TOKENS_1)])
    + load_batch(0, [(tokens(0, 24), 4)], both=tokens(0, 8))
    + unlock_handles(0, [0, 1])
    + evict(2, ALL, 0)
    + bytes([SETTLE])
    + load_batch(1, [(tokens(0, 32), 2)], then=KEEP, backlog=3)
    + finish_load_rpc(0, 0)
    + finish_load_rpc(1, 2)
    + finish_load_rpc(1, 255)
    + bytes([FINISH_LOAD, 1])
    + close(0) + close(1),

    # Workers and fences: Subscribe of a scheduler (refused) and of workers
    # (one with a one-event mailbox, which overflows); layer_stored from a
    # worker with a fence of its rank, of another rank, too many fences;
    # RegisterFence (refused: the CPU backend has no events) with handles of
    # 64 and 63 bytes, ReleaseFence of unknown ids; a BackupSession with a
    # one-event mailbox (overflow cancels it), a worker's Unsubscribe.
    "worker_streams": header(cp=2, draft=True) + open_session(0, ns=2)
    + open_session(1, ns=2, role=1, rank=0) + open_session(2, ns=2, role=1, rank=1)
    + open_session(3, ns=1, role=1, rank=1)
    + subscribe(0) + subscribe(1, backlog=3) + subscribe(2) + subscribe(3)
    + backup_open(0, backlog=1)
    + request(0, tokens(0, 24), BACKUP)
    + flow(0, tokens(1, 24), 2, F_ALWAYS | F_WORKERS)
    + flow(0, tokens(2, 24), 2, F_ALWAYS | F_HOLD)
    + worker_store(2, [0], 0, fences=1, fence=1)
    + worker_store(2, [0], 0, fences=2)
    + worker_store(2, [0], 0, fences=3)
    + worker_store(3, [0], 0)
    + b"".join(worker_store(1, [0], step) + worker_store(2, [0], step)
               for step in range(3))
    + fence_register(1, 0) + fence_register(2, 1, size=2) + fence_register(0, 3)
    + fence_release(1, 1) + fence_release(0, 0)
    + bytes([UNSUBSCRIBE, 2])
    + complete(0, complete_item(0))
    + close(3) + close(0) + close(1) + close(2),

    # Copies held in flight (HOLD): a stream broken while its backup's copies
    # are held, a load cancelled and one abandoned by FinishLoad before a
    # byte moved, write-back eviction waiting for held copies, a session
    # closed with its Admit backup and a load in flight.
    "held_copies": header(cp=2, write_policy=2, device=1) + open_session(0)
    + open_session(1)
    + hold(4) + request(0, tokens(0, 24), BACKUP) + bytes([STREAM_END, 1])
    + release() + bytes([SETTLE])
    + request(0, tokens(0, 24), BACKUP)
    + evict(2, ALL, 0) + bytes([SETTLE])
    + hold(3) + load_batch(0, [(tokens(0, 24), 4)], then=CANCEL)
    + load_batch(0, [(tokens(0, 24), 4)], then=KEEP)
    + finish_load_rpc(0, 1)
    + release() + bytes([FINISH_LOAD, 1])
    + hold(8) + allocate_pages(1, 19) + request(1, tokens(2, 36), BACKUP)
    + release()
    + hold(8) + flow(0, tokens(1, 24), 0, F_ALWAYS | F_HOLD)
    + load_batch(0, [(tokens(0, 24), 0)], then=LIVE)
    + close(0) + release() + bytes([SETTLE])
    + close(1),

    # Regression (found by this fuzzer, fixed in 7ce5396): a load-back whose
    # copies are still in flight (held by HOLD) while a request's Insert
    # would split the host-only node being loaded (tokens(1, 20) diverges
    # from tokens(0, 32) at token 12). The split's head used to keep a copy
    # of the load's host_ref forever ("after evicting everything: ... 1
    # nodes left; node 3 (parent 1, tokens [0, 12), host_ref 1, ...)").
    "load_split_host_ref_leak": header(cp=1, write_policy=0) + open_session(0)
    + request(0, tokens(0, 32), 0)
    + match(0, tokens(0, 32))
    + bytes([SETTLE])
    + evict(1, ALL, 0)
    + bytes([SETTLE])
    + hold(8)
    + load_batch(0, [(tokens(0, 32), 0)], then=LIVE)
    + request(0, tokens(1, 20), 0)
    + release()
    + bytes([SETTLE]),

    # The same with v1.0 calls only: LoadBack kept open, the request, then
    # the client reads the LoadBack to the end.
    "load_split_host_ref_leak_v1": header(cp=1, write_policy=0)
    + open_session(0)
    + request(0, tokens(0, 32), 0)
    + match(0, tokens(0, 32))
    + bytes([SETTLE])
    + evict(1, ALL, 0)
    + bytes([SETTLE])
    + hold(8)
    + load_back(0, tokens(0, 32), wait=False, finish=False)
    + request(0, tokens(1, 20), 0)
    + bytes([FINISH_LOAD, 1]),

    # Requests the daemon must refuse without changing anything: unknown
    # sessions, malformed tokens, owners beyond cp_size, negative counts, an
    # unspecified role.
    "refusals": header(cp=2) + open_session(0)
    + open_session(1, role=3)
    + request(4, tokens(0, 8), 0)
    + match(0, bytes([0xF8, 8]))
    + bytes([ALLOCATE, 0, 0, 4, 3, 0, 1, 2])
    + bytes([ALLOCATE, 0, 0, 1, 224])
    + bytes([FREE, 0, 1, 228])
    + bytes([LOCK, 0, 0, 225])
    + bytes([KEEP_ALIVE, 4])
    + close(0),
}


# Reproducers of daemon bugs the fuzzer found and that are not fixed yet.
# They fail (trap) on purpose, so they live in fuzz/corpus/crashes, which no
# test replays; once the daemon is fixed, move the scenario to SEEDS.
# The daemon's default pair (write_ahead + tinylfu: header(extended=True,
# write_policy=3, lfu=True)) at C = 2 and 4, on the scenarios above that
# press the tiers, so every build's corpus test runs the shipped
# configuration under the fuzzer's checks (issue 26).
DAEMON_DEFAULT = {"write_policy": 3, "lfu": True, "extended": True}
for base in ("basic_flow", "cp4_zigzag", "load_back", "namespaces",
             "pressure", "backup_stream", "copy_faults"):
    body = SEEDS[base]
    h1 = body[1]
    for cp in (2, 4):
        h0 = header(cp=cp, settle=bool(body[0] >> 5 & 1),
                    draft=bool(body[0] >> 6 & 1), **DAEMON_DEFAULT)[0]
        SEEDS[f"{base}_default_c{cp}"] = bytes([h0, h1]) + body[2:]

REPRODUCERS = {
    # Complete is not all or nothing when a page it frees is busy: an Admit
    # of 3 tokens + 12 reserve gets pages [1,2,3,4] and backup 1 (page 1),
    # whose layers are stored; a second prepare names pages [1,2,3,4]
    # (backup 2, no layer stored: its pages are in use); Complete inserts
    # page 1 with backup 1 and frees [2,3,4]. Its checks pass (the pages are
    # the session's), the insert is done (page 1 goes to the tree, backup 1
    # is attached), then the free fails: FAILED_PRECONDITION "items[0]:
    # pages[0] = 2 is used by a backup in flight" -- an error for a call
    # that changed what the session holds (pages 4 -> 3), which
    # RequestFlow::Complete documents as impossible ("a bad item changes
    # nothing at all"); a retry then fails on the page and backup it no
    # longer holds.
    "complete_free_busy_page": header(cp=1, write_policy=0, device=0, host=0)
    + open_session(0)
    + flow(0, raw_tokens([0, 1, 2]), 12, F_HOLD)
    + bytes([PREPARE, 0, 0, 0, 3, 0])
    + complete(0, complete_item(0)),
}


def write(out, scenarios):
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(scenarios.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        print("%s: %d bytes" % (os.path.join(os.path.basename(out), name), len(data)))


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    write(argv[1] if len(argv) > 1 else os.path.join(here, "service"), SEEDS)
    write(argv[2] if len(argv) > 2 else os.path.join(here, "crashes"),
          REPRODUCERS)


if __name__ == "__main__":
    main(sys.argv)
