"""Offline checks of the Kubernetes manifests in deploy/k8s and the flagfiles.

Every document of every deploy/k8s/*.yaml is validated against the strict
(additionalProperties: false) Kubernetes 1.29 JSON schema of its kind,
vendored in tests/deploy/schemas (see its README). Then the rules a schema
cannot state: Guaranteed QoS (requests == limits for every container), hostIPC
on every pod that uses the daemon's socket (and so maps its pools), no
emptyDir hiding /dev/shm, probes on the daemon, the socket directory's owner,
references between objects (PriorityClass, ConfigMap), and the flagfiles
(ConfigMap and deploy/hicached.flags) naming only flags hicached knows.

Run by tests/deploy:k8s_manifests_test with Debian's python3
(python3-jsonschema, python3-yaml) and $HICACHED set to the daemon binary.
"""

import copy
import glob
import json
import os
import re
import subprocess
import sys
import unittest
import warnings

try:
    import jsonschema
    import yaml
except ImportError as error:  # pragma: no cover - depends on the machine
    print(f"SKIP: {error} (apt-get install python3-jsonschema python3-yaml)")
    sys.exit(0)

ROOT = os.environ.get("HICACHE_ROOT", os.getcwd())
K8S_DIR = os.path.join(ROOT, "deploy", "k8s")
SCHEMA_DIR = os.path.join(ROOT, "tests", "deploy", "schemas", "k8s-v1.29.0-strict")
SYSTEMD_FLAGFILE = os.path.join(ROOT, "deploy", "hicached.flags")

SCHEMAS = {
    ("apps/v1", "DaemonSet"): "daemonset-apps-v1.json",
    ("v1", "Pod"): "pod-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("scheduling.k8s.io/v1", "PriorityClass"): "priorityclass-scheduling-v1.json",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicy-networking-v1.json",
}
MONITORING_DIR = os.path.join(K8S_DIR, "monitoring")
DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")
METRICS_DOC = os.path.join(ROOT, "docs", "metrics.md")
SOCKET_DIR = "/run/hicached"
DAEMON_CONTAINER = "hicached"


def load_json(name):
    with open(os.path.join(SCHEMA_DIR, name)) as f:
        return json.load(f)


def make_validator(schema, definitions):
    """A Draft 2020-12 validator resolving the kind schema's refs into the
    vendored _definitions.json, with the jsonschema of Debian 12 (4.10,
    RefResolver) or a newer one (referencing.Registry)."""
    try:
        from referencing import Registry, Resource  # jsonschema >= 4.18
    except ImportError:
        resolver = jsonschema.RefResolver.from_schema(
            schema, store={definitions["$id"]: definitions})
        return jsonschema.Draft202012Validator(schema, resolver=resolver)
    registry = Registry().with_resource(
        definitions["$id"], Resource.from_contents(definitions))
    return jsonschema.Draft202012Validator(schema, registry=registry)


_VALIDATORS = {}


