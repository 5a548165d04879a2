#!/usr/bin/env bash
# Checks the Helm chart charts/cocoon-hibernation (P5): what needs a cluster or another tool.
# What the rendered objects say is tested by the helm-unittest suites in the chart's tests/.
#   1. crd-drift    `cocoon-hibernation crd` == the chart's crds/cocoonhibernations.yaml
#   2. unittest     `helm unittest charts/cocoon-hibernation` (tests/*_test.yaml)
#   3. alerts       the PrometheusRule renders files/prometheus-rules.yaml unchanged;
#                   `promtool test rules` proves every alert; every dashboard query parses
#   4. lint         helm lint --strict, both TLS modes; every ClusterRole rule has a comment;
#                   the chart's default values are refused, naming vmIdentityPolicy (S3)
#   4b. value-limits every sample of the binary's flag bounds (`cocoon-hibernation
#                   value-limits --samples`): helm template refuses each value the binary
#                   refuses (0s timeouts, a 1s stall limit, past a maximum) and renders
#                   each one it accepts (the bounds, 1h30m)
#   5. kubeconform  helm template (every values file) | kubeconform -strict, offline schemas
#   6. dry-run      the CRD applied for real (dry run only if one is installed), the rest
#                   `kubectl apply --server-side --dry-run=server`; the self-signed
#                   certificate is trusted, reused on upgrade and renewed near expiry
#   7. upgrade      hack/check-upgrade.sh (S11): the release of a pinned 0.3.0 commit upgraded
#                   for real, by the documented command and by --reuse-values, keeps S3's
#                   policy and every safety setting; the documented CRD upgrade works on
#                   CRDs Helm installed
#   8. image-rootfs `hack/image.sh --help`; the root filesystem `make image` stages for the
#                   Dockerfile holds the binary, its libraries and loader (the binary
#                   prints the CRD with only those), the CA bundle, user 65532 and /tmp,
#                   and the kubectl plugin at /usr/local/bin/kubectl-cocoon (it prints its
#                   help with only those libraries)
# Prints one summary line: `check-chart: PASS ...` or `check-chart: FAIL ...`.
#
# Needs KUBECONFIG for a reachable kube-apiserver (e.g. from hack/cluster-up.sh), python3
# with PyYAML, and Go on a cold tool cache (hack/install-tools.sh). Optional environment:
#   COCOON_BIN   the cocoon-hibernation binary (default: `cargo run -q --locked -- crd`)
#   KUBECTL      kubectl to use (default: the control-plane cache's, then PATH)
#   CHECK_NAMESPACE  release namespace for the dry run (default cocoon-chart-check)
#   COCOON_CACHE     cache root (default ~/.cache/cocoon-hibernation)
# kubeconform cannot download schemas here: hack/chart-schemas.py converts the apiserver's
# /openapi/v2 (cached per server version) and the CRD's schema. cert-manager and
# Prometheus Operator kinds have none and are skipped.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/cocoon-hibernation"
VALUES="$CHART/tests/values"
CRD_FILE="$CHART/crds/cocoonhibernations.yaml"
CACHE_ROOT="${COCOON_CACHE:-$HOME/.cache/cocoon-hibernation}"
NS="${CHECK_NAMESPACE:-cocoon-chart-check}"
RELEASE=cocoon-hibernation
REGISTRY_BASE="registry.example.com:5000/cocoon/snapshots"
FIELD_MANAGER=cocoon-check-chart

