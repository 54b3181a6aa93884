#!/bin/bash
# Runs //bench:cp_group_bench (both modes: in process, and real hicached
# processes) with tiny counts and checks that it prints every row and its
# JSON lines (figures are not checked). Group timeouts are generous so that
# a loaded CI machine (or TSan) never sees a false death.
set -euo pipefail
bin="${TEST_SRCDIR}/${TEST_WORKSPACE}/bench/cp_group_bench"
out="$("$bin" --mode=both --iterations=10 --warmup=2 --tree_calls=10 \
  --pages=4 --heartbeat_ms=50 --heartbeat_timeout_ms=20000 \
  --timeout_ms_processes=20000 --json)"
echo "$out"
for row in "local ack -> committed" "step event -> committed" \
    "prepare -> committed" "Match (absent key)" "Allocate" \
    '"added_ack_to_commit_p50_us"' "layer_stored(last) -> commit" \
    "MatchPrefix (absent key)" "group state at the end: formed, deaths 0" \
    '"processes":true'; do
  grep -qF -- "$row" <<<"$out" || { echo "missing: $row"; exit 1; }
done