def schema_errors(doc):
    """Schema violations of one manifest document, as strings."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in SCHEMAS:
        return [f"no vendored schema for apiVersion={key[0]} kind={key[1]}"]
    if key not in _VALIDATORS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _VALIDATORS[key] = make_validator(load_json(SCHEMAS[key]),
                                              load_json("_definitions.json"))
    errors = []
    for error in _VALIDATORS[key].iter_errors(doc):
        path = "/".join(str(p) for p in error.absolute_path)
        errors.append(f"{key[1]} {name_of(doc)}: /{path}: {error.message[:300]}")
    return errors


def name_of(doc):
    return (doc.get("metadata") or {}).get("name", "?")


def load_manifests():
    docs = []
    for path in sorted(glob.glob(os.path.join(K8S_DIR, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((os.path.basename(path), doc))
    return docs


def pod_specs(docs):
    """(description, pod spec, pod metadata) of every Pod and pod template."""
    for file, doc in docs:
        if doc.get("kind") == "Pod":
            yield f"{file}: Pod {name_of(doc)}", doc.get("spec") or {}, doc.get("metadata") or {}
        elif doc.get("kind") in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            template = (doc.get("spec") or {}).get("template") or {}
            yield (f"{file}: {doc['kind']} {name_of(doc)}", template.get("spec") or {},
                   template.get("metadata") or {})


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def quantity(value):
    match = _QUANTITY.match(str(value))
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def qos_errors(where, spec):
    """Guaranteed QoS: every container and init container has cpu and memory
    requests and limits, equal; any other resource requested equals its
    limit."""
    errors = []
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        name = container.get("name")
        for resource in ("cpu", "memory"):
            if resource not in limits:
                errors.append(f"{where}: container {name} has no {resource} limit")
            elif resource in requests and quantity(requests[resource]) != quantity(limits[resource]):
                errors.append(f"{where}: container {name}: {resource} request "
                              f"{requests[resource]} != limit {limits[resource]}")
        for resource in set(requests) | set(limits):
            if resource in ("cpu", "memory"):
                continue
            if resource not in limits or resource not in requests or \
                    quantity(requests[resource]) != quantity(limits[resource]):
                errors.append(f"{where}: container {name}: {resource} requests and "
                              f"limits differ")
    return errors


def uses_daemon_socket(spec):
    return any((v.get("hostPath") or {}).get("path") == SOCKET_DIR
               for v in spec.get("volumes") or [])


def shm_errors(where, spec):
    errors = []
    if uses_daemon_socket(spec) and spec.get("hostIPC") is not True:
        errors.append(f"{where}: uses {SOCKET_DIR} but not hostIPC: it cannot map "
                      "the daemon's shared-memory pools")
    memory_volumes = {v["name"] for v in spec.get("volumes") or []
                      if (v.get("emptyDir") or {}).get("medium") == "Memory"}
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        for mount in container.get("volumeMounts") or []:
            if mount.get("mountPath", "").rstrip("/") == "/dev/shm" and spec.get("hostIPC"):
                errors.append(f"{where}: container {container.get('name')} mounts a "
                              "volume on /dev/shm, hiding the node's (the pools)")
            elif mount.get("name") in memory_volumes and mount.get("mountPath") == "/dev/shm":
                errors.append(f"{where}: emptyDir on /dev/shm")
    return errors


def parse_flagfile(text):
    """absl flagfile: {flag: value} of its --flag=value lines; raises on a
    line that is neither that, a comment nor blank."""
    flags = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^--([a-z0-9_]+)(?:=(.*))?$", line)
        if not match:
            raise ValueError(f"line {number}: not --flag=value: {line!r}")
        flags[match.group(1)] = match.group(2) if match.group(2) is not None else "true"
    return flags


_KNOWN_FLAGS = None


def known_flags():
    """The flags hicached defines, from `hicached --helpfull`."""
    global _KNOWN_FLAGS
    if _KNOWN_FLAGS is None:
        out = subprocess.run([os.environ["HICACHED"], "--helpfull"], capture_output=True,
                             text=True, timeout=30)
        _KNOWN_FLAGS = set(re.findall(r"^\s+--([a-z0-9_]+)", out.stdout + out.stderr,
                                      re.MULTILINE))
        if "socket" not in _KNOWN_FLAGS:
            raise RuntimeError("cannot read hicached --helpfull:\n" + out.stdout + out.stderr)
    return _KNOWN_FLAGS


PREFIX_CLOSED_WRITE_POLICIES = ("write_through", "write_ahead")


def flagfile_errors(where, text):
    try:
        flags = parse_flagfile(text)
    except ValueError as error:
        return [f"{where}: {error}"]
    errors = [f"{where}: unknown flag --{f}" for f in flags if f not in known_flags()]
    if "eviction_policy" in flags:
        errors.append(f"{where}: pins --eviction_policy={flags['eviction_policy']}; the "
                      "daemon's default (tinylfu) should apply")
    # Hot restart needs a prefix-closed host tier (docs/hot-restart.md §1):
    # write_back loses its cold suffixes in a crash. The daemon's default,
    # write_ahead, is prefix-closed.
    policy = flags.get("write_policy", "write_ahead")
    if flags.get("state_dir") and policy not in PREFIX_CLOSED_WRITE_POLICIES:
        errors.append(f"{where}: --state_dir with --write_policy={policy}, whose host tier a "
                      "crash mostly loses; use write_ahead")
    elif "write_policy" in flags and not flags.get("state_dir"):
        errors.append(f"{where}: pins --write_policy={policy} without hot restart; the "
                      "daemon's default (write_ahead) should apply")
    if flags.get("socket", "").rsplit("/", 1)[0] != SOCKET_DIR:
        errors.append(f"{where}: --socket is not in {SOCKET_DIR}")
    if not flags.get("metrics_address"):
        errors.append(f"{where}: no --metrics_address (deploy files enable metrics)")
    return errors


def check_all(docs):
    """Every error of the manifest set `docs` ([(file, document)])."""
    errors = []
    for file, doc in docs:
        errors += [f"{file}: {e}" for e in schema_errors(doc)]
    if errors:
        return errors
    by_kind = {}
    for _, doc in docs:
        by_kind.setdefault(doc["kind"], {})[name_of(doc)] = doc
    daemon_spec = None
    for where, spec, meta in pod_specs(docs):
        errors += qos_errors(where, spec)
        errors += shm_errors(where, spec)
        if spec.get("priorityClassName") and \
                spec["priorityClassName"] not in by_kind.get("PriorityClass", {}):
            errors.append(f"{where}: priorityClassName {spec['priorityClassName']} is "
                          "not defined in deploy/k8s")
        for container in spec.get("containers") or []:
            if container.get("name") == DAEMON_CONTAINER:
                daemon_spec = (where, spec, meta, container)
    if daemon_spec is None:
        return errors + ["no pod template with a container named hicached"]
    errors += daemon_errors(*daemon_spec, by_kind)
    return errors


def daemon_errors(where, spec, meta, container, by_kind):
    errors = []
    if not spec.get("priorityClassName"):
        errors.append(f"{where}: no priorityClassName")
    if not spec.get("tolerations"):
        errors.append(f"{where}: no tolerations (GPU nodes are tainted)")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = ((container.get(probe) or {}).get("exec") or {}).get("command") or []
        grpc = (container.get(probe) or {}).get("grpc")
        if not grpc and not (command and command[0].endswith("hicachectl") and
                             "health" in command):
            errors.append(f"{where}: {probe} is not a gRPC health check "
                          "(hicachectl health or grpc:)")
    # Settings: the flagfile from the ConfigMap, mounted where --flagfile reads.
    args = container.get("args") or []
    flagfile = next((a.split("=", 1)[1] for a in args if a.startswith("--flagfile=")), None)
    if flagfile is None:
        return errors + [f"{where}: the daemon has no --flagfile"]
    mount_dir, key = flagfile.rsplit("/", 1)
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    volume = volumes.get(mounts.get(mount_dir, ""), {})
    config_name = (volume.get("configMap") or {}).get("name")
    config = by_kind.get("ConfigMap", {}).get(config_name)
    if config is None or key not in (config.get("data") or {}):
        return errors + [f"{where}: --flagfile={flagfile} is not a key of a ConfigMap "
                         "in deploy/k8s mounted there"]
    text = config["data"][key]
    errors += flagfile_errors(f"ConfigMap {config_name}/{key}", text)
    flags = parse_flagfile(text) if not errors else {}
    # Metrics: the port the flag names is the container's "metrics" port and
    # the one Prometheus is told to scrape.
    if flags.get("metrics_address"):
        port = flags["metrics_address"].rsplit(":", 1)[-1]
        ports = {p.get("name"): str(p.get("containerPort")) for p in container.get("ports") or []}
        annotations = meta.get("annotations") or {}
        if ports.get("metrics") != port:
            errors.append(f"{where}: container port 'metrics' is not {port}")
        if annotations.get("prometheus.io/scrape") != "true" or \
                annotations.get("prometheus.io/port") != port:
            errors.append(f"{where}: Prometheus annotations do not scrape port {port}")
        if flags["metrics_address"].startswith("127."):
            errors.append(f"{where}: metrics on loopback cannot be scraped from outside the pod")
    grace = float(flags.get("shutdown_grace_seconds", 5))
    if spec.get("terminationGracePeriodSeconds", 30) <= grace:
        errors.append(f"{where}: terminationGracePeriodSeconds <= --shutdown_grace_seconds")
    # Socket directory: a hostPath (shared with the clients) whose owner is
    # the daemon's user: an init container chowns it (fsGroup does not apply
    # to hostPath).
    context = spec.get("securityContext") or {}
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if uid in (None, 0):
        errors.append(f"{where}: the daemon runs as root")
    socket_volume = next((v for v in spec.get("volumes") or []
                          if (v.get("hostPath") or {}).get("path") == SOCKET_DIR), None)
    if socket_volume is None:
        errors.append(f"{where}: no hostPath {SOCKET_DIR}")
    elif not any(f"chown {uid}:{gid} {SOCKET_DIR}" in " ".join(c.get("command") or [])
                 and any(m.get("name") == socket_volume["name"]
                         for m in c.get("volumeMounts") or [])
                 for c in spec.get("initContainers") or []):
        errors.append(f"{where}: no init container gives {SOCKET_DIR} to {uid}:{gid}")
    # Clients that use the socket are in the daemon's group.
    for other_where, other, _ in pod_specs([("", d) for k in by_kind.values() for d in k.values()]):
        if other is spec or not uses_daemon_socket(other):
            continue
        groups = set((other.get("securityContext") or {}).get("supplementalGroups") or [])
        groups.add((other.get("securityContext") or {}).get("runAsGroup"))
        if gid not in groups:
            errors.append(f"{other_where}: not in the daemon's group {gid}: cannot use "
                          "the socket or the pools (0660)")
    return errors


class K8sManifestsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.docs = load_manifests()

    def test_all_kinds_present(self):
        kinds = sorted({d["kind"] for _, d in self.docs})
        self.assertEqual(kinds, ["ConfigMap", "DaemonSet", "NetworkPolicy", "Pod",
                                 "PriorityClass"])
        files = {f for f, _ in self.docs}
        self.assertIn("scheduler-pod-example.yaml", files)

    def daemon_pod(self):
        (daemon,) = [d for _, d in self.docs if d["kind"] == "DaemonSet"]
        return daemon["spec"]["template"]

    def test_network_policy_selects_the_daemon_and_opens_its_metrics_port(self):
        (policy,) = [d for _, d in self.docs if d["kind"] == "NetworkPolicy"]
        pod = self.daemon_pod()
        labels = pod["metadata"]["labels"]
        for key, value in policy["spec"]["podSelector"]["matchLabels"].items():
            self.assertEqual(labels.get(key), value)
        ports = {p["containerPort"] for c in pod["spec"]["containers"]
                 for p in c.get("ports", [])}
        opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
        self.assertTrue(opened, "no ingress port")
        self.assertLessEqual(opened, ports)
        self.assertEqual(sorted(policy["spec"]["policyTypes"]), ["Egress", "Ingress"])

    def test_monitoring_manifests_match_the_daemon_and_the_metrics(self):
        docs = {}
        for path in sorted(glob.glob(os.path.join(MONITORING_DIR, "*.yaml"))):
            with open(path) as f:
                for doc in yaml.safe_load_all(f):
                    docs[doc["kind"]] = doc
        self.assertEqual(sorted(docs), ["PodMonitor", "PrometheusRule"])
        for doc in docs.values():
            self.assertEqual(doc["apiVersion"], "monitoring.coreos.com/v1")
        # The PodMonitor finds the daemon's pods and their metrics port.
        pod = self.daemon_pod()
        monitor = docs["PodMonitor"]["spec"]
        for key, value in monitor["selector"]["matchLabels"].items():
            self.assertEqual(pod["metadata"]["labels"].get(key), value)
        port_names = {p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for endpoint in monitor["podMetricsEndpoints"]:
            self.assertIn(endpoint["port"], port_names)
        # Every alert names only metrics docs/metrics.md documents, and each
        # alert of its table has a rule (all but the workload-relative one).
        with open(METRICS_DOC) as f:
            documented = f.read()
        rules = [r for g in docs["PrometheusRule"]["spec"]["groups"] for r in g["rules"]]
        names = [r["alert"] for r in rules]
        self.assertEqual(len(names), len(set(names)))
        for rule in rules:
            self.assertTrue(rule["expr"].strip(), rule["alert"])
            self.assertIn(rule["labels"]["severity"], ("critical", "warning", "info"))
            for metric in re.findall(r"\b(hicache_\w+)", rule["expr"]):
                metric = re.sub(r"_(bucket|sum|count)$", "", metric)
                self.assertIn(f"{metric}", documented, f"{rule['alert']}: {metric}")
        table = documented.split("## What to alert on", 1)[1].split("\n## ", 1)[0]
        rows = [line for line in table.splitlines()
                if line.startswith("| ") and not line.startswith("| alert")]
        self.assertEqual(len(rules), len(rows) - 1, "one rule per alert row but 'hit rate drop'")

    def test_dockerfile_builds_the_image_the_daemonset_runs(self):
        """No container engine runs here (and hadolint is not in Debian 12):
        the Dockerfile is checked against the rules that make the image work
        with the DaemonSet and the .deb."""
        with open(DOCKERFILE) as f:
            lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        text = "\n".join(lines).replace("\\\n", " ")
        instructions = [line.split(None, 1) for line in text.split("\n")]
        self.assertEqual(instructions[0], ["FROM", "debian:12-slim"],
                         "the .deb is built on Debian 12: its libraries must match")
        self.assertNotIn("ADD", [i[0] for i in instructions], "COPY, never ADD")
        run = " ".join(i[1] for i in instructions if i[0] == "RUN")
        self.assertIn("apt-get install -y --no-install-recommends /tmp/hicached_", run,
                      "install the .deb through apt, so that its Depends resolve")
        self.assertIn("rm -rf /var/lib/apt/lists/*", run)
        pod = self.daemon_pod()["spec"]
        user = [i[1] for i in instructions if i[0] == "USER"]
        self.assertEqual(user, [f"{pod['securityContext']['runAsUser']}:"
                                f"{pod['securityContext']['runAsGroup']}"])
        (container,) = [c for c in pod["containers"] if c["name"] == DAEMON_CONTAINER]
        entry = json.loads([i[1] for i in instructions if i[0] == "ENTRYPOINT"][0])
        cmd = json.loads([i[1] for i in instructions if i[0] == "CMD"][0])
        self.assertEqual(entry, container["command"])
        self.assertEqual(cmd, container["args"])
        self.assertFalse(container["image"].endswith(":latest"))

    def test_manifests_pass(self):
        errors = check_all(self.docs)
        self.assertEqual(errors, [], "\n".join(errors))

    def test_systemd_flagfile_names_known_flags(self):
        with open(SYSTEMD_FLAGFILE) as f:
            errors = flagfile_errors("deploy/hicached.flags", f.read())
        # Loopback metrics are right for systemd (IPAddressAllow=localhost).
        errors = [e for e in errors if "loopback" not in e]
        self.assertEqual(errors, [], "\n".join(errors))

    # The checker itself: each rule catches what it is for.
    def mutated(self, kind, change):
        docs = copy.deepcopy(self.docs)
        for _, doc in docs:
            if doc["kind"] == kind:
                change(doc)
        return check_all(docs)

    def assert_caught(self, errors, text):
        self.assertTrue(any(text in e for e in errors), f"{text!r} not in {errors}")

    def test_schema_rejects_unknown_fields_and_bad_types(self):
        self.assert_caught(self.mutated("DaemonSet", lambda d: d["spec"]["template"]["spec"]
                                        .update(hostIpc=True)), "hostIpc")
        self.assert_caught(self.mutated("Pod", lambda d: d["spec"].update(hostIPC="yes")),
                           "hostIPC")
        self.assert_caught(self.mutated("PriorityClass", lambda d: d.update(value="high")),
                           "value")

    def daemon(self, doc):
        return doc["spec"]["template"]["spec"]

    def test_qos_rule(self):
        def burstable(doc):
            self.daemon(doc)["containers"][0]["resources"]["requests"]["memory"] = "8Gi"
        self.assert_caught(self.mutated("DaemonSet", burstable), "memory request 8Gi != limit")

        def no_init_limits(doc):
            del self.daemon(doc)["initContainers"][0]["resources"]["limits"]
        self.assert_caught(self.mutated("DaemonSet", no_init_limits), "has no cpu limit")

        def gpu_request_only(doc):
            self.daemon(doc)["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = 1
        self.assert_caught(self.mutated("DaemonSet", gpu_request_only),
                           "nvidia.com/gpu requests and limits differ")
        self.assertEqual(quantity("4000m"), quantity("4"))
        self.assertEqual(quantity("1Gi"), quantity("1024Mi"))

    def test_host_ipc_rules(self):
        self.assert_caught(self.mutated("Pod", lambda d: d["spec"].pop("hostIPC")),
                           "not hostIPC")

        def dshm(doc):
            spec = self.daemon(doc)
            spec["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
            spec["containers"][0]["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
        self.assert_caught(self.mutated("DaemonSet", dshm), "hiding the node's")

    def test_daemon_rules(self):
        self.assert_caught(self.mutated("DaemonSet", lambda d: self.daemon(d)["containers"][0]
                                        .pop("livenessProbe")), "livenessProbe")
        self.assert_caught(self.mutated("DaemonSet", lambda d: self.daemon(d)
                                        .update(priorityClassName="other")), "not defined")
        self.assert_caught(self.mutated("DaemonSet", lambda d: self.daemon(d)
                                        .pop("initContainers")), "no init container")
        self.assert_caught(self.mutated("Pod", lambda d: d["spec"]["securityContext"]
                                        .update(supplementalGroups=[5])),
                           "not in the daemon's group")

        def typo_flag(doc):
            doc["data"]["hicached.flags"] += "--metrics_adress=0.0.0.0:9464\n"
        self.assert_caught(self.mutated("ConfigMap", typo_flag), "unknown flag --metrics_adress")

        def pinned(doc):
            doc["data"]["hicached.flags"] += "--eviction_policy=lru\n"
        self.assert_caught(self.mutated("ConfigMap", pinned), "pins --eviction_policy")

        def restart_unsafe(doc):
            doc["data"]["hicached.flags"] = doc["data"]["hicached.flags"].replace(
                "--write_policy=write_ahead", "--write_policy=write_back")
        self.assert_caught(self.mutated("ConfigMap", restart_unsafe),
                           "--state_dir with --write_policy=write_back")

        def wrong_port(doc):
            doc["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = "9000"
        self.assert_caught(self.mutated("DaemonSet", wrong_port), "Prometheus annotations")


if __name__ == "__main__":
    unittest.main(verbosity=2)