log() { echo "[check-chart] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

START=$SECONDS
CURRENT="setup"
PASSED=()
WORK="$(mktemp -d "${TMPDIR:-/tmp}/check-chart.XXXXXX")"
CLEANUP=()
on_exit() {
  local rc=$? c
  for c in "${CLEANUP[@]}"; do eval "$c" >/dev/null 2>&1 || true; done
  if ((rc == 0)); then
    echo "check-chart: PASS (${PASSED[*]}) in $((SECONDS - START))s"
    rm -rf "$WORK"
  else
    echo "check-chart: FAIL in step '$CURRENT' (passed: ${PASSED[*]:-none}) after $((SECONDS - START))s; renders kept in $WORK"
  fi
  exit "$rc"
}
trap on_exit EXIT

# step NAME FUNCTION: runs one step, timed.
step() {
  CURRENT="$1"
  local t=$SECONDS
  log "---- $1"
  "$2"
  log "---- $1: ok ($((SECONDS - t))s)"
  PASSED+=("$1")
}

[[ -n "${KUBECONFIG:-}" ]] || die "KUBECONFIG is not set. Start a cluster first, e.g.
    bash hack/cluster-up.sh && set -a && . \"\${COCOON_STATE_DIR:-\$HOME/.cache/cocoon-hibernation/cluster}/env\" && set +a
  then run this again (the dry run needs a real kube-apiserver)."
command -v python3 >/dev/null || die "python3 is required"
python3 -c 'import yaml' 2>/dev/null ||
  die "python3 cannot import yaml (PyYAML). Install it: apt-get install python3-yaml, or pip install pyyaml"

if [[ -z "${KUBECTL:-}" ]]; then
  KUBECTL="$(printf '%s\n' "$CACHE_ROOT"/bin/k8s-*/kubectl | sort -V | tail -n 1)"
  [[ -x "$KUBECTL" ]] || KUBECTL="$(command -v kubectl || true)" # the glob matched nothing
fi
[[ -n "$KUBECTL" && -x "$KUBECTL" ]] || die "kubectl not found: set KUBECTL or run hack/build-control-plane.sh"
kubectl() { "$KUBECTL" "$@"; }

TOOLS_BIN="$(bash "$ROOT/hack/install-tools.sh" | tail -n 1)" || die "hack/install-tools.sh failed"
export PATH="$TOOLS_BIN:$PATH" HELM_PLUGINS="$TOOLS_BIN/helm-plugins"
log "helm $(helm version --short), kubeconform $(kubeconform -v), $(promtool --version | head -n 1), kubectl $KUBECTL"

SERVER_VERSION="$(kubectl version -o json 2>/dev/null | sed -n 's/.*"gitVersion": *"\(v[^"]*\)".*/\1/p' | tail -n 1)"
[[ -n "$SERVER_VERSION" ]] || die "cannot reach the kube-apiserver of KUBECONFIG=$KUBECONFIG"
KUBE_VERSION="${SERVER_VERSION#v}"
KUBE_VERSION="${KUBE_VERSION%%-*}" # 1.34.4
log "kube-apiserver $SERVER_VERSION"

# The writers of the pods' VM annotations, which an install must name (S3 is on by default).
WRITERS=(-f "$VALUES/writers.yaml")

# helm_render MODE OUT [helm args...]: renders the chart as a release in $NS, as a user
# installs it: registry.base and the writers named.
helm_render() {
  local mode="$1" out="$2"
  shift 2
  helm template "$RELEASE" "$CHART" --namespace "$NS" --kube-version "$KUBE_VERSION" \
    --set registry.base="$REGISTRY_BASE" "${WRITERS[@]}" --set tls.mode="$mode" "$@" >"$out"
}
# field KEY FILE: the value of the first `KEY: value` line (unique keys only).
field() { sed -n "s|^ *$1: *||p" "$2" | head -n 1; }

# Every optional branch: the registry mounts (full), everything else (kitchen-sink), S3.
FULL=(-f "$VALUES/full.yaml")
OPTIONAL=(--set serviceMonitor.enabled=true --set prometheusRule.enabled=true --set grafanaDashboard.enabled=true)

# cocoon ARGS...: the binary under test (COCOON_BIN, else cargo run).
cocoon() {
  if [[ -n "${COCOON_BIN:-}" ]]; then
    [[ -x "$COCOON_BIN" ]] || die "COCOON_BIN=$COCOON_BIN is not executable"
    "$COCOON_BIN" "$@"
  else
    (cd "$ROOT" && cargo run -q --locked -- "$@")
  fi
}

crd_drift() {
  local crd="$WORK/crd.yaml"
  cocoon crd >"$crd"
  [[ -s "$crd" ]] || die "'cocoon-hibernation crd' printed nothing"
  diff -u "$crd" "$CRD_FILE" ||
    die "the chart's CRD differs from 'cocoon-hibernation crd'; regenerate it:
    cocoon-hibernation crd > charts/cocoon-hibernation/crds/cocoonhibernations.yaml"
}

unittest() {
  helm unittest --color=false "$CHART" | tee "$WORK/unittest.out" >&2
  grep -Eq '^Tests: +[0-9]+ passed, [0-9]+ total' "$WORK/unittest.out" ||
    die "helm unittest ran no test, or some failed"
}

alerts() {
  # The rule file the chart ships is the one promtool tests: the rendered spec, unindented.
  helm_render self-signed "$WORK/rule.yaml" -s templates/prometheusrule.yaml --set prometheusRule.enabled=true
  sed -n '/^spec:$/,$p' "$WORK/rule.yaml" | tail -n +2 | sed 's/^  //' >"$WORK/rules.yaml"
  diff -u "$CHART/files/prometheus-rules.yaml" "$WORK/rules.yaml" ||
    die "the rendered PrometheusRule differs from files/prometheus-rules.yaml"
  promtool check rules "$WORK/rules.yaml" >&2
  promtool test rules "$CHART/tests/promtool/alerts_test.yaml" >&2
  # The dashboard's queries, as recording rules, so promtool parses each one.
  python3 - "$CHART/files/grafana-dashboard.json" >"$WORK/dashboard-rules.yaml" <<'EOF'
import json, sys
exprs = [t["expr"] for p in json.load(open(sys.argv[1]))["panels"] for t in p["targets"]]
assert exprs, "the dashboard has no queries"
print("groups:\n  - name: dashboard\n    rules:")
for i, e in enumerate(exprs):
    e = e.replace("$__rate_interval", "5m").replace("$namespace", ".*")
    print(f"      - record: dashboard_query_{i}\n        expr: {json.dumps(e)}")
EOF
  promtool check rules "$WORK/dashboard-rules.yaml" >&2
}

lint() {
  helm lint --strict "$CHART" --kube-version "$KUBE_VERSION" --namespace "$NS" \
    --set registry.base="$REGISTRY_BASE" "${WRITERS[@]}"
  helm lint --strict "$CHART" --kube-version "$KUBE_VERSION" --namespace "$NS" \
    --set tls.mode=cert-manager "${OPTIONAL[@]}" "${FULL[@]}" "${WRITERS[@]}"
  helm lint --strict "$CHART" --kube-version "$KUBE_VERSION" --namespace "$NS" \
    --set registry.base="$REGISTRY_BASE" -f "$VALUES/vm-identity.yaml"
  helm lint --strict "$CHART" --kube-version "$KUBE_VERSION" --namespace "$NS" \
    --set registry.base="$REGISTRY_BASE" --set vmIdentityPolicy.enabled=false
  # S3: the chart's default values (only the required registry.base) are refused, and the
  # message names vmIdentityPolicy and the values to set. (helm lint cannot show this: in
  # lint mode Helm logs a template's `fail` as INFO and passes.)
  if helm template "$RELEASE" "$CHART" --namespace "$NS" --kube-version "$KUBE_VERSION" \
    --set registry.base="$REGISTRY_BASE" >"$WORK/defaults.yaml" 2>"$WORK/defaults.err"; then
    die "helm template with the chart's default values succeeded; S3 needs the writers named"
  fi
  grep -q 'vmIdentityPolicy (S3) is on by default and names no writer: set vmIdentityPolicy.allowedUsernames' \
    "$WORK/defaults.err" || die "default values failed without naming vmIdentityPolicy: $(cat "$WORK/defaults.err")"
  log "default values refused, naming vmIdentityPolicy (S3)"
  # P5: a comment above every ClusterRole rule says what it is for (comments do not survive
  # rendering, so this reads the template).
  awk '/^kind: ClusterRole$/ { cr = 1 } /^---/ { cr = 0 }
       cr && /^ *- apiGroups:/ && prev !~ /^ *#/ { print "uncommented rule at line " NR; bad = 1 }
       { prev = $0 } END { exit bad }' "$CHART/templates/rbac.yaml" ||
    die "every ClusterRole rule in templates/rbac.yaml needs a comment saying what it is for"
}

# P3: the chart refuses exactly the samples the binary refuses (its unit tests prove the
# binary's side on the same samples: config::tests::p3_the_binary_enforces_every_limit_on_the_charts_samples).
value_limits() {
  cocoon value-limits --samples >"$WORK/samples.tsv"
  local value kind verdict sample set n=0 bad=0
  while IFS=$'\t' read -r value kind verdict sample; do
    [[ "$kind" == string ]] && set=--set-string || set=--set
    if helm template "$RELEASE" "$CHART" --namespace "$NS" --kube-version "$KUBE_VERSION" \
      --set registry.base="$REGISTRY_BASE" "${WRITERS[@]}" "$set" "$value=$sample" \
      >/dev/null 2>"$WORK/sample.err"; then
      [[ "$verdict" == accepted ]] || { log "$value=$sample rendered; the binary refuses it"; bad=$((bad + 1)); }
    else
      [[ "$verdict" == refused ]] || { log "$value=$sample refused: $(tail -n 1 "$WORK/sample.err")"; bad=$((bad + 1)); }
      # Refused for the value itself, not for something else.
      [[ "$verdict" != refused ]] || grep -q "${value##*.}" "$WORK/sample.err" ||
        { log "$value=$sample refused without naming it: $(cat "$WORK/sample.err")"; bad=$((bad + 1)); }
    fi
    n=$((n + 1))
  done <"$WORK/samples.tsv"
  ((n >= 30)) || die "only $n samples from 'cocoon-hibernation value-limits --samples'"
  ((bad == 0)) || die "$bad of $n value samples disagree with the binary (above)"
  log "$n value samples: the chart refuses exactly what the binary refuses"
}

schemas() {
  # Built-in kinds, from the apiserver's OpenAPI; cached per server version and converter.
  local key
  key="$(sha256sum "$ROOT/hack/chart-schemas.py" | cut -c1-12)"
  BUILTIN_SCHEMAS="$CACHE_ROOT/kubeconform-schemas/$SERVER_VERSION-$key"
  if [[ ! -f "$BUILTIN_SCHEMAS/.complete" ]]; then
    log "generating built-in schemas from $SERVER_VERSION's /openapi/v2"
    rm -rf "$CACHE_ROOT/kubeconform-schemas/$SERVER_VERSION"-* # older converter versions
    mkdir -p "$BUILTIN_SCHEMAS"
    kubectl get --raw /openapi/v2 >"$WORK/swagger.json"
    log "$(python3 "$ROOT/hack/chart-schemas.py" swagger "$WORK/swagger.json" "$BUILTIN_SCHEMAS") schemas in $BUILTIN_SCHEMAS"
    touch "$BUILTIN_SCHEMAS/.complete"
  else
    log "built-in schemas: $BUILTIN_SCHEMAS (cached)"
  fi
  CRD_SCHEMAS="$WORK/crd-schemas"
  python3 "$ROOT/hack/chart-schemas.py" crd "$CRD_FILE" "$CRD_SCHEMAS" >&2
  [[ -f "$CRD_SCHEMAS/cocoonhibernation-cocoonset-v1.json" ]] || die "no CocoonHibernation schema generated"
}

kubeconform_run() {
  kubeconform -strict -summary -exit-on-error=false -kubernetes-version "$KUBE_VERSION" \
    -schema-location "$BUILTIN_SCHEMAS/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -schema-location "$CRD_SCHEMAS/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -skip Certificate,Issuer,ServiceMonitor,PrometheusRule "$@"
}

validate() {
  schemas
  helm_render self-signed "$WORK/self-signed.yaml" --include-crds "${FULL[@]}" "${OPTIONAL[@]}"
  helm_render cert-manager "$WORK/cert-manager.yaml" --include-crds "${FULL[@]}" "${OPTIONAL[@]}"
  # One replica without election (strategy Recreate) and without the S3 policy, on purpose.
  helm_render self-signed "$WORK/single.yaml" --set replicas=1 --set leaderElection.enabled=false \
    --set log.format=json --set registry.plainHTTP=true --set vmIdentityPolicy.enabled=false
  grep -q '^    type: Recreate$' "$WORK/single.yaml" || die "no strategy Recreate without leader election"
  if grep -q '^kind: ValidatingAdmissionPolicy' "$WORK/single.yaml"; then
    die "vmIdentityPolicy.enabled=false still rendered the policy"
  fi
  helm_render self-signed "$WORK/kitchen-sink.yaml" -f "$VALUES/kitchen-sink.yaml"
  helm_render self-signed "$WORK/vm-identity.yaml" -f "$VALUES/vm-identity.yaml"
  # A CocoonHibernation as a user writes it, so the CRD schema is exercised too.
  cat >"$WORK/example-cr.yaml" <<EOF
apiVersion: cocoonset.cocoonstack.io/v1
kind: CocoonHibernation
metadata:
  name: vm-pod-0
  namespace: default
spec:
  podRef:
    name: vm-pod-0
  desire: Hibernate
EOF
  local f
  for f in self-signed cert-manager single kitchen-sink vm-identity example-cr; do
    log "kubeconform $f"
    kubeconform_run "$WORK/$f.yaml"
  done
  # The schemas must bite: unknown fields and bad enums are errors.
  sed 's/desire: Hibernate/desire: Sleep/' "$WORK/example-cr.yaml" >"$WORK/bad-cr.yaml"
  sed 's/^  replicas: 2$/  replicas: 2\n  replicaz: 2/' "$WORK/self-signed.yaml" >"$WORK/bad-deploy.yaml"
  grep -q replicaz "$WORK/bad-deploy.yaml" || die "could not build the negative Deployment sample"
  for f in bad-cr bad-deploy; do
    if kubeconform_run "$WORK/$f.yaml" >"$WORK/$f.out" 2>&1; then
      cat "$WORK/$f.out" >&2
      die "kubeconform accepted $f.yaml; the schemas are not being applied"
    fi
  done
  log "negative samples rejected, as they should be"
}

# apply_dry FILE: a server-side dry run against the real apiserver.
apply_dry() { kubectl apply --server-side --dry-run=server --field-manager="$FIELD_MANAGER" -f "$1"; }

# S11, on the real apiserver: its own namespace, release and CRD group, removed after.
upgrade() { KUBECTL="$KUBECTL" bash "$ROOT/hack/check-upgrade.sh" >&2; }

# The image recipe without buildah or a release build: stage the rootfs around the debug
# binary (same libraries) and run it with the staged loader and libraries only.
image_rootfs() {
  bash "$ROOT/hack/image.sh" --help | grep -q '^usage: hack/image.sh' || die "hack/image.sh --help printed no usage"
  local bin="${COCOON_BIN:-}" r="$WORK/image/rootfs" loader libdirs f
  if [[ -z "$bin" ]]; then
    (cd "$ROOT" && cargo build -q --locked -p cocoon-hibernation -p kubectl-cocoon)
    bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/cocoon-hibernation"
  fi
  IMAGE_BIN="$bin" bash "$ROOT/hack/image.sh" stage "$WORK/image"
  for f in cocoon-hibernation usr/local/bin/kubectl-cocoon etc/ssl/certs/ca-certificates.crt etc/passwd etc/group; do
    [[ -s "$r/$f" ]] || die "the staged rootfs has no /$f"
  done
  [[ -d "$r/tmp" ]] || die "the staged rootfs has no /tmp"
  grep -qx 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' "$r/etc/passwd" ||
    die "no user 65532 in the staged /etc/passwd"
  grep -qx 'nonroot:x:65532:' "$r/etc/group" || die "no group 65532 in the staged /etc/group"
  loader="$(compgen -G "$r/lib64/ld-linux-*.so.*" | head -n 1)" || die "no dynamic loader in $r/lib64"
  libdirs="$(find "$r" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)"
  # Every library resolves inside the rootfs, then the binary runs on them.
  "$loader" --inhibit-cache --library-path "$libdirs" --list "$r/cocoon-hibernation" >"$WORK/image/ldd.txt"
  "$loader" --inhibit-cache --library-path "$libdirs" --list "$r/usr/local/bin/kubectl-cocoon" >>"$WORK/image/ldd.txt"
  if awk '$2 == "=>" && index($3, "/") == 1' "$WORK/image/ldd.txt" | grep -v " => $r/"; then
    die "a library resolved outside the staged rootfs (above)"
  fi
  "$loader" --inhibit-cache --library-path "$libdirs" "$r/cocoon-hibernation" crd >"$WORK/image/crd.yaml"
  diff -q "$WORK/image/crd.yaml" "$CRD_FILE" >/dev/null ||
    die "the staged binary's 'crd' differs from the chart's CRD"
  # The plugin users copy out of the image (docs/install.md) runs on the same libraries.
  "$loader" --inhibit-cache --library-path "$libdirs" "$r/usr/local/bin/kubectl-cocoon" --help \
    >"$WORK/image/plugin-help.txt" || die "the staged kubectl-cocoon --help failed"
  grep -q '^Usage: kubectl cocoon ' "$WORK/image/plugin-help.txt" ||
    die "the staged kubectl-cocoon printed no usage: $(head -c 500 "$WORK/image/plugin-help.txt")"
  log "staged rootfs: $(du -sh "$r" | cut -f1), $(wc -l <"$WORK/image/ldd.txt") objects loaded from it"
}

dry_run() {
  # CRD for real (later objects reference its kind), namespace for real, the rest dry-run.
  # A CRD someone else already installed (tests may install a variant) is left as it is:
  # ours is then only dry-run against it.
  local crd_name=cocoonhibernations.cocoonset.cocoonstack.io
  if kubectl get crd "$crd_name" >/dev/null 2>&1; then
    log "CRD $crd_name already installed; server-side dry run of ours only"
    kubectl apply --server-side --force-conflicts --dry-run=server --field-manager="$FIELD_MANAGER" \
      -f "$CHART/crds/"
  else
    kubectl apply --server-side --field-manager="$FIELD_MANAGER" -f "$CHART/crds/"
  fi
  kubectl wait --for=condition=Established --timeout=60s "crd/$crd_name"
  kubectl get namespace "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS"
  # Kinds this cluster has no CRD for (cert-manager, Prometheus Operator) are left out.
  local f t core=()
  for t in serviceaccount rbac deployment service pdb webhook grafana-dashboard vmidentitypolicy; do
    core+=(-s "templates/$t.yaml")
  done
  for f in self-signed cert-manager; do
    helm_render "$f" "$WORK/$f.dry.yaml" "${FULL[@]}" "${OPTIONAL[@]}" "${core[@]}"
    log "server-side dry run: $f"
    apply_dry "$WORK/$f.dry.yaml"
  done
  # Also refuses duplicate env names (extraEnv replacing a built-in).
  log "server-side dry run: kitchen-sink values"
  apply_dry "$WORK/kitchen-sink.yaml"
  # The apiserver type-checks the VM identity policy's CEL (S3).
  log "server-side dry run: VM identity policy"
  helm_render self-signed "$WORK/vap.yaml" -f "$VALUES/vm-identity.yaml" -s templates/vmidentitypolicy.yaml
  apply_dry "$WORK/vap.yaml"
  # A CR is accepted by the real CRD (schema + CEL compile) too.
  apply_dry "$WORK/example-cr.yaml"

  # self-signed: the webhook trusts the CA of the Secret it renders; an upgrade reuses that
  # certificate (lookup) and renews it when it is about to expire. helm --dry-run=server
  # lets lookup see the cluster.
  local secret="$RELEASE-tls" a b
  CLEANUP+=("'$KUBECTL' -n '$NS' delete secret '$secret' --ignore-not-found")
  kubectl -n "$NS" delete secret "$secret" --ignore-not-found >/dev/null
  helm_render self-signed "$WORK/install.yaml" --dry-run=server -s templates/webhook.yaml
  a="$(field caBundle "$WORK/install.yaml")" b="$(field ca.crt "$WORK/install.yaml")"
  [[ -n "$a" && "$a" == "$b" ]] || die "caBundle is not the CA of the rendered TLS Secret"
  awk '/^---$/ { n++ } n == 1' "$WORK/install.yaml" >"$WORK/secret.yaml" # the first document
  grep -q '^kind: Secret$' "$WORK/secret.yaml" || die "templates/webhook.yaml no longer starts with the Secret"
  kubectl apply --server-side --field-manager="$FIELD_MANAGER" -f "$WORK/secret.yaml" >/dev/null
  # As Helm would have left it (Helm 4's --dry-run=server checks release ownership).
  kubectl -n "$NS" annotate secret "$secret" --overwrite >/dev/null \
    "meta.helm.sh/release-name=$RELEASE" "meta.helm.sh/release-namespace=$NS"
  helm_render self-signed "$WORK/install-dep.yaml" --dry-run=server -s templates/deployment.yaml
  helm_render self-signed "$WORK/upgrade.yaml" --dry-run=server -s templates/webhook.yaml -s templates/deployment.yaml
  [[ "$(field caBundle "$WORK/install.yaml")" == "$(field caBundle "$WORK/upgrade.yaml")" ]] ||
    die "upgrade regenerated the self-signed CA although the Secret is valid"
  [[ "$(field checksum/tls "$WORK/install-dep.yaml")" == "$(field checksum/tls "$WORK/upgrade.yaml")" ]] ||
    die "upgrade changed checksum/tls although the certificate was reused"
  log "upgrade reuses the self-signed certificate and keeps checksum/tls"
  kubectl -n "$NS" annotate secret "$secret" --overwrite \
    "cocoon-hibernation.cocoonstack.io/tls-expires=$(($(date +%s) + 86400))" >/dev/null
  helm_render self-signed "$WORK/renew.yaml" --dry-run=server -s templates/webhook.yaml
  [[ "$(field caBundle "$WORK/install.yaml")" != "$(field caBundle "$WORK/renew.yaml")" ]] ||
    die "a certificate expiring within renewBeforeDays was not renewed"
  log "upgrade renews a certificate that is about to expire"
}

step crd-drift crd_drift
step unittest unittest
step alerts alerts
step lint lint
step value-limits value_limits
step kubeconform validate
step dry-run dry_run
step upgrade upgrade
step image-rootfs image_rootfs
