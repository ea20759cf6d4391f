#!/usr/bin/env bash
# Run k8s-materialize.yaml in order: the ConfigMap (with xpackfs-step.sh inserted), then the
# digest Job, the Indexed parts Job and the finalize Job, each after the previous completed.
#   tools/cluster/k8s-run.sh [-n NAMESPACE] [--timeout 24h]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ns=(); timeout=24h
while [ $# -gt 0 ]; do
    case "$1" in
    -n) ns=(-n "$2"); shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    *) echo "usage: k8s-run.sh [-n NAMESPACE] [--timeout 24h]" >&2; exit 2 ;;
    esac
done
# Split the multi-document manifest; put the step script into the ConfigMap.
docs=$(mktemp -d)
trap 'rm -rf "$docs"' EXIT
python3 - "$here/k8s-materialize.yaml" "$here/xpackfs-step.sh" "$docs" <<'PY'
import sys, yaml
manifest, step, out = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(manifest)) if d]
config = next(d for d in docs if d["kind"] == "ConfigMap")
parts = next(d for d in docs if d["metadata"]["name"] == "xpackfs-parts")
n = int(config["data"]["XPACKFS_PARTS"])
if parts["spec"]["completions"] != n:
    sys.exit(f"k8s-materialize.yaml: xpackfs-parts has completions {parts['spec']['completions']}, XPACKFS_PARTS is {n}")
for d in docs:
    if d["kind"] == "ConfigMap":
        d["data"]["xpackfs-step.sh"] = open(step).read()
    name = d["kind"].lower() + "-" + d["metadata"]["name"]
    yaml.safe_dump(d, open(f"{out}/{name}.yaml", "w"), sort_keys=False)
PY
kubectl "${ns[@]}" apply -f "$docs/configmap-xpackfs-materialize.yaml"
for job in xpackfs-digest xpackfs-parts xpackfs-finalize; do
    kubectl "${ns[@]}" apply -f "$docs/job-$job.yaml"
    kubectl "${ns[@]}" wait --for=condition=complete --timeout="$timeout" "job/$job"
done
echo "done: see kubectl logs job/xpackfs-finalize"
