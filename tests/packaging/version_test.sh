#!/usr/bin/env bash
# One release, one version: hicached --version, hicachectl --version and the
# Python client's hicache.__version__ (the wheel's version) agree, and both
# binaries carry the same stamped git revision.
set -euo pipefail
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
daemon="$("$runfiles/daemon/hicached" --version)"
ctl="$("$runfiles/client/hicachectl" --version)"
python="$(cd "$runfiles/client/python" && /usr/bin/python3 -c \
  'import importlib.util, sys
spec = importlib.util.spec_from_file_location("v", "hicache/_version.py")
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
print(module.__version__)')"
echo "hicached:   $daemon"
echo "hicachectl: $ctl"
echo "python:     $python"
pattern='^[a-z]+ ([0-9]+\.[0-9]+\.[0-9]+) \(([0-9a-f]{12}(-dirty)?|unknown)\)$'
[[ "$daemon" =~ $pattern ]] || { echo "FAIL: hicached --version: '$daemon'"; exit 1; }
daemon_version="${BASH_REMATCH[1]}"; daemon_revision="${BASH_REMATCH[2]}"
[[ "$ctl" =~ $pattern ]] || { echo "FAIL: hicachectl --version: '$ctl'"; exit 1; }
[[ "${BASH_REMATCH[1]}" == "$daemon_version" ]] || { echo "FAIL: versions differ"; exit 1; }
[[ "${BASH_REMATCH[2]}" == "$daemon_revision" ]] || { echo "FAIL: revisions differ"; exit 1; }
[[ "$python" == "$daemon_version" ]] || {
  echo "FAIL: client/python/hicache/_version.py says $python, version/version.cc $daemon_version"
  exit 1
}
echo "PASS: $daemon_version ($daemon_revision) everywhere"
