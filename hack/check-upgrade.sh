#!/usr/bin/env bash
# S11: an upgrade keeps the safety. On a real kube-apiserver, installs the chart of a
# pinned earlier commit (release 0.3.0, whose values.yaml has no vmIdentityPolicy.enabled:
# it rendered S3's policy whenever writers were listed), then upgrades that release to
# this chart, once by each command, and checks after each upgrade that S3's
# ValidatingAdmissionPolicy and its binding still exist and that every safety setting of
# the Deployment and the webhook is what the old release had:
#   documented   docs/install.md: `kubectl apply --server-side --force-conflicts` of crds/, then
#                `helm upgrade --reset-then-reuse-values`
#   reuse        `helm upgrade --reuse-values` (the old chart's values.yaml, so keys that
#                chart lacked arrive absent)
# and that the documented CRD upgrade works on CRDs Helm installed (a copy of the CRD
# renamed to a group of its own, installed by the old chart: the shared CRD is never
# touched).
#
# The pods need not run (no image is pulled; nothing waits for them). The release's
# policy and webhook bind only in namespaces with a label no namespace carries, so other
# tests on a shared control plane never meet them. Called by hack/check-chart.sh (step
# `upgrade`); runs alone too. Prints `check-upgrade: PASS ...` or `check-upgrade: FAIL ...`.
# Needs KUBECONFIG, helm on PATH (hack/install-tools.sh), python3, git. Optional:
#   KUBECTL      kubectl to use (default: PATH)
#   OLD_COMMIT   the earlier chart's commit (default 1a123bd, where the chart became 0.3.0)
# It stays on 0.3.0 although 0.4.0 is the previous release: 0.3.0 is the chart whose
# values lack the safety keys (and whose releases without writers had no S3 policy),
# which is what this check is about, and it runs in seconds on the shared control plane.
# The upgrade from 0.4.0 (hack/old-release.sh) is tested with its image, on the real
# node, under load: the install suite (tests/e2e_install/upgrade.rs).
#   NEW_CHART    the chart to upgrade to (default charts/cocoon-hibernation)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OLD_COMMIT="${OLD_COMMIT:-1a123bd9ab16321b8a92a0a673ed2a926d168bf5}"
NEW_CHART="${NEW_CHART:-$ROOT/charts/cocoon-hibernation}"
KUBECTL="${KUBECTL:-$(command -v kubectl || true)}"
SUFFIX="$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
NS="cocoon-upgrade-$SUFFIX"
RELEASE="cocoon-hibernation-up$SUFFIX" # also the fullname: cluster-scoped names are unique
GROUP="upgrade-$SUFFIX.cocoonstack.io" # the renamed CRD's group
SCOPE="cocoon-upgrade-check-$SUFFIX"   # a namespace label nobody sets

