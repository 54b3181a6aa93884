#!/usr/bin/python3
"""Writes the hand-made seed inputs of //fuzz:service_fuzzer.

Usage: fuzz/corpus/make_seeds.py [OUT_DIR]   (default: fuzz/corpus/service)

Each seed is a short, well-formed scenario in the input format documented at
the top of fuzz/service_fuzzer.cc; libFuzzer mutates from there. Every seed
must pass on a correct daemon: //fuzz:service_fuzzer_corpus_test replays them
all in the plain test suite. Keep the opcodes below in step with `enum Op`.
"""

import os
import sys

(OPEN, CLOSE, ALLOCATE, FREE, MATCH, INSERT, LOCK, PIN, EVICT, SET_FREE_ROOM,
 PREPARE, LAYER_STORED, STORE_ALL, ROLLBACK, STREAM_END, LOAD_BACK,
 FINISH_LOAD, SETTLE, ADVANCE, KEEP_ALIVE, INSPECT, REQUEST) = range(22)

# Request flags.
LOCK_HIT, ZIGZAG, ROUND_ROBIN, BACKUP, STORE_ALL_F, SKIP_LAST, WAIT, NO_INSERT = (
    1, 2, 4, 8, 16, 32, 64, 128)


def header(cp=1, write_policy=1, lfu=False, settle=True, draft=False,
           device=3, host=3, page_first=False, threshold=False, faults=0):
    """cp 1..4; write_policy 0 through, 1 selective, 2 back; device/host are
    indices into {8,16,32,64} / {8,32,64,128} pages per rank; faults 0..3:
    copy failure probability {0, 5%, 20%, 50%}."""
    h0 = (cp - 1) | (write_policy << 2) | (lfu << 4) | (settle << 5) | (draft << 6)
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


def main(argv):
    out = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "service")
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(SEEDS.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        print("%s: %d bytes" % (name, len(data)))


if __name__ == "__main__":
    main(sys.argv)
