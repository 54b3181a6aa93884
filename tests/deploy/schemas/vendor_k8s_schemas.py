"""Vendors the Kubernetes JSON schemas tests/deploy checks manifests against.

    python3 vendor_k8s_schemas.py kubernetes_validate-*.whl [K8S_VERSION]

Reads the strict ("-local-strict": additionalProperties false) schemas of one
Kubernetes version (default 1.29.0) from a kubernetes-validate wheel (PyPI,
Apache-2.0; generated from the Kubernetes OpenAPI, Apache-2.0), keeps the
kinds listed in KINDS and only the definitions they reach, drops the
"description" texts (they are most of the bytes), and writes them to
k8s-v<VERSION>-strict/ next to this script: one <kind>.json per kind and
_definitions.json, unchanged otherwise (refs stay
"/api/_definitions.json#/$defs/..."). The wheel's LICENSE is copied too.
"""

import json
import os
import re
import sys
import zipfile

# Kind file in the wheel -> file written here.
KINDS = {
    "configmap-v1.json": "configmap-v1.json",
    "daemonset-apps-v1.json": "daemonset-apps-v1.json",
    "networkpolicy-networking-v1.json": "networkpolicy-networking-v1.json",
    "pod-v1.json": "pod-v1.json",
    "priorityclass-scheduling-v1.json": "priorityclass-scheduling-v1.json",
    "service-v1.json": "service-v1.json",
}
REF = re.compile(r"^(?:/api/_definitions\.json)?#/\$defs/(.+)$")


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items()
                if k != "description" or not isinstance(v, str)}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                match = REF.match(value)
                if match:
                    yield match.group(1)
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def main():
    wheel = sys.argv[1]
    version = sys.argv[2] if len(sys.argv) > 2 else "1.29.0"
    prefix = f"kubernetes_validate/kubernetes-json-schema/v{version}-local-strict/"
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       f"k8s-v{version}-strict")
    os.makedirs(out, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        definitions = json.loads(z.read(prefix + "_definitions.json"))
        kinds = {name: json.loads(z.read(prefix + name)) for name in KINDS}
        license_text = next(z.read(n) for n in z.namelist()
                            if n.endswith("licenses/LICENSE") or n.endswith("/LICENSE"))
    wanted, todo = set(), [r for schema in kinds.values() for r in refs(schema)]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        todo.extend(refs(definitions["$defs"][name]))
    pruned = dict(definitions)
    pruned["$defs"] = {n: definitions["$defs"][n] for n in sorted(wanted)}
    with open(os.path.join(out, "_definitions.json"), "w") as f:
        json.dump(strip_descriptions(pruned), f, indent=1, sort_keys=True)
        f.write("\n")
    for name, target in KINDS.items():
        with open(os.path.join(out, target), "w") as f:
            json.dump(strip_descriptions(kinds[name]), f, indent=1, sort_keys=True)
            f.write("\n")
    with open(os.path.join(out, "LICENSE"), "wb") as f:
        f.write(license_text)
    print(f"{len(wanted)} definitions, {len(KINDS)} kinds -> {out}")


if __name__ == "__main__":
    main()
