#!/usr/bin/env bash
# Runs tools/check_layering.py over every daemon and client source file, and
# checks that the checker itself catches a violation.
set -euo pipefail
checker="$1"
# The daemon and client sources are in this test's runfiles (data deps).
mapfile -t files < <(find daemon client -name '*.h' -o -name '*.cc' | sort)
[[ ${#files[@]} -gt 10 ]] || { echo "too few sources found: ${#files[@]}" >&2; exit 1; }
/usr/bin/python3 "$checker" "${files[@]}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/daemon/radix"
printf '#include "grpcpp/server.h"\n#include "daemon/service/x.h"\n' > "$tmp/daemon/radix/bad.h"
if (cd "$tmp" && /usr/bin/python3 "$OLDPWD/$checker" daemon/radix/bad.h) > "$tmp/out"; then
  echo "checker accepted a violating file" >&2
  exit 1
fi
grep -q "must not see gRPC" "$tmp/out"
grep -q "may not depend on later layer service" "$tmp/out"
echo "layering checker rejects violations: ok"
