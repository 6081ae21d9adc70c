#!/usr/bin/env bash
# Kubernetes manifests (deploy/k8s): YAML + hand-written schema + references + policy
# through deploy/tools/k8s_check.py, then broken copies that the checker must reject,
# each with the reason it must give (deploy/tools/k8s_negative.py runs them in one process).
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
MAPFLOWD=${MF_BIN:-$PWD/build/bin}/mapflowd
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check_args=(deploy/tools/k8s_check.py)
[ -x "$MAPFLOWD" ] && check_args+=(--mapflowd "$MAPFLOWD")

echo "--- the manifests as shipped"
if ! $PY "${check_args[@]}" deploy/k8s; then
  echo "FAIL: deploy/k8s does not pass k8s_check"; fail=1
fi

echo "--- the ServiceMonitor switched off (its components: entry deleted, as deploy/README.md says)"
rm -rf "$tmp/off"; cp -r deploy/k8s "$tmp/off"
sed -i '/^components:$/,/^  - monitoring$/d' "$tmp/off/kustomization.yaml"
rm -r "$tmp/off/monitoring"
if grep -q monitoring "$tmp/off/kustomization.yaml" || ! $PY "${check_args[@]}" "$tmp/off" > "$tmp/off.log" 2>&1; then
  echo "FAIL: deploy/k8s without the ServiceMonitor does not pass k8s_check"; tail -3 "$tmp/off.log"; fail=1
elif grep -q ServiceMonitor "$tmp/off.log"; then
  echo "FAIL: a ServiceMonitor is left with the switch off"; fail=1
else echo "switched off: $(tail -1 "$tmp/off.log")"; fi

# kustomize itself where kubectl is installed (not a Debian 12 package: optional here).
if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
  on=$(kubectl kustomize deploy/k8s 2>&1 | grep -c '^kind: ServiceMonitor$')
  off=$(kubectl kustomize "$tmp/off" 2>&1 | grep -c '^kind: \(ServiceMonitor\|DaemonSet\)$')
  tag=$(kubectl kustomize deploy/k8s 2>&1 | sed -n 's|^ *image: .*/mapflowd:||p' | sort -u)
  if [ "$on" = 1 ] && [ "$off" = 1 ] && [ "$tag" = "$(sed -n 's/^ *newTag: //p' deploy/k8s/kustomization.yaml)" ]; then
    echo "kubectl kustomize: ServiceMonitor on / off as switched, image tag $tag"
  else echo "FAIL: kubectl kustomize: ServiceMonitor on=$on, off copy has $off of DaemonSet+ServiceMonitor, tags '$tag'"; fail=1; fi
else echo "note: no kubectl; kustomize output not built"; fi

