#!/usr/bin/python3
"""Checks the layering of docs/architecture.md through #include directives.

Usage: check_layering.py FILE...   (paths relative to the workspace root)

Rules:
  * A file in daemon/<layer>/ includes "daemon/<other>/..." only for layers at or
    before its own in LAYERS.
  * Cache logic (core .. engine) includes no gRPC, protobuf or CUDA header.
  * client/ includes nothing from daemon/.
Prints one line per violation; exits 1 if there is any.
"""

import re
import sys

LAYERS = ["core", "layout", "alloc", "pool", "transfer", "radix", "engine",
          "service", "main"]
CACHE_LOGIC = set(LAYERS[:LAYERS.index("engine") + 1])
FORBIDDEN_IN_CACHE_LOGIC = re.compile(
    r'^(grpc|grpcpp|google/protobuf|cuda|cuda_runtime|nccl|hicache/v1|'
    r'hicache/cuda_kernels|cuda_kernels/)')
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
