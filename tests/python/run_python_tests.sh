#!/usr/bin/env bash
# Runs the Python tests with Debian's python3 against a real hicached.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="${root}/client/python:${root}/proto/py:${root}/tests/python"
export HICACHED="${root}/daemon/hicached"
export HICACHE_TEST_TRACE="${root}/tests/data/mooncake_head300.jsonl"
export HICACHE_REPLAY_BIN="${root}/bench/replay"
cd "${root}"
exec /usr/bin/python3 tests/python/junit_runner.py "$@"