log() { echo "[check-upgrade] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ -n "${KUBECONFIG:-}" ]] || die "KUBECONFIG is not set (bash hack/cluster-up.sh, then source its env file)"
[[ -n "$KUBECTL" && -x "$KUBECTL" ]] || die "kubectl not found: set KUBECTL"
command -v helm >/dev/null || die "helm not found: export PATH=\"\$(bash hack/install-tools.sh | tail -n 1):\$PATH\""
kubectl() { "$KUBECTL" "$@"; }

START=$SECONDS
CURRENT=setup
PASSED=()
WORK="$(mktemp -d "${TMPDIR:-/tmp}/check-upgrade.XXXXXX")"
cleanup() {
  local rc=$?
  helm uninstall "$RELEASE" -n "$NS" --wait=false >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete crd "cocoonhibernations.$GROUP" "cocoonhibernationschedules.$GROUP" "cocoonidlepolicies.$GROUP" \
    --ignore-not-found >/dev/null 2>&1 || true
  if ((rc == 0)); then
    echo "check-upgrade: PASS (${PASSED[*]}) in $((SECONDS - START))s"
    rm -rf "$WORK"
  else
    echo "check-upgrade: FAIL in '$CURRENT' (passed: ${PASSED[*]:-none}) after $((SECONDS - START))s; files kept in $WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT

# The old chart, as that commit had it.
mkdir -p "$WORK/old"
git -C "$ROOT" archive "$OLD_COMMIT" charts/cocoon-hibernation | tar -x -C "$WORK/old"
OLD_CHART="$WORK/old/charts/cocoon-hibernation"
log "old chart: $OLD_COMMIT, version $(sed -n 's/^version: //p' "$OLD_CHART/Chart.yaml"); new: $(sed -n 's/^version: //p' "$NEW_CHART/Chart.yaml")"
# Both CRDs renamed to a group of our own: Helm installs the old one (it exists nowhere).
rename_crds() { mkdir -p "$2" && sed "s/cocoonset\.cocoonstack\.io/$GROUP/g" "$1"/crds/*.yaml >"$2/crd.yaml"; }
rename_crds "$OLD_CHART" "$OLD_CHART/crds.renamed"
rm "$OLD_CHART"/crds/*.yaml && mv "$OLD_CHART/crds.renamed/crd.yaml" "$OLD_CHART/crds/" && rmdir "$OLD_CHART/crds.renamed"
rename_crds "$NEW_CHART" "$WORK/new-crds"

# The values a user installed 0.3.0 with: the registry, S3's writers; plus this check's
# scoping (policy and webhook bind only in namespaces labelled $SCOPE).
cat >"$WORK/values.yaml" <<EOF
registry: {base: registry.example.com:5000/cocoon/snapshots}
vmIdentityPolicy:
  allowedUsernames: [system:serviceaccount:vk:vk-cocoon]
  allowedGroups: [system:serviceaccounts:cocoonset-system]
  namespaceSelector: {matchLabels: {$SCOPE: "true"}}
webhook:
  namespaceSelector: {matchLabels: {$SCOPE: "true"}}
EOF

# safety FILE: the safety settings of the release as the apiserver holds them, as JSON:
# S3's policy and binding, the webhook's failure policy and rules, the Deployment's
# replicas, strategy and safety flags (a flag the old Deployment did not set is the
# binary's default, which the chart's fallbacks equal).
safety() {
  local out="$1" f="$RELEASE" vap="$RELEASE-vm-identity"
  kubectl get validatingadmissionpolicy "$vap" -o json >"$WORK/vap.json" ||
    die "S3: ValidatingAdmissionPolicy $vap is gone"
  kubectl get validatingadmissionpolicybinding "$vap" -o json >"$WORK/vapb.json" ||
    die "S3: ValidatingAdmissionPolicyBinding $vap is gone"
  kubectl get validatingwebhookconfiguration "$f" -o json >"$WORK/webhook.json"
  kubectl -n "$NS" get deployment "$f" -o json >"$WORK/deploy.json"
  python3 - "$WORK" >"$out" <<'EOF'
import json, sys
w = sys.argv[1]
load = lambda n: json.load(open(f"{w}/{n}.json"))
vap, vapb, hook, dep = load("vap"), load("vapb"), load("webhook"), load("deploy")
env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
defaults = {"COCOON_INFORMER_STALL_LIMIT": "5m"}  # the binary's, for a Deployment without it
flags = ["COCOON_LEADER_ELECTION", "COCOON_LEASE_NAME", "COCOON_LEASE_DURATION",
         "COCOON_INFORMER_STALL_LIMIT", "COCOON_HIBERNATE_TIMEOUT", "COCOON_WAKE_TIMEOUT",
         "COCOON_REGISTRY_BASE", "COCOON_REGISTRY_PLAIN_HTTP"]
print(json.dumps({
    "policy": {"failurePolicy": vap["spec"]["failurePolicy"],
               "matchConstraints": vap["spec"]["matchConstraints"],
               "allowed": [v["expression"] for v in vap["spec"]["variables"] if v["name"] == "allowed"],
               "validations": len(vap["spec"]["validations"])},
    "binding": {"policyName": vapb["spec"]["policyName"],
                "validationActions": vapb["spec"]["validationActions"],
                "matchResources": vapb["spec"].get("matchResources")},
    "webhook": {h["name"]: {"failurePolicy": h["failurePolicy"], "rules": h["rules"]} for h in hook["webhooks"]},
    "deployment": {"replicas": dep["spec"]["replicas"], "strategy": dep["spec"]["strategy"]["type"],
                   "env": {k: env.get(k, defaults.get(k)) for k in flags}},
}, indent=1, sort_keys=True))
EOF
}

# same_safety WHAT: the release's safety settings equal those the old release installed;
# a webhook the new chart adds (e.g. for schedules) fails closed like the others.
same_safety() {
  local after="$WORK/after-${1// /-}.json"
  safety "$after"
  python3 - "$WORK/before.json" "$after" <<'EOF' || die "S11: $1 changed a safety setting (above)"
import json, sys
old, new = (json.load(open(f)) for f in sys.argv[1:3])
bad = [k for k in ("policy", "binding", "deployment") if old[k] != new[k]]
bad += [f"webhook {n}" for n, h in old["webhook"].items() if new["webhook"].get(n) != h]
bad += [f"webhook {n} (new)" for n, h in new["webhook"].items()
        if n not in old["webhook"] and h["failurePolicy"] != "Fail"]
for k in bad:
    section = k.split()[0]
    print(f"{k}:\n  before {json.dumps(old[section])}\n  after  {json.dumps(new[section])}", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
  log "$1: S3's policy and binding in force, every safety setting unchanged"
}

install_old() {
  CURRENT="install $1"
  helm uninstall "$RELEASE" -n "$NS" --wait >/dev/null 2>&1 || true
  kubectl delete crd "cocoonhibernations.$GROUP" --ignore-not-found >/dev/null
  helm install "$RELEASE" "$OLD_CHART" -n "$NS" --create-namespace -f "$WORK/values.yaml" >/dev/null
  kubectl get crd "cocoonhibernations.$GROUP" -o json >"$WORK/crd-old.json" ||
    die "helm install did not install the old chart's CRD"
  safety "$WORK/before.json"
  log "old release installed: S3's policy and binding exist"
}

# The documented CRD upgrade (docs/install.md), on CRDs Helm installed. Helm created them
# (field manager `helm`, an Update), so a plain server-side apply conflicts with `helm` on
# .spec.versions; Helm never writes a CRD again, so taking those fields over is safe.
crd_upgrade() {
  CURRENT="crd upgrade"
  if ! kubectl apply --server-side --force-conflicts -f "$WORK/new-crds/" >"$WORK/crd-apply.out" 2>&1; then
    cat "$WORK/crd-apply.out" >&2
    die "the documented CRD upgrade failed on the CRD Helm installed (above)"
  fi
  kubectl get crd "cocoonhibernations.$GROUP" -o json >"$WORK/crd-new.json"
  # The new schema is the one served: compare the versions' schemas with the file's.
  python3 - "$WORK/crd-new.json" "$WORK/new-crds/crd.yaml" <<'EOF' || die "the CRD in the apiserver is not the new one"
import json, sys, yaml
live = json.load(open(sys.argv[1]))["spec"]["versions"]
name = json.load(open(sys.argv[1]))["metadata"]["name"]
want = next(d for d in yaml.safe_load_all(open(sys.argv[2])) if d and d["metadata"]["name"] == name)
want = want["spec"]["versions"]
strip = lambda vs: [(v["name"], v["schema"]) for v in vs]
assert strip(live) == strip(want), "served schema differs from crds/"
EOF
  log "kubectl apply --server-side --force-conflicts upgraded the CRD Helm installed"
  PASSED+=("crd-upgrade")
}

# 1. The documented commands.
install_old documented
crd_upgrade
CURRENT="documented upgrade"
helm upgrade "$RELEASE" "$NEW_CHART" -n "$NS" --reset-then-reuse-values >/dev/null
same_safety "documented upgrade (--reset-then-reuse-values)"
PASSED+=("documented")

# 2. --reuse-values, from a fresh old release.
install_old reuse
CURRENT="reuse-values upgrade"
helm upgrade "$RELEASE" "$NEW_CHART" -n "$NS" --reuse-values >/dev/null
same_safety "helm upgrade --reuse-values"
PASSED+=("reuse-values")

# 3. A release of 0.3.0 installed without writers had no policy (that chart rendered it
# only with writers). Upgrading it by either command turns S3 on, so it is refused with
# the message naming vmIdentityPolicy, never carried on silently without the policy; the
# release stays as it was.
CURRENT="no writers refused"
helm uninstall "$RELEASE" -n "$NS" --wait >/dev/null
grep -v -e allowedUsernames -e allowedGroups "$WORK/values.yaml" >"$WORK/no-writers.yaml"
helm install "$RELEASE" "$OLD_CHART" -n "$NS" --skip-crds -f "$WORK/no-writers.yaml" >/dev/null
for how in --reset-then-reuse-values --reuse-values; do
  if helm upgrade "$RELEASE" "$NEW_CHART" -n "$NS" "$how" >/dev/null 2>"$WORK/refused.err"; then
    die "helm upgrade $how of a release without writers succeeded without S3's policy"
  fi
  grep -q 'vmIdentityPolicy (S3) is on by default and names no writer' "$WORK/refused.err" ||
    die "helm upgrade $how refused without naming vmIdentityPolicy: $(cat "$WORK/refused.err")"
done
[[ "$(helm history "$RELEASE" -n "$NS" -o json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" == 1 ]] ||
  die "a refused upgrade left a revision behind"
log "a release without writers: both upgrades refused, naming vmIdentityPolicy"
PASSED+=("no-writers-refused")
CURRENT="done"
