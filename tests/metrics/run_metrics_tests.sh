#!/usr/bin/env bash
# Runs the metrics tests with Debian's python3 against a real hicached.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="${root}/client/python:${root}/proto/py:${root}/tests/metrics"
export HICACHED="${root}/daemon/hicached"
export HICACHE_DASHBOARD="${root}/deploy/grafana/hicached.json"
cd "${root}"
exec /usr/bin/python3 tests/python/junit_runner.py "$@"
