#!/usr/bin/env python3
"""k8s_check: offline check of MapFlow's Kubernetes manifests (no cluster, no kubectl).

    k8s_check.py [--mapflowd BIN] DIR_OR_FILE...    exit 0 when all pass, 1 otherwise

Three layers, each printed as it is checked:
  1. YAML: every *.yaml parses (multi-document files allowed).
  2. Schema: a hand-written schema of exactly the kinds and fields MapFlow uses (types,
     required fields, allowed values). Objects are closed: an unknown field is an error,
     so a misspelt key (`livenesProbe`) fails here instead of being ignored by the API.
  3. References and policy: selectors match labels, probes and Service targetPorts
     name container ports, volume mounts name volumes, ConfigMap keys exist, the
     ConfigMap's mapflowd.conf puts the socket and data_dir on hostPath mounts and the
     http/tcp ports on container ports, the memory request covers host_bytes, no GPU is
     requested by the daemon, no hostIPC/hostPID anywhere, kustomization lists every file
     (each Component directory its own) and its images: tag is the containers' tag, the
     daemon runs at priorityClassName system-node-critical (with a ResourceQuota scoped to
     it in its namespace), a ucx listener is a container
     port and a port of the headless Service,
     the token is no argument (/proc/PID/cmdline) but a --token_file the daemon can read
     and will accept (0400, its own, in memory; written by an init container).
     With --mapflowd, the config text also goes through `mapflowd --check-config FILE`
     when that binary supports the flag (said so when it does not).
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

# ==== schema ========================================================================


class Spec:
    def check(self, v, path, errs):
        raise NotImplementedError


class Scalar(Spec):
    def __init__(self, kind, allowed=None, lo=None, hi=None, pattern=None):
        self.kind, self.allowed, self.lo, self.hi = kind, allowed, lo, hi
        self.pattern = re.compile(pattern) if pattern else None

    def check(self, v, path, errs):
        ok = {
            "str": isinstance(v, str),
            "int": isinstance(v, int) and not isinstance(v, bool),
            "bool": isinstance(v, bool),
            "intstr": (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, str),
            "quantity": (isinstance(v, (int, float)) and not isinstance(v, bool))
            or (isinstance(v, str) and QUANTITY.fullmatch(v) is not None),
        }[self.kind]
        if not ok:
            errs.append(f"{path}: expected {self.kind}, got {type(v).__name__} {v!r}")
            return
        if self.allowed is not None and v not in self.allowed:
            errs.append(f"{path}: {v!r} not one of {sorted(self.allowed)}")
        if self.lo is not None and isinstance(v, int) and v < self.lo:
            errs.append(f"{path}: {v} < {self.lo}")
        if self.hi is not None and isinstance(v, int) and v > self.hi:
            errs.append(f"{path}: {v} > {self.hi}")
        if self.pattern and isinstance(v, str) and not self.pattern.fullmatch(v):
            errs.append(f"{path}: {v!r} does not match {self.pattern.pattern}")


class Obj(Spec):
    def __init__(self, fields, required=(), one_of=None):
        self.fields, self.required, self.one_of = fields, set(required), one_of

    def check(self, v, path, errs):
        if not isinstance(v, dict):
            errs.append(f"{path}: expected a mapping, got {type(v).__name__}")
            return
        for k in sorted(self.required - v.keys()):
            errs.append(f"{path}.{k}: required field missing")
        for k, val in v.items():
            spec = self.fields.get(k)
            if spec is None:
                errs.append(f"{path}.{k}: unknown field (not in the schema of fields we use)")
            else:
                spec.check(val, f"{path}.{k}", errs)
        if self.one_of is not None:
            n = len(self.one_of & v.keys())
            if n != 1:
                errs.append(f"{path}: exactly one of {sorted(self.one_of)} expected, got {n}")


class List(Spec):
    def __init__(self, item, min_len=0):
        self.item, self.min_len = item, min_len

    def check(self, v, path, errs):
        if not isinstance(v, list):
            errs.append(f"{path}: expected a list, got {type(v).__name__}")
            return
        if len(v) < self.min_len:
            errs.append(f"{path}: at least {self.min_len} item(s) expected")
        for i, x in enumerate(v):
            self.item.check(x, f"{path}[{i}]", errs)


class Map(Spec):
    """A mapping with free keys (labels, data, resource lists)."""

    def __init__(self, value, key_pattern=None):
        self.value = value
        self.key_pattern = re.compile(key_pattern) if key_pattern else None

    def check(self, v, path, errs):
        if not isinstance(v, dict):
            errs.append(f"{path}: expected a mapping, got {type(v).__name__}")
            return
        for k, val in v.items():
            if not isinstance(k, str) or (self.key_pattern and not self.key_pattern.fullmatch(k)):
                errs.append(f"{path}: bad key {k!r}")
            self.value.check(val, f"{path}[{k!r}]", errs)


QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?")
DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
LABEL_KEY = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
ABS_PATH = r"/[^\0]*"

S, I, B = Scalar("str"), Scalar("int"), Scalar("bool")
PORT = Scalar("int", lo=1, hi=65535)
PORT_REF = Scalar("intstr")
NAME = Scalar("str", pattern=DNS_LABEL)
LABELS = Map(Scalar("str", pattern=LABEL_VALUE), key_pattern=LABEL_KEY)
STRS = List(S)


def meta(namespaced):
    fields = {"name": Scalar("str", pattern=DNS_SUBDOMAIN), "labels": LABELS,
              "annotations": Map(S)}
    if namespaced:
        fields["namespace"] = NAME
    return Obj(fields, required=("name", "namespace") if namespaced else ("name",))


PROBE = Obj({
    "httpGet": Obj({"path": Scalar("str", pattern=ABS_PATH), "port": PORT_REF,
                    "scheme": Scalar("str", allowed={"HTTP", "HTTPS"})}, required=("port",)),
    "tcpSocket": Obj({"port": PORT_REF}, required=("port",)),
    "exec": Obj({"command": List(S, 1)}, required=("command",)),
    "initialDelaySeconds": Scalar("int", lo=0), "periodSeconds": Scalar("int", lo=1),
    "timeoutSeconds": Scalar("int", lo=1), "failureThreshold": Scalar("int", lo=1),
    "successThreshold": Scalar("int", lo=1),
}, one_of={"httpGet", "tcpSocket", "exec"})

CAPS = List(Scalar("str", pattern=r"[A-Z_]+"))
CONTAINER_SC = Obj({
    "runAsNonRoot": B, "runAsUser": Scalar("int", lo=0), "runAsGroup": Scalar("int", lo=0),
    "allowPrivilegeEscalation": B, "readOnlyRootFilesystem": B, "privileged": B,
    "capabilities": Obj({"add": CAPS, "drop": CAPS}),
})
ENV = Obj({
    "name": Scalar("str", pattern=r"[A-Za-z_][A-Za-z0-9_]*"),
    "value": S,
    "valueFrom": Obj({
        "secretKeyRef": Obj({"name": NAME, "key": S, "optional": B}, required=("name", "key")),
        "configMapKeyRef": Obj({"name": NAME, "key": S, "optional": B}, required=("name", "key")),
        "fieldRef": Obj({"fieldPath": S}, required=("fieldPath",)),
    }, one_of={"secretKeyRef", "configMapKeyRef", "fieldRef"}),
}, required=("name",))
CONTAINER = Obj({
    "name": NAME, "image": S,
    "imagePullPolicy": Scalar("str", allowed={"Always", "IfNotPresent", "Never"}),
    "command": List(S), "args": List(S), "env": List(ENV),
    "ports": List(Obj({"name": Scalar("str", pattern=r"[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?"),
                       "containerPort": PORT, "hostPort": PORT,
                       "protocol": Scalar("str", allowed={"TCP", "UDP", "SCTP"})},
                      required=("containerPort",))),
    "startupProbe": PROBE, "livenessProbe": PROBE, "readinessProbe": PROBE,
    "resources": Obj({"requests": Map(Scalar("quantity")), "limits": Map(Scalar("quantity"))}),
    "volumeMounts": List(Obj({"name": NAME, "mountPath": Scalar("str", pattern=ABS_PATH),
                              "readOnly": B, "subPath": S}, required=("name", "mountPath"))),
    "securityContext": CONTAINER_SC,
}, required=("name", "image"))
VOLUME = Obj({
    "name": NAME,
    "configMap": Obj({"name": NAME, "defaultMode": I,
                      "items": List(Obj({"key": S, "path": S}, required=("key", "path")))},
                     required=("name",)),
    "secret": Obj({"secretName": NAME, "defaultMode": I}, required=("secretName",)),
    "hostPath": Obj({"path": Scalar("str", pattern=ABS_PATH),
                     "type": Scalar("str", allowed={"", "DirectoryOrCreate", "Directory",
                                                    "FileOrCreate", "File", "Socket",
                                                    "CharDevice", "BlockDevice"})},
                    required=("path",)),
    "emptyDir": Obj({"medium": Scalar("str", allowed={"", "Memory"}), "sizeLimit": Scalar("quantity")}),
}, required=("name",), one_of={"configMap", "secret", "hostPath", "emptyDir"})
POD_SPEC = Obj({
    "nodeSelector": LABELS,
    "tolerations": List(Obj({"key": S, "operator": Scalar("str", allowed={"Exists", "Equal"}),
                             "value": S,
                             "effect": Scalar("str", allowed={"NoSchedule", "PreferNoSchedule",
                                                              "NoExecute"})})),
    "runtimeClassName": NAME, "priorityClassName": NAME, "serviceAccountName": NAME,
    "terminationGracePeriodSeconds": Scalar("int", lo=0),
    "restartPolicy": Scalar("str", allowed={"Always", "OnFailure", "Never"}),
    "hostIPC": B, "hostPID": B, "hostNetwork": B,
    "securityContext": Obj({"runAsNonRoot": B, "runAsUser": Scalar("int", lo=0),
                            "runAsGroup": Scalar("int", lo=0), "fsGroup": Scalar("int", lo=0),
                            "supplementalGroups": List(Scalar("int", lo=0)),
                            "seccompProfile": Obj({"type": Scalar("str", allowed={
                                "RuntimeDefault", "Localhost", "Unconfined"})},
                                required=("type",))}),
    "initContainers": List(CONTAINER),
    "containers": List(CONTAINER, 1),
    "volumes": List(VOLUME),
}, required=("containers",))
SELECTOR = Obj({"matchLabels": LABELS}, required=("matchLabels",))

KINDS = {
    ("v1", "Namespace"): Obj({"apiVersion": S, "kind": S, "metadata": meta(False)},
                             required=("apiVersion", "kind", "metadata")),
    ("v1", "ConfigMap"): Obj({"apiVersion": S, "kind": S, "metadata": meta(True),
                              "data": Map(S, key_pattern=r"[-._a-zA-Z0-9]+")},
                             required=("apiVersion", "kind", "metadata", "data")),
    ("apps/v1", "DaemonSet"): Obj({
        "apiVersion": S, "kind": S, "metadata": meta(True),
        "spec": Obj({
            "selector": SELECTOR,
            "updateStrategy": Obj({
                "type": Scalar("str", allowed={"RollingUpdate", "OnDelete"}),
                "rollingUpdate": Obj({"maxUnavailable": PORT_REF, "maxSurge": PORT_REF})}),
            "template": Obj({"metadata": Obj({"labels": LABELS, "annotations": Map(S)},
                                             required=("labels",)),
                             "spec": POD_SPEC}, required=("metadata", "spec")),
        }, required=("selector", "template")),
    }, required=("apiVersion", "kind", "metadata", "spec")),
    ("v1", "Service"): Obj({
        "apiVersion": S, "kind": S, "metadata": meta(True),
        "spec": Obj({
            "clusterIP": S, "selector": LABELS, "publishNotReadyAddresses": B,
            "type": Scalar("str", allowed={"ClusterIP", "NodePort", "LoadBalancer"}),
            "internalTrafficPolicy": Scalar("str", allowed={"Cluster", "Local"}),
            "ports": List(Obj({"name": NAME, "port": PORT, "targetPort": PORT_REF,
                               "protocol": Scalar("str", allowed={"TCP", "UDP", "SCTP"})},
                              required=("port",)), 1),
        }, required=("selector", "ports")),
    }, required=("apiVersion", "kind", "metadata", "spec")),
    ("v1", "ResourceQuota"): Obj({
        "apiVersion": S, "kind": S, "metadata": meta(True),
        "spec": Obj({
            "hard": Map(Scalar("quantity")),
            "scopeSelector": Obj({"matchExpressions": List(Obj({
                "scopeName": Scalar("str", allowed={"PriorityClass", "Terminating",
                                                    "NotTerminating", "BestEffort",
                                                    "NotBestEffort", "CrossNamespacePodAffinity"}),
                "operator": Scalar("str", allowed={"In", "NotIn", "Exists", "DoesNotExist"}),
                "values": List(S)}, required=("scopeName", "operator")), 1)},
                required=("matchExpressions",)),
        }, required=("hard",)),
    }, required=("apiVersion", "kind", "metadata", "spec")),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): Obj({
        "apiVersion": S, "kind": S, "metadata": meta(True),
        "spec": Obj({
            "selector": SELECTOR,
            "namespaceSelector": Obj({"matchNames": List(NAME, 1)}),
            "endpoints": List(Obj({"port": NAME, "path": Scalar("str", pattern=ABS_PATH),
                                   "interval": Scalar("str", pattern=r"[0-9]+(ms|s|m|h)"),
                                   "scheme": Scalar("str", allowed={"http", "https"})},
                                  required=("port",)), 1),
        }, required=("selector", "endpoints")),
    }, required=("apiVersion", "kind", "metadata", "spec")),
    ("v1", "Pod"): Obj({"apiVersion": S, "kind": S, "metadata": meta(True), "spec": POD_SPEC},
                       required=("apiVersion", "kind", "metadata", "spec")),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): Obj({
        "apiVersion": S, "kind": S, "namespace": NAME, "resources": List(S, 1),
        "components": List(S),
        "images": List(Obj({"name": S, "newName": S, "newTag": S}, required=("name",)))},
        required=("apiVersion", "kind", "resources")),
    ("kustomize.config.k8s.io/v1alpha1", "Component"): Obj({
        "apiVersion": S, "kind": S, "resources": List(S, 1)},
        required=("apiVersion", "kind", "resources")),
}

# ==== helpers =======================================================================

SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
              "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
              "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
QTY_UNITS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
             "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
             "Ei": 2**60}
# Pinned host arena + what the daemon needs besides it (RocksDB memtables, loop).
MEMORY_HEADROOM = 256 << 20
MIN_GRACE_SECONDS = 60


def quantity(v):
    m = QUANTITY.fullmatch(str(v))
    return float(m.group(1)) * QTY_UNITS[m.group(2)] if m else None


def config_size(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", s)
    if not m or m.group(2).lower() not in SIZE_UNITS:
        return None
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


def parse_config(text):
    """mapflowd.conf: `key value` lines, '#' comments. Returns (dict, errors)."""
    conf, errs = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            errs.append(f"line {n}: expected 'key value', got {line!r}")
            continue
        conf[parts[0]] = parts[1].strip()
    return conf, errs


def addr_port(addr):
    m = re.fullmatch(r"(.*):([0-9]+)", addr or "")
    return (m.group(1), int(m.group(2))) if m else (None, None)


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def pod_spec_of(obj):
    if obj.get("kind") == "Pod":
        return obj.get("spec") or {}
    return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}


def containers_of(spec):
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


# ==== checks ========================================================================


class Checker:
    def __init__(self, mapflowd):
        self.mapflowd = mapflowd
        self.objs = []        # (file, index, obj)
        self.errs = []
        self.notes = []
        self.n_checks = 0

    def need(self, cond, where, msg):
        self.n_checks += 1
        if not cond:
            self.errs.append(f"{where}: {msg}")
        return cond

    def load(self, path):
        try:
            with open(path, encoding="utf-8") as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            self.errs.append(f"{path}: YAML does not parse: {e}")
            return
        self.notes.append(f"{path}: YAML ok ({len(docs)} document(s))")
        for i, d in enumerate(docs):
            self.objs.append((path, i, d))

    def name(self, f, o):
        md = o.get("metadata") or {} if isinstance(o, dict) else {}
        return f"{f}: {o.get('kind', '?') if isinstance(o, dict) else '?'}/{md.get('name', '?')}"

    def of_kind(self, kind):
        return [(f, o) for f, _, o in self.objs if isinstance(o, dict) and o.get("kind") == kind]

    def schema(self):
        for f, _, o in self.objs:
            if not isinstance(o, dict):
                self.errs.append(f"{f}: a document is not a mapping")
                continue
            key = (o.get("apiVersion"), o.get("kind"))
            spec = KINDS.get(key)
            self.n_checks += 1
            if spec is None:
                self.errs.append(f"{f}: apiVersion/kind {key} not in the schema "
                                 f"(known: {sorted(KINDS)})")
                continue
            errs = []
            spec.check(o, o.get("kind"), errs)
            self.errs += [f"{self.name(f, o)}: {e}" for e in errs]
            if not errs:
                self.notes.append(f"{self.name(f, o)}: schema ok")

    def pods(self):
        """Container / volume / probe references inside every pod template."""
        for f, o in self.of_kind("DaemonSet") + self.of_kind("Pod"):
            w, spec = self.name(f, o), pod_spec_of(o)
            for flag in ("hostIPC", "hostPID"):
                self.need(spec.get(flag) is not True, w,
                          f"{flag}: true is not needed (memfd and CUDA IPC handles go over the socket)")
            vols = {v.get("name"): v for v in spec.get("volumes") or []}
            self.need(len(vols) == len(spec.get("volumes") or []), w, "duplicate volume names")
            for c in containers_of(spec):
                cw = f"{w} container {c.get('name')}"
                ports = c.get("ports") or []
                names = {p.get("name") for p in ports if p.get("name")}
                numbers = {p.get("containerPort") for p in ports}
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    p = c.get(probe) or {}
                    port = (p.get("httpGet") or p.get("tcpSocket") or {}).get("port")
                    if port is not None:
                        self.need(port in names or port in numbers, cw,
                                  f"{probe} port {port!r} is not a container port "
                                  f"(have {sorted(map(str, names | numbers))})")
                for m in c.get("volumeMounts") or []:
                    self.need(m.get("name") in vols, cw,
                              f"volumeMount {m.get('name')!r} names no volume "
                              f"(have {sorted(map(str, vols))})")
                paths = [m.get("mountPath") for m in c.get("volumeMounts") or []]
                self.need(len(paths) == len(set(paths)), cw, "two mounts on one mountPath")
                for e in c.get("env") or []:
                    ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
                    if ref:
                        self.need(self.configmap_key(ref["name"], ref["key"]), cw,
                                  f"env {e.get('name')}: ConfigMap {ref['name']} has no key {ref['key']!r}")
            for v in vols.values():
                cm = v.get("configMap")
                if cm:
                    for it in cm.get("items") or []:
                        self.need(self.configmap_key(cm["name"], it.get("key")), w,
                                  f"volume {v['name']}: ConfigMap {cm['name']} has no key {it.get('key')!r}")

    def configmap_key(self, name, key):
        for _, cm in self.of_kind("ConfigMap"):
            if (cm.get("metadata") or {}).get("name") == name:
                return key in (cm.get("data") or {})
        return False

    def daemonset(self):
        """MapFlow's own rules for the node daemon (deploy/README.md)."""
        dss = self.of_kind("DaemonSet")
        if not self.need(len(dss) == 1, "manifests", f"expected one DaemonSet, found {len(dss)}"):
            return
        f, ds = dss[0]
        w, spec = self.name(f, ds), pod_spec_of(ds)
        tmpl_labels = ((ds.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
        self.need(matches(((ds.get("spec") or {}).get("selector") or {}).get("matchLabels"), tmpl_labels),
                  w, "spec.selector.matchLabels do not match the template labels")
        self.need(bool(spec.get("nodeSelector")), w, "nodeSelector missing (GPU nodes only)")
        self.need(any(t.get("key") == "nvidia.com/gpu" and t.get("effect") in ("NoSchedule", None)
                      and (t.get("operator") == "Exists" or "value" in t)
                      for t in spec.get("tolerations") or []),
                  w, "no toleration of the nvidia.com/gpu taint")
        prio = spec.get("priorityClassName")
        self.need(prio == "system-node-critical", w,
                  f"priorityClassName {prio!r}: the node's shared cache "
                  "must be evicted after the workers that use it (system-node-critical)")
        ns = (ds.get("metadata") or {}).get("namespace")
        if prio and prio.startswith("system-") and ns != "kube-system":
            self.need(any((q.get("metadata") or {}).get("namespace") == ns and
                          any(e.get("scopeName") == "PriorityClass" and e.get("operator") == "In"
                              and prio in (e.get("values") or [])
                              for e in ((q.get("spec") or {}).get("scopeSelector") or {})
                              .get("matchExpressions") or [])
                          and quantity((q.get("spec") or {}).get("hard", {}).get("pods", 0)) >= 1
                          for _, q in self.of_kind("ResourceQuota")),
                      w, f"priorityClassName {prio} in namespace {ns}: clusters that limit critical "
                      "classes admit it only with a ResourceQuota scoped to it there")
        grace = spec.get("terminationGracePeriodSeconds", 30)
        self.need(isinstance(grace, int) and grace >= MIN_GRACE_SECONDS, w,
                  f"terminationGracePeriodSeconds {grace} < {MIN_GRACE_SECONDS}: "
                  "SIGTERM must have time to flush the SSD tier")
        main = [c for c in spec.get("containers") or [] if c.get("name") == "mapflowd"]
        if not self.need(len(main) == 1, w, "no container named mapflowd"):
            return
        c = main[0]
        cw = f"{w} container mapflowd"
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            self.need(not any("nvidia.com/gpu" in k for k in (res.get(part) or {})), cw,
                      f"resources.{part} names nvidia.com/gpu: the daemon must not take GPUs from "
                      "workers (NVIDIA runtime + NVIDIA_VISIBLE_DEVICES=all)")
        env = {e.get("name"): e for e in c.get("env") or []}
        self.need((env.get("NVIDIA_VISIBLE_DEVICES") or {}).get("value") == "all", cw,
                  "env NVIDIA_VISIBLE_DEVICES=all missing")
        for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                            ("readinessProbe", "/readyz")):
            got = ((c.get(probe) or {}).get("httpGet") or {}).get("path")
            self.need(got == path, cw, f"{probe} must be httpGet {path}, got {got!r}")
        sc = c.get("securityContext") or {}
        self.need(sc.get("privileged") is not True or sc.get("runAsNonRoot") is not True, cw,
                  "privileged with runAsNonRoot is contradictory")
        self.config(f, ds, c, spec)

    def config(self, f, ds, c, spec):
        """The ConfigMap's mapflowd.conf against the DaemonSet that mounts it."""
        cw = f"{self.name(f, ds)} container mapflowd"
        vols = {v.get("name"): v for v in spec.get("volumes") or []}
        mounts = {m.get("mountPath"): vols.get(m.get("name")) or {} for m in c.get("volumeMounts") or []}
        args = c.get("args") or []
        conf_path = args[args.index("-c") + 1] if "-c" in args[:-1] else None
        if not self.need(conf_path is not None, cw, "args do not pass -c CONFIG_FILE"):
            return
        vol = mounts.get(os.path.dirname(conf_path)) or {}
        cm_name = (vol.get("configMap") or {}).get("name")
        text = None
        for _, cm in self.of_kind("ConfigMap"):
            if (cm.get("metadata") or {}).get("name") == cm_name:
                text = (cm.get("data") or {}).get(os.path.basename(conf_path))
        if not self.need(isinstance(text, str), cw,
                         f"-c {conf_path}: no ConfigMap volume provides that file"):
            return
        where = f"ConfigMap {cm_name} {os.path.basename(conf_path)}"
        conf, perrs = parse_config(text)
        self.errs += [f"{where}: {e}" for e in perrs]
        host_paths = {p: (v.get("hostPath") or {}).get("path") for p, v in mounts.items()}
        sock = conf.get("socket", "")
        self.need(host_paths.get(os.path.dirname(sock)) is not None, where,
                  f"socket {sock!r} is not in a hostPath mount (workers could not reach it)")
        data = conf.get("data_dir", "")
        self.need(host_paths.get(data) is not None, where,
                  f"data_dir {data!r} is not a hostPath mount (the SSD tier would die with the pod)")
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
        host, port = addr_port(conf.get("http"))
        self.need(port is not None and port == ports.get("http"), where,
                  f"http {conf.get('http')!r} does not listen on container port 'http' ({ports.get('http')})")
        self.need(host not in ("127.0.0.1", "localhost", "::1", "[::1]"), where,
                  f"http on {host}: the kubelet probes the pod IP, loopback is unreachable")
        for key, pname in (("tcp", "control"), ("ucx", "ucx")):
            if not conf.get(key):
                continue
            lhost, lport = addr_port(conf[key])
            self.need(lport == ports.get(pname), where,
                      f"{key} {conf[key]!r} is not container port '{pname}' ({ports.get(pname)})")
            self.need(lhost not in ("127.0.0.1", "localhost", "::1", "[::1]"), where,
                      f"{key} on {lhost}: peers on other nodes cannot reach loopback")
            self.need("token" not in conf, where,
                      "token in a ConfigMap: put it in the Secret (--token_file, see daemonset.yaml)")
        self.token(cw, c, spec, conf)
        host_bytes = config_size(conf.get("host_bytes", "1gb"))
        req = quantity(((c.get("resources") or {}).get("requests") or {}).get("memory", "0"))
        lim = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        if self.need(host_bytes is not None, where, f"host_bytes {conf.get('host_bytes')!r} unreadable"):
            self.need(req is not None and req >= host_bytes + MEMORY_HEADROOM, cw,
                      f"memory request {req} < host_bytes {host_bytes} + {MEMORY_HEADROOM} headroom: "
                      "the pinned host arena counts against the pod")
        if lim is not None:
            self.need(quantity(lim) >= (req or 0), cw, "memory limit below the request")
        self.check_config_text(where, text)

    def token(self, cw, c, spec, conf):
        """The token reaches mapflowd as a file (--token_file), never as an argument."""
        args = [str(a) for a in c.get("args") or []]
        self.need(not any(a == "--token" or a.startswith("--token=") for a in args), cw,
                  "token on the command line (readable in /proc/PID/cmdline): mount the Secret "
                  "as a file and pass --token_file")
        path = conf.get("token_file")
        for i, a in enumerate(args):
            if a == "--token_file" and i + 1 < len(args):
                path = args[i + 1]
            elif a.startswith("--token_file="):
                path = a.split("=", 1)[1]
        if not (conf.get("tcp") or conf.get("ucx")):
            return
        if not self.need(bool(path), cw, "tcp/ucx listener without a token: pass --token_file "
                         "(the Secret mapflowd-token as a file)"):
            return
        vols = {v.get("name"): v for v in spec.get("volumes") or []}
        mount = next((m for m in c.get("volumeMounts") or []
                      if m.get("mountPath") == os.path.dirname(path)), None)
        if not self.need(mount is not None, cw, f"token_file {path}: its directory is no volume mount"):
            return
        vol = vols.get(mount.get("name")) or {}
        if vol.get("secret"):
            # Secret files are root's; fsGroup adds group read, which mapflowd refuses.
            mode = vol["secret"].get("defaultMode", 0o644)
            user = (c.get("securityContext") or {}).get("runAsUser",
                                                          (spec.get("securityContext") or {}).get("runAsUser"))
            self.need(mode & 0o077 == 0 and "fsGroup" not in (spec.get("securityContext") or {}),
                      cw, f"token_file {path}: mapflowd refuses a token file group or others may "
                      f"read (defaultMode {mode:04o}, fsGroup adds group read)")
            self.need(user in (None, 0), cw,
                      f"token_file {path}: Secret files are root's, uid {user} cannot read a 0400 "
                      "one; copy it in an init container (see daemonset.yaml)")
        elif "emptyDir" in vol:
            self.need((vol.get("emptyDir") or {}).get("medium") == "Memory", cw,
                      f"token_file {path}: an emptyDir on the node's disk; use medium: Memory")
            self.need(any(m.get("name") == mount.get("name")
                          for ic in spec.get("initContainers") or []
                          for m in ic.get("volumeMounts") or []),
                      cw, f"token_file {path}: no init container writes its emptyDir")
        else:
            self.need(False, cw, f"token_file {path}: not on a Secret or memory emptyDir volume")

    def check_config_text(self, where, text):
        if not self.mapflowd:
            self.notes.append(f"{where}: mapflowd --check-config not run (no --mapflowd)")
            return
        helptext = subprocess.run([self.mapflowd, "--help"], capture_output=True, text=True,
                                  timeout=20)
        if "--check-config" not in helptext.stdout + helptext.stderr:
            self.notes.append(f"{where}: SKIPPED mapflowd --check-config "
                              f"({self.mapflowd} does not support it yet)")
            return
        with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as t:
            t.write(text)
        try:
            r = subprocess.run([self.mapflowd, "--check-config", t.name], capture_output=True,
                               text=True, timeout=20)
        finally:
            os.unlink(t.name)
        if self.need(r.returncode == 0, where,
                     f"mapflowd --check-config rejects it: {(r.stderr or r.stdout).strip()}"):
            self.notes.append(f"{where}: mapflowd --check-config ok")

    def services(self):
        ds_labels = [((o.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
                     for _, o in self.of_kind("DaemonSet")]
        ds_ports = set()
        for _, o in self.of_kind("DaemonSet"):
            for c in pod_spec_of(o).get("containers") or []:
                for p in c.get("ports") or []:
                    ds_ports |= {p.get("name"), p.get("containerPort")}
        svcs = self.of_kind("Service")
        self.need(any((o.get("spec") or {}).get("clusterIP") == "None" for _, o in svcs),
                  "manifests", "no headless Service (clusterIP: None) for peers")
        # Peers dial the ucx listener by the headless Service's DNS name and port.
        ucx_ports = {p.get("containerPort") for _, o in self.of_kind("DaemonSet")
                     for c in pod_spec_of(o).get("containers") or []
                     for p in c.get("ports") or [] if p.get("name") == "ucx"}
        if ucx_ports:
            self.need(any((o.get("spec") or {}).get("clusterIP") == "None" and
                          any(p.get("targetPort") in ("ucx", *ucx_ports)
                              for p in (o.get("spec") or {}).get("ports") or [])
                          for _, o in svcs),
                      "manifests", "the daemon's ucx port is no port of the headless Service: "
                      "peers could not find it")
        for f, o in svcs:
            w, spec = self.name(f, o), o.get("spec") or {}
            self.need(any(matches(spec.get("selector"), labels) for labels in ds_labels), w,
                      "selector matches no DaemonSet pod template")
            for p in spec.get("ports") or []:
                self.need(p.get("targetPort", p.get("port")) in ds_ports, w,
                          f"targetPort {p.get('targetPort')!r} is not a daemon container port")
        for f, o in self.of_kind("ServiceMonitor"):
            w, spec = self.name(f, o), o.get("spec") or {}
            sel = (spec.get("selector") or {}).get("matchLabels")
            hits = [s for _, s in svcs if matches(sel, (s.get("metadata") or {}).get("labels") or {})]
            if self.need(bool(hits), w, "selector matches no Service's labels"):
                names = {p.get("name") for s in hits for p in (s.get("spec") or {}).get("ports") or []}
                for e in spec.get("endpoints") or []:
                    self.need(e.get("port") in names, w, f"endpoint port {e.get('port')!r} "
                              f"is not a port name of the selected Service ({sorted(names)})")
            ns = (spec.get("namespaceSelector") or {}).get("matchNames")
            svc_ns = {(s.get("metadata") or {}).get("namespace") for s in hits}
            if ns is not None:
                self.need(svc_ns <= set(ns), w, f"namespaceSelector {ns} misses {sorted(svc_ns)}")

    def namespaces_and_workers(self, roots):
        defined = {(o.get("metadata") or {}).get("name") for _, o in self.of_kind("Namespace")}
        for f, _, o in self.objs:
            if not isinstance(o, dict) or o.get("kind") in ("Namespace", "Kustomization", "Component"):
                continue
            ns = (o.get("metadata") or {}).get("namespace")
            if "/examples/" not in f:
                self.need(ns in defined, self.name(f, o), f"namespace {ns!r} is not defined here "
                          f"(have {sorted(map(str, defined))})")
        sock_dirs = set()
        for _, ds in self.of_kind("DaemonSet"):
            for v in pod_spec_of(ds).get("volumes") or []:
                if v.get("name") == "run" and v.get("hostPath"):
                    sock_dirs.add(v["hostPath"]["path"])
        for f, o in self.of_kind("Pod"):
            w = self.name(f, o)
            hp = [v["hostPath"]["path"] for v in pod_spec_of(o).get("volumes") or [] if v.get("hostPath")]
            self.need(any(p in sock_dirs for p in hp), w,
                      f"mounts no hostPath of the daemon's socket directory {sorted(sock_dirs)}")
        for f, o in self.of_kind("Kustomization") + self.of_kind("Component"):
            base = os.path.dirname(f)
            listed = set(o.get("resources") or [])
            present = {n for n in os.listdir(base) if n.endswith(".yaml") and n != os.path.basename(f)}
            self.need(listed == present, self.name(f, o),
                      f"resources {sorted(listed)} != files {sorted(present)}")
            for comp in o.get("components") or []:
                kf = os.path.join(base, comp, "kustomization.yaml")
                self.need(any(cf == kf for cf, _ in self.of_kind("Component")), self.name(f, o),
                          f"components: {comp!r} names no Component directory (no {kf})")
            images = {}
            for _, w in self.of_kind("DaemonSet") + self.of_kind("Pod"):
                for c in containers_of(pod_spec_of(w)):
                    name, _, tag = str(c.get("image", "")).rpartition(":")
                    images.setdefault(name, set()).add(tag)
            for im in o.get("images") or []:
                tags = images.get(im.get("name"))
                self.need(bool(tags) and tags == {str(im.get("newTag"))}, self.name(f, o),
                          f"images: {im.get('name')} newTag {im.get('newTag')!r} is not the "
                          f"containers' tag ({sorted(tags or [])})")

    def run(self, roots):
        files = []
        for r in roots:
            if os.path.isdir(r):
                for d, _, names in sorted(os.walk(r)):
                    files += [os.path.join(d, n) for n in sorted(names) if n.endswith((".yaml", ".yml"))]
            else:
                files.append(r)
        if not files:
            self.errs.append(f"no YAML files under {roots}")
        for f in files:
            self.load(f)
        self.schema()
        if self.errs:  # references assume the schema holds
            return
        self.pods()
        self.daemonset()
        self.services()
        self.namespaces_and_workers(roots)


def main(argv):
    args, mapflowd = argv[1:], None
    if args[:1] == ["--mapflowd"] and len(args) >= 2:
        mapflowd, args = args[1], args[2:]
    if not args or any(a.startswith("-") for a in args):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    ck = Checker(mapflowd)
    ck.run(args)
    for n in ck.notes:
        print(n)
    for e in ck.errs:
        print(f"FAIL {e}", file=sys.stderr)
    print(f"k8s_check: {len(ck.objs)} objects, {ck.n_checks} reference/policy checks, "
          f"{len(ck.errs)} error(s)")
    return 1 if ck.errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