echo "--- broken copies: FILE | PATH | OP | VALUE | the error k8s_check must give"
C=spec.template.spec.containers[0]
$PY deploy/tools/k8s_negative.py deploy/k8s <<CASES || fail=1
daemonset.yaml | $C.livenessProbe | ren | livenesProbe | unknown field
daemonset.yaml | $C.image | del | | image: required field missing
daemonset.yaml | $C.ports[0].containerPort | set | "9477" | expected int
daemonset.yaml | $C.ports[0].containerPort | set | 70000 | 70000 > 65535
daemonset.yaml | $C.imagePullPolicy | set | "Sometimes" | not one of
daemonset.yaml | $C.livenessProbe.httpGet.port | set | "metrics" | livenessProbe port 'metrics' is not a container port
daemonset.yaml | $C.readinessProbe.httpGet.path | set | "/healthz" | readinessProbe must be httpGet /readyz
daemonset.yaml | $C.volumeMounts[1].name | set | "socket" | volumeMount 'socket' names no volume
daemonset.yaml | $C.resources.requests.memory | set | "4Gi" | the pinned host arena counts against the pod
daemonset.yaml | $C.resources.limits | set | {"memory": "9Gi", "nvidia.com/gpu": 1} | must not take GPUs
daemonset.yaml | $C.env[0].value | set | "0" | NVIDIA_VISIBLE_DEVICES=all
daemonset.yaml | $C.args | set | ["-c", "/etc/mapflowd/mapflowd.conf", "--token", "s3cret"] | token on the command line
daemonset.yaml | $C.args | set | ["-c", "/etc/mapflowd/mapflowd.conf", "--token_file", "/run/secrets/mapflowd/token", "--token=x"] | token on the command line
daemonset.yaml | $C.args | set | ["-c", "/etc/mapflowd/mapflowd.conf"] | tcp/ucx listener without a token
daemonset.yaml | $C.args | set | ["-c", "/etc/mapflowd/mapflowd.conf", "--token_file", "/secrets/token"] | its directory is no volume mount
daemonset.yaml | spec.template.spec.volumes[4].emptyDir.medium | set | "" | on the node's disk
daemonset.yaml | spec.template.spec.initContainers[0].volumeMounts[3] | del | | no init container writes its emptyDir
daemonset.yaml | spec.template.spec.volumes[4] | set | {"name": "token", "secret": {"secretName": "mapflowd-token", "defaultMode": 292}} | refuses a token file group or others may read
daemonset.yaml | spec.template.spec.volumes[4] | set | {"name": "token", "secret": {"secretName": "mapflowd-token", "defaultMode": 256}} | Secret files are root's, uid 10001 cannot read
daemonset.yaml | spec.template.spec.hostIPC | set | true | hostIPC: true is not needed
daemonset.yaml | spec.template.spec.hostPID | set | true | hostPID: true is not needed
daemonset.yaml | spec.template.spec.tolerations | del | | no toleration of the nvidia.com/gpu taint
daemonset.yaml | spec.template.spec.nodeSelector | del | | nodeSelector missing
daemonset.yaml | spec.template.spec.terminationGracePeriodSeconds | set | 10 | flush the SSD tier
daemonset.yaml | spec.template.spec.volumes[1].hostPath.type | set | "Dir" | not one of
daemonset.yaml | spec.template.spec.volumes[0] | set | {"name": "config", "emptyDir": {}, "hostPath": {"path": "/x"}} | exactly one of
daemonset.yaml | spec.selector.matchLabels | set | {"app": "other"} | do not match the template labels
configmap.yaml | data | set | {"other.conf": "x 1"} | has no key 'mapflowd.conf'
configmap.yaml | data | set | {"mapflowd.conf": "socket /tmp/mapflowd.sock\ndata_dir /var/lib/mapflowd\nhttp 0.0.0.0:9477\n"} | is not in a hostPath mount
configmap.yaml | data | set | {"mapflowd.conf": "socket /run/mapflowd/mapflowd.sock\ndata_dir /var/lib/mapflowd\nhttp 127.0.0.1:9477\n"} | loopback is unreachable
configmap.yaml | data | set | {"mapflowd.conf": "socket /run/mapflowd/mapflowd.sock\ndata_dir /var/lib/mapflowd\nhttp 0.0.0.0:9477\nhost_bytes 64gb\n"} | the pinned host arena counts against the pod
configmap.yaml | data | set | {"mapflowd.conf": "socket /run/mapflowd/mapflowd.sock\ndata_dir /var/lib/mapflowd\nhttp 0.0.0.0:9477\ntcp 0.0.0.0:9478\ntoken hunter2\n"} | put it in the Secret
service.yaml | spec.ports[0].targetPort | set | "web" | targetPort 'web' is not a daemon container port
service.yaml | spec.clusterIP | del | | no headless Service
monitoring/servicemonitor.yaml | spec.endpoints[0].port | set | "metrics" | endpoint port 'metrics'
monitoring/servicemonitor.yaml | spec.selector.matchLabels | set | {"app": "nothing"} | selector matches no Service
namespace.yaml | metadata.name | set | "Map_Flow" | does not match
namespace.yaml | apiVersion | set | "v2" | not in the schema
kustomization.yaml | resources | set | ["namespace.yaml"] | resources
kustomization.yaml | components | set | ["metrics"] | names no Component directory
kustomization.yaml | images[0].newTag | set | "0.0.9" | is not the containers' tag
monitoring/kustomization.yaml | resources | set | ["other.yaml"] | resources
daemonset.yaml | spec.template.spec.priorityClassName | del | | priorityClassName None
daemonset.yaml | spec.template.spec.priorityClassName | set | "high" | system-node-critical
resourcequota.yaml | spec.scopeSelector.matchExpressions[0].values | set | ["system-cluster-critical"] | admit it only with a ResourceQuota scoped to it
resourcequota.yaml | spec.hard.pods | set | "0" | admit it only with a ResourceQuota scoped to it
resourcequota.yaml | spec.scopeSelector.matchExpressions[0].operator | set | "Maybe" | not one of
daemonset.yaml | $C.ports[2].containerPort | set | 9480 | is not container port 'ucx'
service.yaml | spec.ports[2] | del | | ucx port is no port of the headless Service
configmap.yaml | data | set | {"mapflowd.conf": "socket /run/mapflowd/mapflowd.sock\ndata_dir /var/lib/mapflowd\nhttp 0.0.0.0:9477\nucx 127.0.0.1:9479\n"} | peers on other nodes cannot reach loopback
examples/worker-pod.yaml | spec.volumes[0].hostPath.path | set | "/run/other" | mounts no hostPath of the daemon's socket directory
examples/worker-pod.yaml | spec.hostIPC | set | true | hostIPC: true is not needed
CASES

n=0; rejected=0
# A value only mapflowd itself knows is wrong: needs `mapflowd --check-config`.
if [ -x "$MAPFLOWD" ] && "$MAPFLOWD" --help 2>&1 | grep -q -- --check-config; then
  n=$((n + 1)); rm -rf "$tmp/k8s"; cp -r deploy/k8s "$tmp/k8s"
  sed -i 's/^\( *\)log_level info$/\1log_level loud/' "$tmp/k8s/configmap.yaml"
  out=$($PY deploy/tools/k8s_check.py --mapflowd "$MAPFLOWD" "$tmp/k8s" 2>&1)
  if [ $? -ne 0 ] && grep -q 'mapflowd --check-config rejects it' <<<"$out"; then
    rejected=$((rejected + 1)); echo "rejected as expected: log_level loud -> $(grep -F 'check-config rejects' <<<"$out")"
  else echo "FAIL: log_level loud in the ConfigMap passed"; echo "$out" | tail -3; fail=1; fi
else
  echo "note: $MAPFLOWD has no --check-config; the ConfigMap text was checked by k8s_check's own parser only"
fi

# Not YAML at all.
n=$((n + 1)); rm -rf "$tmp/k8s"; cp -r deploy/k8s "$tmp/k8s"
printf 'kind: [unclosed\n' >> "$tmp/k8s/service.yaml"
if out=$($PY deploy/tools/k8s_check.py "$tmp/k8s" 2>&1) || ! grep -q 'YAML does not parse' <<<"$out"; then
  echo "FAIL: a YAML syntax error was not reported"; fail=1
else rejected=$((rejected + 1)); echo "rejected as expected: YAML syntax error in service.yaml"; fi

echo "k8s negative cases (separate processes): $rejected of $n rejected with the expected reason"
[ $fail -eq 0 ] && [ $rejected -eq $n ]
