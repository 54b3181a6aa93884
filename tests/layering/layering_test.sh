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
# The CUDA backend is the only home of the kernels; the engine never sees it.
mkdir -p "$tmp/daemon/engine" "$tmp/daemon/main"
printf '#include "daemon/backend/cuda/cuda_backend.h"\n' > "$tmp/daemon/engine/bad.cc"
printf '#include "cuda_kernels/raw_api.h"\n#include <cuda_runtime.h>\n' > "$tmp/daemon/main/bad.cc"
if (cd "$tmp" && /usr/bin/python3 "$OLDPWD/$checker" daemon/engine/bad.cc daemon/main/bad.cc) > "$tmp/out2"; then
  echo "checker accepted CUDA outside its home" >&2
  exit 1
fi
grep -q "daemon/engine/bad.cc:1: daemon/backend/cuda/cuda_backend.h (cache logic" "$tmp/out2"
grep -q "only daemon/backend/cuda may use the CUDA kernels" "$tmp/out2"
grep -q "CUDA toolkit headers belong in cuda_kernels" "$tmp/out2"
# Metrics sit after the service: nothing before them may include them.
mkdir -p "$tmp/daemon/service"
printf '#include "daemon/metrics/daemon_metrics.h"\n' > "$tmp/daemon/service/bad.cc"
if (cd "$tmp" && /usr/bin/python3 "$OLDPWD/$checker" daemon/service/bad.cc) > "$tmp/out3"; then
  echo "checker accepted the service including metrics" >&2
  exit 1
fi
grep -q "may not depend on later layer metrics" "$tmp/out3"
# The journal (persist) sits right after pool: pool may not include it, and
# as cache logic it sees no gRPC.
mkdir -p "$tmp/daemon/pool" "$tmp/daemon/persist"
printf '#include "daemon/persist/journal_format.h"\n' > "$tmp/daemon/pool/bad.cc"
printf '#include "grpcpp/grpcpp.h"\n' > "$tmp/daemon/persist/bad.cc"
if (cd "$tmp" && /usr/bin/python3 "$OLDPWD/$checker" daemon/pool/bad.cc daemon/persist/bad.cc) > "$tmp/out4"; then
  echo "checker accepted pool including persist" >&2
  exit 1
fi
grep -q "may not depend on later layer persist" "$tmp/out4"
grep -q "daemon/persist/bad.cc:1: grpcpp/grpcpp.h (cache logic" "$tmp/out4"
# The storage tier sits below the engine: it may not include the engine or
# the radix tree, and as cache logic it sees no gRPC or CUDA.
mkdir -p "$tmp/daemon/storage"
printf '#include "daemon/engine/hicache_engine.h"\n#include "cuda_runtime.h"\n' > "$tmp/daemon/storage/bad.cc"
if (cd "$tmp" && /usr/bin/python3 "$OLDPWD/$checker" daemon/storage/bad.cc) > "$tmp/out5"; then
  echo "checker accepted storage including the engine" >&2
  exit 1
fi
grep -q "layer storage may not depend on later layer engine" "$tmp/out5"
grep -q "daemon/storage/bad.cc:2: cuda_runtime.h (cache logic" "$tmp/out5"
echo "layering checker rejects violations: ok"
