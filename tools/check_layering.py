#!/usr/bin/python3
"""Checks the layering of docs/architecture.md through #include directives.

Usage: check_layering.py FILE...   (paths relative to the workspace root)

Rules:
  * A file in daemon/<layer>/ includes "daemon/<other>/..." only for layers at or
    before its own in LAYERS.
  * Cache logic (every layer up to engine but backend, and group) includes no
    gRPC, protobuf or CUDA header.
  * Backends: daemon/backend/backend.h is the interface; daemon/backend/cpu/
    and daemon/backend/cuda/ are implementations. Cache logic may include the
    interface and the CPU backend (the engine's default), never the CUDA
    backend. Only daemon/backend/cuda/ may include the kernels' headers
    (cuda_kernels/, hicache/cuda_kernels/), and no daemon file includes a CUDA
    toolkit header (cuda*.h, nccl.h): those stay in cuda_kernels/*.cu.
  * client/ includes nothing from daemon/.
Prints one line per violation; exits 1 if there is any.
"""

import re
import sys

LAYERS = ["core", "comm", "layout", "alloc", "pool", "persist", "storage",
          "transfer",
          "backend", "radix", "engine", "group", "events", "service", "metrics",
          "main"]
# The CP group layer (daemon/group) sits after the engine and, like it, sees
# no gRPC, protobuf or CUDA header.
CACHE_LOGIC = (set(LAYERS[:LAYERS.index("engine") + 1]) | {"group"}) - {"backend"}
FORBIDDEN_IN_CACHE_LOGIC = re.compile(
    r'^(grpc|grpcpp|google/protobuf|cuda|cuda_runtime|nccl|hicache/v1|'
    r'hicache/cuda_kernels|cuda_kernels/|daemon/backend/cuda/)')
KERNEL_HEADERS = re.compile(r'^(hicache/cuda_kernels/|cuda_kernels/)')
CUDA_TOOLKIT = re.compile(r'^(cuda[a-zA-Z_]*\.h|nccl\.h|cuda/|cub/|thrust/)')
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def layer_of(path):
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "daemon" and parts[1] in LAYERS:
        return parts[1]
    return None


def check(path, lines):
    problems = []
    own = layer_of(path)
    for number, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        header = m.group(1)
        where = "%s:%d: %s" % (path, number, header)
        if path.startswith("client/") and header.startswith("daemon/"):
            problems.append(where + " (client may depend only on proto/)")
        if own is None:
            continue
        target = layer_of(header)
        if target is not None and LAYERS.index(target) > LAYERS.index(own):
            problems.append(where + " (layer %s may not depend on later layer %s)"
                            % (own, target))
        if own in CACHE_LOGIC and FORBIDDEN_IN_CACHE_LOGIC.match(header):
            problems.append(where + " (cache logic must not see gRPC, protobuf"
                            " or CUDA headers)")
        elif (KERNEL_HEADERS.match(header) and
              not path.startswith("daemon/backend/cuda/")):
            problems.append(where + " (only daemon/backend/cuda may use the"
                            " CUDA kernels)")
        if CUDA_TOOLKIT.match(header):
            problems.append(where + " (CUDA toolkit headers belong in"
                            " cuda_kernels/*.cu only)")
    return problems


def main(argv):
    problems = []
    checked = 0
    for path in argv[1:]:
        with open(path, encoding="utf-8") as f:
            problems += check(path, f.read().splitlines())
        checked += 1
    for p in problems:
        print(p)
    print("checked %d files, %d layering violations" % (checked, len(problems)))
    if checked == 0:
        print("no files given")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
