#!/usr/bin/python3
"""Journal overhead on the replay (docs/hot-restart.md): alternating runs.

Runs //bench:replay N times without a state_dir and N times with one, one
after the other (off, on, off, on, ...), so that both see the same machine,
and prints each pair and the medians of req/s, of CPU seconds and of the
paired ratios (on / off).

    bazel build --config=opt //bench:replay
    bench/journal_overhead.py 9 micro
    bench/journal_overhead.py 7 tiny --deterministic=false

Arguments: N, the KV preset, then any extra flags for the replay. The binary
is bazel-out/k8-opt/bin/bench/replay (HICACHE_REPLAY overrides it); the state
directory is a fresh temporary one for every run.

HICACHE_REPLAY_OTHER=<binary> (e.g. a build of another commit) adds a third
run to every pair, that binary with the journal on, and prints its req/s and
its paired ratio to the first binary's journal-on run: two builds compared
under the same machine load.
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_on(binary, args):
    state = tempfile.mkdtemp(prefix="hicache-overhead-")
    try:
        return run(binary, args + ["--state_dir=" + os.path.join(state, "s")])
    finally:
        shutil.rmtree(state, ignore_errors=True)


def run(binary, args):
    out = subprocess.run([binary] + args, capture_output=True, text=True, check=True).stdout
    m = re.search(r"([0-9.]+) req/s, ([0-9.]+) CPU s", out)
    if m is None:
        sys.exit("no 'req/s, CPU s' line in the replay's output:\n" + out)
    return float(m.group(1)), float(m.group(2))


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    n, preset, extra = int(argv[1]), argv[2], argv[3:]
    binary = os.environ.get("HICACHE_REPLAY",
                            os.path.join(ROOT, "bazel-out/k8-opt/bin/bench/replay"))
    args = ["--trace=" + os.path.join(ROOT, "bench/traces/mooncake_synthetic.jsonl"),
            "--policies=tinylfu", "--write_policies=write_back", "--l1_blocks=6000",
            "--l2_blocks=12000", "--kv_preset=" + preset] + extra
    other = os.environ.get("HICACHE_REPLAY_OTHER")
    offs, ons, ratios, others, other_ratios = [], [], [], [], []
    for i in range(n):
        off = run(binary, args)
        on = run_on(binary, args)
        offs.append(off)
        ons.append(on)
        ratios.append(on[0] / off[0])
        line = (f"run {i + 1}: off {off[0]:.0f} req/s {off[1]:.2f} CPU s | "
                f"on {on[0]:.0f} req/s {on[1]:.2f} CPU s | ratio {ratios[-1]:.3f}")
        if other:
            o = run_on(other, args)
            others.append(o)
            other_ratios.append(o[0] / on[0])
            line += f" | other on {o[0]:.0f} req/s {o[1]:.2f} CPU s"
        print(line, flush=True)
    med = statistics.median
    if other:
        print(f"other ({other}), journal on: median {med(x[0] for x in others):.0f} req/s "
              f"({med(x[1] for x in others):.2f} CPU s); median paired ratio to this "
              f"binary's on runs {med(other_ratios):.3f} (min {min(other_ratios):.3f}, "
              f"max {max(other_ratios):.3f})")
    print(f"{preset}: {n} alternating pairs: off median {med(x[0] for x in offs):.0f} req/s "
          f"({med(x[1] for x in offs):.2f} CPU s), on median {med(x[0] for x in ons):.0f} "
          f"req/s ({med(x[1] for x in ons):.2f} CPU s); ratio of medians "
          f"{med(x[0] for x in ons) / med(x[0] for x in offs):.3f}; median paired ratio "
          f"{med(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main(sys.argv)
