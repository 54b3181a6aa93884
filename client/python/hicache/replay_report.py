"""hicache-replay's report (hicache.replay): latency percentiles, the
hit-rate and occupancy windows over trace time, the printed summary and the
optional plot."""


def percentile(values, q):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _latency(seconds):
    return {"p50": percentile(seconds, 0.5) * 1e6, "p99": percentile(seconds, 0.99) * 1e6,
            "mean": sum(seconds) / max(1, len(seconds)) * 1e6, "count": len(seconds)}


def _window(replay, client, window_start, mark, layout):
    units = replay.units - mark[0]
    stats = client.stats()
    lanes = layout.geometry.cp_size
    device_pages = layout.geometry.device_pages_per_rank * lanes
    host_pages = layout.geometry.host_pages_per_rank * lanes
    return {
        "t_s": window_start / 1000.0,
        "units": units,
        "l1_hit_rate": (replay.l1_units - mark[1]) / max(1, units),
        "l1_l2_hit_rate": (replay.l12_units - mark[2]) / max(1, units),
        "l1_occupancy": sum(l.allocated for l in stats.lanes) / max(1, device_pages),
        "l2_occupancy": sum(l.host_used for l in stats.lanes) / max(1, host_pages),
    }


def _print_summary(s, windows):
    units = s.get("blocks", s.get("tokens"))
    mode = ", deterministic" if s["deterministic"] else ""
    print(f"{s['workload']} ({s['write_policy']}{mode}): requests {s['requests']}, "
          f"{s['unit']}s {units}")
    print(f"L1 hit rate     {100 * s['l1_hit_rate']:.2f}%")
    print(f"L1+L2 hit rate  {100 * s['l1_l2_hit_rate']:.2f}%")
    print(f"backups {s['backups']} (prepared {s['backups_prepared']}, rolled back "
          f"{s['backups_rolled_back']}), loads {s['loads']}, not admitted "
          f"{s['not_admitted']}, evicted pages: device {s['device_evicted_pages']}, "
          f"host {s['host_evicted_pages']}")
    print(f"deferred inserts {s['deferred_inserts']} (completed on retry "
          f"{s['deferred_then_completed']}, gave up {s['deferred_gave_up']}); held at the "
          f"end: {s['held_pages_at_end']} pages, {s['held_locks_at_end']} locks")
    if s["deterministic"]:
        w = s["settle_wait_us"]
        print(f"waited for backups to settle {w['count']} times (p50 {w['p50']:.1f} us, "
              f"p99 {w['p99']:.1f} us); timeouts {s['settle_timeouts']}")
    r = s["request_latency_us"]
    print(f"request latency (us): p50 {r['p50']:.1f}, p99 {r['p99']:.1f}, "
          f"mean {r['mean']:.1f} over {r['count']} requests")
    print("latency (us)    p50       p99      calls")
    for name, v in s["latency_us"].items():
        print(f"  {name:<13} {v['p50']:8.1f}  {v['p99']:8.1f}  {v['count']:7d}")
    if windows:
        print(f"   t(s) {s['unit'] + 's':>7}   L1 hit  L1+L2 hit  L1 occ  L2 occ")
        for w in windows:
            print(f"{w['t_s']:7.0f} {w['units']:7d}  {100 * w['l1_hit_rate']:6.1f}%"
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
