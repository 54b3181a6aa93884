#!/usr/bin/env bash
# Runs k8s_manifests_test.py with Debian's python3 from the runfiles root.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export HICACHE_ROOT="${root}"
export HICACHED="${root}/daemon/hicached"
cd "${root}"
exec /usr/bin/python3 tests/deploy/k8s_manifests_test.py
