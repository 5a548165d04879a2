#!/usr/bin/env bash
# Checks the Helm chart charts/cocoon-hibernation (P5). Fails loudly on any error.
#   1. crd-drift     `cocoon-hibernation crd` == charts/cocoon-hibernation/crds/cocoonhibernations.yaml
#   2. lint          helm lint --strict, both TLS modes
#   3. kubeconform   helm template (both TLS modes) | kubeconform -strict, offline schemas
#   4. dry-run       CRD applied for real (dry-run only if the cluster already has one),
#                    the rest `kubectl apply --server-side --dry-run=server`; self-signed
#                    certificate reuse and renewal through `lookup` (helm --dry-run=server)
#   5. assertions    the rendered objects say what the spec and the brief require: RBAC
#                    verbs (P5), webhook matchConditions (V7), the VM identity policy
#                    off by default and complete with identities (S3)
# Prints one summary line: `check-chart: PASS ...` or `check-chart: FAIL ...`.
#
# Needs: KUBECONFIG pointing at a reachable kube-apiserver (e.g. from hack/cluster-up.sh),
# python3 with PyYAML, Go on a cold tool cache (hack/install-tools.sh builds helm and
# kubeconform). Optional environment:
#   COCOON_BIN   the cocoon-hibernation binary (default: `cargo run -q --locked -- crd`)
#   KUBECTL      kubectl to use (default: the control-plane cache's, then PATH)
#   CHECK_NAMESPACE  release namespace for the dry run (default cocoon-chart-check)
#   COCOON_CACHE     cache root (default ~/.cache/cocoon-hibernation)
#
# Where kubeconform's schemas come from (it cannot download anything here):
#   - built-in kinds: the apiserver's own OpenAPI (`kubectl get --raw /openapi/v2`),
#     converted by the embedded python into strict, stand-alone JSON schemas in the
#     layout kubeconform expects (<kind>-<group prefix>-<version>.json), cached per
#     server version under $COCOON_CACHE/kubeconform-schemas/;
#   - CocoonHibernation: the CRD's openAPIV3Schema, converted the same way into
#     <tmp>/crd-schemas/cocoonhibernation-cocoonset-v1.json on every run;
#   - cert-manager and Prometheus Operator kinds have no schema here and are skipped.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/cocoon-hibernation"
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
  local rc=$?
  local c
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

# ---------------------------------------------------------------------------------------
# Prerequisites
[[ -n "${KUBECONFIG:-}" ]] || die "KUBECONFIG is not set. Start a cluster first, e.g.
    bash hack/cluster-up.sh && set -a && . \"\${COCOON_STATE_DIR:-\$HOME/.cache/cocoon-hibernation/cluster}/env\" && set +a
  then run this again (step 4 dry-runs the chart against a real kube-apiserver)."
command -v python3 >/dev/null || die "python3 is required"
python3 -c 'import yaml' 2>/dev/null ||
  die "python3 cannot import yaml (PyYAML). Install it: apt-get install python3-yaml, or pip install pyyaml"

if [[ -z "${KUBECTL:-}" ]]; then
  KUBECTL="$(printf '%s\n' "$CACHE_ROOT"/bin/k8s-*/kubectl | sort -V | tail -n 1)"
  [[ -x "$KUBECTL" ]] || KUBECTL="" # the glob matched nothing
  [[ -n "$KUBECTL" ]] || KUBECTL="$(command -v kubectl || true)"
fi
[[ -n "$KUBECTL" && -x "$KUBECTL" ]] || die "kubectl not found: set KUBECTL or run hack/build-control-plane.sh"
kubectl() { "$KUBECTL" "$@"; }

TOOLS_BIN="$(bash "$ROOT/hack/install-tools.sh" | tail -n 1)" || die "hack/install-tools.sh failed"
export PATH="$TOOLS_BIN:$PATH"
log "helm $(helm version --short), kubeconform $(kubeconform -v), kubectl $KUBECTL"

SERVER_VERSION="$(kubectl version -o json 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')" ||
  die "cannot reach the kube-apiserver of KUBECONFIG=$KUBECONFIG"
KUBE_VERSION="${SERVER_VERSION#v}"
KUBE_VERSION="${KUBE_VERSION%%-*}" # 1.34.4
log "kube-apiserver $SERVER_VERSION"

# ---------------------------------------------------------------------------------------
# The python half: schema conversion, YAML splitting and the assertions.
PY="$WORK/chart_tool.py"
cat >"$PY" <<'PYEOF'
"""Helpers for hack/check-chart.sh (stdlib + PyYAML)."""
import base64
import copy
import json
import os
import sys

import yaml

def kind_suffix(group, version):
    # Mirrors kubeconform's {{ .KindSuffix }}: first label of the group, then the version.
    return f"-{group.split('.')[0].lower()}-{version.lower()}" if group else f"-{version.lower()}"


def schema_file(kind, group, version):
    return f"{kind.lower()}{kind_suffix(group, version)}.json"


def allow_null(s):
    """A copy of schema s that also accepts null (optional fields may be written as null)."""
    t = s.get("type")
    if isinstance(t, str):
        s = dict(s, type=[t, "null"])
        if "enum" in s and None not in s["enum"]:
            s["enum"] = s["enum"] + [None]
        return s
    return s  # $ref'd objects stay non-null: clearer kubeconform errors


def strictify(s, crd):
    """JSON-schema-ify one OpenAPI schema node, recursively, for kubeconform -strict:
    closed objects, int-or-string, nullable, optional fields nullable."""
    if not isinstance(s, dict):
        return s
    s = dict(s)
    if s.get("format") == "int-or-string" or s.get("x-kubernetes-int-or-string"):
        out = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        if "description" in s:
            out["description"] = s["description"]
        return out
    if crd and s.pop("nullable", False):
        s = allow_null(s)
    props = s.get("properties")
    if isinstance(props, dict):
        required = set(s.get("required", []))
        new = {}
        for name, sub in props.items():
            sub = strictify(sub, crd)
            if not crd and name not in required:
                sub = allow_null(sub)
            new[name] = sub
        s["properties"] = new
        if "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = strictify(s["additionalProperties"], crd)
    if isinstance(s.get("items"), dict):
        s["items"] = strictify(s["items"], crd)
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            s[key] = [strictify(x, crd) for x in s[key]]
    return s


def refs(node, acc):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith("#/definitions/"):
            acc.add(r[len("#/definitions/"):])
        for v in node.values():
            refs(v, acc)
    elif isinstance(node, list):
        for v in node:
            refs(v, acc)


def cmd_swagger(swagger_path, outdir):
    """Built-in kinds from the apiserver's /openapi/v2: one stand-alone strict schema
    per group/version/kind, holding the definitions it references transitively."""
    defs = json.load(open(swagger_path))["definitions"]
    defs = {k: v for k, v in defs.items() if k.startswith("io.k8s.")}  # no CRD types
    q = "io.k8s.apimachinery.pkg.api.resource.Quantity"
    if q in defs:  # "1", 1 and 0.5 are all valid quantities
        defs[q] = {"oneOf": [{"type": "string"}, {"type": "number"}], "description": "Quantity"}
    fixed = {k: strictify(v, crd=False) for k, v in defs.items()}
    os.makedirs(outdir, exist_ok=True)
    count = 0
    for name, d in defs.items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            closure, todo = set(), {name}
            while todo:
                n = todo.pop()
                if n in closure or n not in fixed:
                    continue
                closure.add(n)
                acc = set()
                refs(fixed[n], acc)
                todo |= acc - closure
            doc = copy.deepcopy(fixed[name])
            doc["definitions"] = {n: fixed[n] for n in sorted(closure)}
            path = os.path.join(outdir, schema_file(gvk["kind"], gvk["group"], gvk["version"]))
            with open(path, "w") as f:
                json.dump(doc, f)
            count += 1
    if count < 50:
        sys.exit(f"only {count} schemas from {swagger_path}; is it the apiserver's /openapi/v2?")
    print(count)


def cmd_crd(crd_path, outdir):
    """Each served version of a CRD file: its openAPIV3Schema, strict, plus the fields
    every object has (apiVersion, kind, metadata), which CRD schemas leave implicit."""
    os.makedirs(outdir, exist_ok=True)
    for crd in yaml.safe_load_all(open(crd_path)):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            s = strictify(copy.deepcopy(v["schema"]["openAPIV3Schema"]), crd=True)
            props = s.setdefault("properties", {})
            props.setdefault("apiVersion", {"type": "string", "enum": [f"{group}/{v['name']}"]})
            props.setdefault("kind", {"type": "string", "enum": [kind]})
            props.setdefault("metadata", {"type": "object"})
            s.setdefault("additionalProperties", False)
            s["required"] = sorted(set(s.get("required", [])) | {"apiVersion", "kind", "metadata"})
            path = os.path.join(outdir, schema_file(kind, group, v["name"]))
            with open(path, "w") as f:
                json.dump(s, f, indent=1)
            print(path)


def load(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]


def cmd_filter(path, drop_groups):
    """Prints the documents of path whose apiVersion group is not in drop_groups."""
    drop = set(drop_groups.split(","))
    keep, skipped = [], []
    for d in load(path):
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        (skipped if group in drop else keep).append(d)
    for d in skipped:
        print(f"skipping {d['kind']}/{d['metadata']['name']} ({d['apiVersion']}): no CRD in this cluster",
              file=sys.stderr)
    sys.stdout.write(yaml.safe_dump_all(keep, sort_keys=False))


def cmd_only(path, kind):
    """Prints the documents of one kind."""
    sys.stdout.write(yaml.safe_dump_all([d for d in load(path) if d["kind"] == kind], sort_keys=False))


def get(path, key):
    """Prints one field of the first document of kind K: key = Kind.dotted.path."""
    kind, _, dotted = key.partition(".")
    for d in load(path):
        if d["kind"] == kind:
            for part in dotted.split("."):
                d = d[int(part)] if isinstance(d, list) else d[part]
            print(d if isinstance(d, str) else json.dumps(d))
            return
    sys.exit(f"no {kind} in {path}")


class Checker:
    def __init__(self, label):
        self.label, self.failures, self.count = label, [], 0

    def check(self, ok, what):
        self.count += 1
        if not ok:
            self.failures.append(what)

    def done(self):
        for f in self.failures:
            print(f"  FAIL [{self.label}] {f}", file=sys.stderr)
        print(f"  {self.label}: {self.count - len(self.failures)}/{self.count} assertions hold",
              file=sys.stderr)
        return not self.failures


def one(docs, kind, c):
    found = [d for d in docs if d["kind"] == kind]
    c.check(len(found) == 1, f"exactly one {kind} (found {len(found)})")
    return found[0] if found else {}


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def cmd_assert(path, mode, namespace):
    docs = load(path)
    text = open(path).read()
    c = Checker(f"{mode} render")
    kinds = [d["kind"] for d in docs]
    for k in ("CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
              "Role", "RoleBinding", "Deployment", "Service", "ValidatingWebhookConfiguration",
              "PodDisruptionBudget"):
        c.check(k in kinds, f"renders a {k}")
    c.check("runAsNonRoot: true" in text, "text contains 'runAsNonRoot: true'")
    c.check("ServiceMonitor" not in kinds, "no ServiceMonitor unless serviceMonitor.enabled")
    c.check("ValidatingAdmissionPolicy" not in kinds and "ValidatingAdmissionPolicyBinding" not in kinds,
            "S3: no VM identity policy unless vmIdentityPolicy lists identities")
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration",
                             "CustomResourceDefinition", "ValidatingAdmissionPolicy",
                             "ValidatingAdmissionPolicyBinding"):
            c.check(d["metadata"].get("namespace") == namespace,
                    f"{d['kind']}/{d['metadata']['name']} is in the release namespace")

    # RBAC: least privilege, exactly the calls the binary makes.
    rules = {}
    for r in one(docs, "ClusterRole", c).get("rules", []):
        for g in r["apiGroups"]:
            for res in r["resources"]:
                rules[(g, res)] = sorted(r["verbs"])
                c.check("*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"],
                        f"no wildcards in ClusterRole rule {r}")
    want = {
        ("cocoonset.cocoonstack.io", "cocoonhibernations"): ["get", "list", "patch", "watch"],
        ("cocoonset.cocoonstack.io", "cocoonhibernations/status"): ["patch"],
        ("", "pods"): ["list", "patch", "watch"],
        ("events.k8s.io", "events"): ["create", "patch"],
    }
    c.check(rules == want, f"ClusterRole rules are exactly {want}, got {rules}")
    role_text = [t for t in text.split("\n---\n") if "\nkind: ClusterRole\n" in t]
    lines = role_text[0].splitlines() if role_text else []
    rule_lines = [i for i, l in enumerate(lines) if l.lstrip().startswith("- apiGroups:")]
    c.check(rule_lines and all(lines[i - 1].lstrip().startswith("#") for i in rule_lines),
            "every ClusterRole rule has a comment saying what it is for")
    lease = {}
    for r in one(docs, "Role", c).get("rules", []):
        c.check(r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"],
                f"Role only touches leases: {r}")
        lease.update({v: r.get("resourceNames") for v in r["verbs"]})
    c.check(sorted(lease) == ["create", "get", "patch"],
            f"lease verbs are create/get/patch: {sorted(lease)}")
    c.check(lease.get("create") is None and lease.get("get") == lease.get("patch")
            and len(lease.get("get") or []) == 1, f"get/patch name one Lease, create cannot: {lease}")
    sa = one(docs, "ServiceAccount", c)["metadata"]["name"]
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        b = one(docs, kind, c)
        c.check(b.get("subjects") == [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
                f"{kind} binds the ServiceAccount")

    # Deployment.
    dep = one(docs, "Deployment", c)
    spec = dep["spec"]["template"]["spec"]
    pod_sc = spec.get("securityContext", {})
    c.check(dep["spec"].get("replicas") == 2, "2 replicas by default")
    c.check(pod_sc.get("runAsNonRoot") is True, "pod runAsNonRoot")
    c.check(pod_sc.get("runAsUser") == 65532, "pod runAsUser 65532")
    c.check("fsGroup" in pod_sc, "pod fsGroup")
    c.check(pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccomp RuntimeDefault")
    c.check(spec.get("terminationGracePeriodSeconds") == 30, "terminationGracePeriodSeconds 30")
    c.check(spec.get("serviceAccountName") == sa, "runs as the chart's ServiceAccount")
    tsc = spec.get("topologySpreadConstraints", [{}])[0]
    c.check(tsc.get("topologyKey") == "kubernetes.io/hostname" and tsc.get("whenUnsatisfiable") == "ScheduleAnyway",
            "topology spread over hostnames, ScheduleAnyway")
    ann = dep["spec"]["template"]["metadata"].get("annotations", {})
    c.check(len(ann.get("checksum/tls", "")) == 64, "checksum/tls pod annotation")
    (ctr,) = spec["containers"]
    sc = ctr.get("securityContext", {})
    c.check(sc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem")
    c.check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation false")
    c.check(sc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities drop ALL")
    c.check(ctr.get("args") == ["run"], "args [run]")
    c.check("resources" in ctr and ctr["resources"].get("requests"), "resources set")
    ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    c.check(ports == {"webhook": 8443, "admin": 8080}, f"ports webhook 8443, admin 8080: {ports}")
    c.check(ctr.get("livenessProbe", {}).get("httpGet") == {"path": "/healthz", "port": "admin"}, "liveness /healthz")
    c.check(ctr.get("readinessProbe", {}).get("httpGet") == {"path": "/readyz", "port": "admin"}, "readiness /readyz")
    env = env_of(ctr)
    for name, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        c.check(env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == field,
                f"{name} from fieldRef {field}")
    expect_env = {
        "COCOON_REGISTRY_BASE": None, "COCOON_REGISTRY_DOCKER_CONFIG": "/etc/cocoon-hibernation/registry-auth/config.json",
        "COCOON_REGISTRY_CA_FILE": "/etc/cocoon-hibernation/registry-ca/ca.crt", "COCOON_REGISTRY_TIMEOUT": "10s",
        "COCOON_CONCURRENCY": "4", "COCOON_HIBERNATE_TIMEOUT": "3m", "COCOON_WAKE_TIMEOUT": "5m",
        "COCOON_LOG_FORMAT": "text", "COCOON_TLS_CERT_FILE": "/etc/cocoon-hibernation/tls/tls.crt",
        "COCOON_TLS_KEY_FILE": "/etc/cocoon-hibernation/tls/tls.key", "COCOON_LEADER_ELECTION": "true",
        "COCOON_LEASE_NAME": None, "COCOON_SHUTDOWN_GRACE": "20s", "COCOON_WEBHOOK_ADDR": "0.0.0.0:8443",
        "COCOON_ADMIN_ADDR": "0.0.0.0:8080",
    }
    for name, value in expect_env.items():
        c.check(name in env and (value is None or env[name].get("value") == value),
                f"env {name}={value or '<set>'} (got {env.get(name)})")
    c.check(env.get("COCOON_LEASE_NAME", {}).get("value") in (lease.get("get") or []),
            "the Role's get/patch resourceNames name the configured Lease")
    mounts = {m["name"]: m["mountPath"] for m in ctr.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    c.check(mounts.get("tls") == "/etc/cocoon-hibernation/tls", "TLS secret mounted where COCOON_TLS_* point")
    tls_secret = vols.get("tls", {}).get("secret", {}).get("secretName")
    c.check(bool(tls_secret), "tls volume is a Secret")
    auth = vols.get("registry-auth", {}).get("secret", {})
    c.check(auth.get("items") == [{"key": ".dockerconfigjson", "path": "config.json"}],
            "registry credentials Secret's .dockerconfigjson mounted as config.json")
    c.check(mounts.get("registry-ca") == "/etc/cocoon-hibernation/registry-ca", "registry CA mounted")
    c.check(mounts.get("tmp") == "/tmp" and "emptyDir" in vols.get("tmp", {}), "writable /tmp emptyDir")

    # Service.
    svc = one(docs, "Service", c)
    sports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    c.check(sports == {"https": (443, "webhook"), "metrics": (8080, "admin")}, f"Service ports: {sports}")
    c.check(svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"], "Service selects the pods")

    # Webhook.
    vwc = one(docs, "ValidatingWebhookConfiguration", c)
    (wh,) = vwc["webhooks"]
    c.check(wh.get("failurePolicy") == "Fail", "failurePolicy Fail")
    c.check(wh.get("sideEffects") == "None", "sideEffects None")
    c.check(wh.get("admissionReviewVersions") == ["v1"], "admissionReviewVersions [v1]")
    c.check(wh.get("timeoutSeconds") == 5, "timeoutSeconds 5")
    c.check(wh.get("matchPolicy") == "Equivalent", "matchPolicy Equivalent")
    c.check(wh.get("matchConditions") == [{
        "name": "create-or-podref-change",
        "expression": "request.operation == 'CREATE' || object.spec.podRef != oldObject.spec.podRef"}],
        f"V7: matchConditions send only CREATEs and podRef changes: {wh.get('matchConditions')}")
    cc = wh.get("clientConfig", {}).get("service", {})
    c.check(cc == {"name": svc["metadata"]["name"], "namespace": namespace,
                   "path": "/validate-cocoonhibernation", "port": 443}, f"clientConfig.service: {cc}")
    (rule,) = wh["rules"]
    c.check(rule["apiGroups"] == ["cocoonset.cocoonstack.io"] and rule["apiVersions"] == ["v1"]
            and rule["resources"] == ["cocoonhibernations"]
            and sorted(rule["operations"]) == ["CREATE", "UPDATE"], f"rules: {rule}")
    exprs = wh.get("namespaceSelector", {}).get("matchExpressions", [])
    c.check(any(e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
                and {"kube-system", namespace} <= set(e["values"]) for e in exprs),
            f"namespaceSelector excludes kube-system and {namespace}")
    if mode == "self-signed":
        sec = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == tls_secret]
        c.check(len(sec) == 1 and sec[0].get("type") == "kubernetes.io/tls", "renders the TLS Secret")
        if sec:
            c.check(wh["clientConfig"].get("caBundle") == sec[0]["data"]["ca.crt"],
                    "caBundle is the generated CA")
            pem = base64.b64decode(sec[0]["data"]["tls.crt"]).decode()
            c.check(pem.startswith("-----BEGIN CERTIFICATE-----"), "tls.crt is a PEM certificate")
    else:
        certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
        issuers = [d for d in docs if d["kind"] == "Issuer"]
        c.check(len(certs) == 2 and len(issuers) == 2, "self-signed Issuer, CA Certificate, CA Issuer, serving Certificate")
        serving = [d for d in certs.values() if d["spec"]["secretName"] == tls_secret]
        c.check(len(serving) == 1, "a Certificate writes the mounted TLS Secret")
        if serving:
            names = serving[0]["spec"].get("dnsNames", [])
            c.check(f"{svc['metadata']['name']}.{namespace}.svc" in names, f"serving cert covers <svc>.<ns>.svc: {names}")
            inject = vwc["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
            c.check(inject == f"{namespace}/{serving[0]['metadata']['name']}", f"inject-ca-from: {inject}")
        c.check("caBundle" not in wh["clientConfig"], "no static caBundle with cert-manager")
        c.check(not any(d["kind"] == "Secret" for d in docs), "no chart-generated Secret with cert-manager")

    # PodDisruptionBudget.
    pdb = one(docs, "PodDisruptionBudget", c)
    c.check(pdb.get("spec", {}).get("minAvailable") == 1, "PDB minAvailable 1")
    c.check(pdb.get("spec", {}).get("selector", {}).get("matchLabels") == dep["spec"]["selector"]["matchLabels"],
            "PDB selects the pods")
    sys.exit(0 if c.done() else 1)


def cmd_assert_variant(path, what, namespace=""):
    """Smaller assertions on the renders with non-default values."""
    docs = load(path)
    kinds = [d["kind"] for d in docs]
    c = Checker(what)
    if what == "single-replica":
        c.check("PodDisruptionBudget" not in kinds, "no PDB with 1 replica")
        c.check("Role" not in kinds, "no Lease Role without leader election")
        dep = [d for d in docs if d["kind"] == "Deployment"][0]
        env = env_of(dep["spec"]["template"]["spec"]["containers"][0])
        c.check(env["COCOON_LEADER_ELECTION"]["value"] == "false", "COCOON_LEADER_ELECTION false")
        c.check(env["COCOON_LOG_FORMAT"]["value"] == "json", "COCOON_LOG_FORMAT json")
        c.check(env.get("COCOON_REGISTRY_PLAIN_HTTP", {}).get("value") == "true", "COCOON_REGISTRY_PLAIN_HTTP true")
        c.check("COCOON_REGISTRY_DOCKER_CONFIG" not in env, "no docker config without a credentials Secret")
    elif what == "kitchen-sink":
        dep = [d for d in docs if d["kind"] == "Deployment"][0]
        spec = dep["spec"]["template"]["spec"]
        ctr = spec["containers"][0]
        names = [e["name"] for e in ctr["env"]]
        c.check(len(names) == len(set(names)), f"no duplicate env names: {names}")
        env = env_of(ctr)
        c.check(env["COCOON_LOG"]["value"] == "debug", "extraEnv replaces a built-in variable")
        c.check(env["COCOON_REGISTRY_TOKEN_FILE"]["value"] == "/t", "extraEnv adds a variable")
        c.check(env["COCOON_WATCH_NAMESPACE"]["value"] == "apps", "COCOON_WATCH_NAMESPACE")
        c.check(env["COCOON_POD_SELECTOR"]["value"] == "cocoonstack.io/vm=true", "COCOON_POD_SELECTOR")
        c.check(env["COCOON_CONCURRENCY"]["value"] == "8", "COCOON_CONCURRENCY")
        c.check(env["COCOON_LEASE_NAME"]["value"] == "my-lease", "COCOON_LEASE_NAME")
        c.check(ctr["image"].endswith("@sha256:" + "0123456789abcdef" * 4), "image pinned by digest")
        c.check("ServiceAccount" not in kinds and spec["serviceAccountName"] == "existing-sa",
                "an existing ServiceAccount is used, not created")
        c.check(spec["terminationGracePeriodSeconds"] == 60 and "lifecycle" not in ctr,
                "terminationGracePeriodSeconds override, no preStop with preStopSleepSeconds 0")
        vols = {v["name"]: v for v in spec["volumes"]}
        c.check(vols["registry-ca"]["secret"]["items"] == [{"key": "bundle.pem", "path": "ca.crt"}], "CA from a Secret")
        c.check(vols["registry-auth"]["secret"]["items"] == [{"key": "config.json", "path": "config.json"}],
                "credentials from a config.json key")
        role = [d for d in docs if d["kind"] == "Role"][0]
        c.check(any(r.get("resourceNames") == ["my-lease"] for r in role["rules"]), "Role names the custom Lease")
        wh = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"][0]["webhooks"][0]
        sel = wh["namespaceSelector"]
        c.check(sel.get("matchLabels") == {"cocoon": "enabled"}, "extra matchLabels kept")
        c.check(sel["matchExpressions"][0]["values"] == ["kube-system", namespace, "infra"]
                and sel["matchExpressions"][1]["key"] == "tier", f"exclusions merged: {sel}")
        c.check(wh["timeoutSeconds"] == 10, "webhook.timeoutSeconds")
        c.check("PodDisruptionBudget" in kinds, "PDB with 3 replicas")
    elif what == "vm-identity":
        vaps = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
        binds = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
        c.check(len(vaps) == 1 and len(binds) == 1, "S3: one policy and one binding")
        if vaps and binds:
            vap, b = vaps[0], binds[0]
            spec = vap["spec"]
            c.check(vap["apiVersion"] == b["apiVersion"] == "admissionregistration.k8s.io/v1",
                    "admissionregistration.k8s.io/v1")
            c.check(spec.get("failurePolicy") == "Fail", "policy failurePolicy Fail")
            (rule,) = spec["matchConstraints"]["resourceRules"]
            c.check(rule["apiGroups"] == [""] and sorted(rule["operations"]) == ["CREATE", "UPDATE"]
                    and rule["resources"] == ["pods", "pods/*"],
                    f"matches pod CREATE/UPDATE, subresources included: {rule}")
            allowed = {v["name"]: v["expression"] for v in spec["variables"]}.get("allowed", "")
            c.check('"system:serviceaccount:vk:vk-cocoon"' in allowed
                    and '"system:serviceaccounts:cocoonset-system"' in allowed,
                    f"the allowed identities are in the policy: {allowed}")
            vals = spec["validations"]
            for key in ("vm.cocoonstack.io/name", "vm.cocoonstack.io/id"):
                v = [x for x in vals if key in x["expression"]]
                c.check(len(v) == 1 and key in v[0].get("messageExpression", "")
                        and v[0].get("reason") == "Forbidden", f"one validation for {key}; its message names it")
            c.check(b["spec"]["policyName"] == vap["metadata"]["name"], "the binding binds the policy")
            c.check(b["spec"]["validationActions"] == ["Deny"], "validationActions [Deny]")
            c.check(b["spec"].get("matchResources", {}).get("namespaceSelector")
                    == {"matchLabels": {"tenant": "true"}}, "namespaceSelector passed through")
    elif what == "servicemonitor":
        sm = [d for d in docs if d["kind"] == "ServiceMonitor"]
        c.check(len(sm) == 1 and sm[0]["apiVersion"] == "monitoring.coreos.com/v1", "ServiceMonitor rendered")
        if sm:
            c.check(sm[0]["spec"]["endpoints"][0]["port"] == "metrics", "scrapes the metrics port")
    sys.exit(0 if c.done() else 1)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"swagger": cmd_swagger, "crd": cmd_crd, "filter": cmd_filter, "only": cmd_only, "get": get,
     "assert": cmd_assert, "assert-variant": cmd_assert_variant}[cmd](*args)
PYEOF
tool() { python3 "$PY" "$@"; }

# helm_render MODE OUT [helm args...]: renders the chart as a release in $NS.
helm_render() {
  local mode="$1" out="$2"
  shift 2
  helm template "$RELEASE" "$CHART" --namespace "$NS" --kube-version "$KUBE_VERSION" \
    --set registry.base="$REGISTRY_BASE" --set tls.mode="$mode" "$@" >"$out"
}

# Values that switch on the optional mounts, so every branch is rendered and validated.
FULL=(--set registry.credentialsSecret=cocoon-registry --set registry.caConfigMap=cocoon-registry-ca)
# Every other optional value set at once.
cat >"$WORK/kitchen-sink.values.yaml" <<'EOF'
replicas: 3
image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
imagePullSecrets: [{name: pull}]
serviceAccount: {create: false, name: existing-sa}
registry: {caSecret: reg-ca, caKey: bundle.pem, credentialsSecret: creds, credentialsSecretKey: config.json}
controller: {watchNamespace: apps, podSelector: "cocoonstack.io/vm=true", concurrency: 8}
leaderElection: {leaseName: my-lease, leaseDuration: 20s}
webhook:
  timeoutSeconds: 10
  excludeNamespaces: [infra]
  namespaceSelector:
    matchLabels: {cocoon: enabled}
    matchExpressions: [{key: tier, operator: In, values: [vm]}]
podAnnotations: {example.com/a: "b"}
podLabels: {team: vm}
priorityClassName: system-cluster-critical
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: k, operator: Exists, effect: NoSchedule}]
affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Exists}]}]}}}
extraEnv: [{name: COCOON_LOG, value: debug}, {name: COCOON_REGISTRY_TOKEN_FILE, value: /t}]
preStopSleepSeconds: 0
terminationGracePeriodSeconds: 60
service: {annotations: {example.com/x: "z"}}
EOF

# The VM identity policy (S3) switched on.
cat >"$WORK/vm-identity.values.yaml" <<'EOF'
vmIdentityPolicy:
  allowedUsernames: [system:serviceaccount:vk:vk-cocoon]
  allowedGroups: [system:serviceaccounts:cocoonset-system]
  namespaceSelector: {matchLabels: {tenant: "true"}}
EOF

# ---------------------------------------------------------------------------------------
crd_drift() {
  local crd="$WORK/crd.yaml"
  if [[ -n "${COCOON_BIN:-}" ]]; then
    [[ -x "$COCOON_BIN" ]] || die "COCOON_BIN=$COCOON_BIN is not executable"
    "$COCOON_BIN" crd >"$crd"
  else
    (cd "$ROOT" && cargo run -q --locked -- crd) >"$crd"
  fi
  [[ -s "$crd" ]] || die "'cocoon-hibernation crd' printed nothing"
  diff -u "$crd" "$CRD_FILE" ||
    die "the chart's CRD differs from 'cocoon-hibernation crd'; regenerate it:
    cocoon-hibernation crd > charts/cocoon-hibernation/crds/cocoonhibernations.yaml"
}

lint() {
  helm lint --strict "$CHART" --kube-version "$KUBE_VERSION" --namespace "$NS" \
    --set registry.base="$REGISTRY_BASE"
  helm lint --strict "$CHART" --kube-version "$KUBE_VERSION" --namespace "$NS" \
    --set registry.base="$REGISTRY_BASE" --set tls.mode=cert-manager --set serviceMonitor.enabled=true "${FULL[@]}"
  helm lint --strict "$CHART" --kube-version "$KUBE_VERSION" --namespace "$NS" \
    --set registry.base="$REGISTRY_BASE" -f "$WORK/vm-identity.values.yaml"
  # Bad values must be refused, not rendered.
  if helm template x "$CHART" --kube-version "$KUBE_VERSION" >/dev/null 2>"$WORK/err"; then
    die "rendering without registry.base must fail"
  fi
  grep -q "registry.base" "$WORK/err" || die "missing registry.base: unclear error: $(cat "$WORK/err")"
  if helm template x "$CHART" --kube-version "$KUBE_VERSION" --set registry.base=r \
      --set tls.mode=bogus >/dev/null 2>"$WORK/err"; then
    die "tls.mode=bogus must be refused"
  fi
  if helm template x "$CHART" --kube-version "$KUBE_VERSION" --set registry.base=https://r/x \
      >/dev/null 2>"$WORK/err"; then
    die "registry.base with a scheme must be refused"
  fi
  if helm template x "$CHART" --kube-version "$KUBE_VERSION" --set registry.base=r \
      --set controller.concurrency=0 >/dev/null 2>"$WORK/err"; then
    die "controller.concurrency=0 must be refused (values.schema.json, C1)"
  fi
  if helm template x "$CHART" --kube-version "$KUBE_VERSION" --set registry.base=r \
      --set controller.hibernateTimeout="3 min" >/dev/null 2>"$WORK/err"; then
    die "a malformed duration must be refused (values.schema.json)"
  fi
  if helm template x "$CHART" --kube-version "$KUBE_VERSION" --set registry.base=r \
      --set vmIdentityPolicy.allowedUsernames=vk >/dev/null 2>"$WORK/err"; then
    die "vmIdentityPolicy.allowedUsernames must be a list (values.schema.json)"
  fi
  log "bad values are refused"
}

schemas() {
  # Built-in kinds, from the apiserver's OpenAPI; cached per server version and converter.
  local key
  key="$(sha256sum "$PY" | cut -c1-12)"
  BUILTIN_SCHEMAS="$CACHE_ROOT/kubeconform-schemas/$SERVER_VERSION-$key"
  if [[ ! -f "$BUILTIN_SCHEMAS/.complete" ]]; then
    log "generating built-in schemas from $SERVER_VERSION's /openapi/v2"
    rm -rf "$CACHE_ROOT/kubeconform-schemas/$SERVER_VERSION"-* # older converter versions
    mkdir -p "$BUILTIN_SCHEMAS"
    kubectl get --raw /openapi/v2 >"$WORK/swagger.json"
    log "$(tool swagger "$WORK/swagger.json" "$BUILTIN_SCHEMAS") schemas in $BUILTIN_SCHEMAS"
    touch "$BUILTIN_SCHEMAS/.complete"
  else
    log "built-in schemas: $BUILTIN_SCHEMAS (cached)"
  fi
  # The CRD's own schema, from the chart's CRD file, every run.
  CRD_SCHEMAS="$WORK/crd-schemas"
  tool crd "$CRD_FILE" "$CRD_SCHEMAS" >&2
  [[ -f "$CRD_SCHEMAS/cocoonhibernation-cocoonset-v1.json" ]] || die "no CocoonHibernation schema generated"
}

kubeconform_run() {
  kubeconform -strict -summary -exit-on-error=false -kubernetes-version "$KUBE_VERSION" \
    -schema-location "$BUILTIN_SCHEMAS/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -schema-location "$CRD_SCHEMAS/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -skip Certificate,Issuer,ServiceMonitor "$@"
}

validate() {
  schemas
  helm_render self-signed "$WORK/self-signed.yaml" --include-crds "${FULL[@]}"
  helm_render cert-manager "$WORK/cert-manager.yaml" --include-crds "${FULL[@]}" --set serviceMonitor.enabled=true
  helm_render self-signed "$WORK/single.yaml" --set replicas=1 --set leaderElection.enabled=false \
    --set log.format=json --set registry.plainHTTP=true
  helm_render self-signed "$WORK/kitchen-sink.yaml" -f "$WORK/kitchen-sink.values.yaml"
  helm_render self-signed "$WORK/vm-identity.yaml" -f "$WORK/vm-identity.values.yaml"
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
  kubectl wait --for=condition=Established --timeout=60s \
    crd/cocoonhibernations.cocoonset.cocoonstack.io
  kubectl get namespace "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS"
  local f
  for f in self-signed cert-manager; do
    # Without the CRDs (applied above): Helm installs crds/ itself, the dry run checks the rest.
    helm_render "$f" "$WORK/$f.norcd.yaml" "${FULL[@]}" --set serviceMonitor.enabled=true
    tool filter "$WORK/$f.norcd.yaml" cert-manager.io,monitoring.coreos.com >"$WORK/$f.dry.yaml"
    log "server-side dry run: $f"
    kubectl apply --server-side --dry-run=server --field-manager="$FIELD_MANAGER" -f "$WORK/$f.dry.yaml"
  done
  log "server-side dry run: kitchen-sink values"
  kubectl apply --server-side --dry-run=server --field-manager="$FIELD_MANAGER" -f "$WORK/kitchen-sink.yaml"
  # The apiserver type-checks the VM identity policy's CEL (S3).
  log "server-side dry run: VM identity policy"
  tool only "$WORK/vm-identity.yaml" ValidatingAdmissionPolicy >"$WORK/vap.yaml"
  echo "---" >>"$WORK/vap.yaml"
  tool only "$WORK/vm-identity.yaml" ValidatingAdmissionPolicyBinding >>"$WORK/vap.yaml"
  kubectl apply --server-side --dry-run=server --field-manager="$FIELD_MANAGER" -f "$WORK/vap.yaml"
  # A CR is accepted by the real CRD (schema + CEL compile) too.
  kubectl apply --server-side --dry-run=server --field-manager="$FIELD_MANAGER" -f "$WORK/example-cr.yaml"

  # self-signed: an upgrade reuses the certificate in the release's Secret (lookup), and
  # renews it when it is about to expire. helm --dry-run=server lets lookup see the cluster.
  local secret="$RELEASE-tls"
  CLEANUP+=("'$KUBECTL' -n '$NS' delete secret '$secret' --ignore-not-found")
  kubectl -n "$NS" delete secret "$secret" --ignore-not-found >/dev/null
  helm_render self-signed "$WORK/install.yaml" --dry-run=server
  tool only "$WORK/install.yaml" Secret >"$WORK/secret.yaml"
  kubectl apply --server-side --field-manager="$FIELD_MANAGER" -f "$WORK/secret.yaml" >/dev/null
  # As Helm would have left it (Helm 4's --dry-run=server checks release ownership).
  kubectl -n "$NS" annotate secret "$secret" --overwrite >/dev/null \
    "meta.helm.sh/release-name=$RELEASE" "meta.helm.sh/release-namespace=$NS"
  helm_render self-signed "$WORK/upgrade.yaml" --dry-run=server
  local a b
  a="$(tool get "$WORK/install.yaml" 'ValidatingWebhookConfiguration.webhooks.0.clientConfig.caBundle')"
  b="$(tool get "$WORK/upgrade.yaml" 'ValidatingWebhookConfiguration.webhooks.0.clientConfig.caBundle')"
  [[ "$a" == "$b" ]] || die "upgrade regenerated the self-signed CA although the Secret is valid"
  a="$(tool get "$WORK/install.yaml" 'Deployment.spec.template.metadata.annotations.checksum/tls')"
  b="$(tool get "$WORK/upgrade.yaml" 'Deployment.spec.template.metadata.annotations.checksum/tls')"
  [[ "$a" == "$b" ]] || die "upgrade changed checksum/tls although the certificate was reused"
  log "upgrade reuses the self-signed certificate and keeps checksum/tls"
  kubectl -n "$NS" annotate secret "$secret" --overwrite \
    "cocoon-hibernation.cocoonstack.io/tls-expires=$(($(date +%s) + 86400))" >/dev/null
  helm_render self-signed "$WORK/renew.yaml" --dry-run=server
  a="$(tool get "$WORK/install.yaml" 'ValidatingWebhookConfiguration.webhooks.0.clientConfig.caBundle')"
  b="$(tool get "$WORK/renew.yaml" 'ValidatingWebhookConfiguration.webhooks.0.clientConfig.caBundle')"
  [[ "$a" != "$b" ]] || die "a certificate expiring within renewBeforeDays was not renewed"
  log "upgrade renews a certificate that is about to expire"
}

assertions() {
  tool assert "$WORK/self-signed.yaml" self-signed "$NS"
  helm_render cert-manager "$WORK/cert-manager.plain.yaml" --include-crds "${FULL[@]}"
  tool assert "$WORK/cert-manager.plain.yaml" cert-manager "$NS"
  tool assert-variant "$WORK/single.yaml" single-replica
  tool assert-variant "$WORK/cert-manager.yaml" servicemonitor
  tool assert-variant "$WORK/kitchen-sink.yaml" kitchen-sink "$NS"
  tool assert-variant "$WORK/vm-identity.yaml" vm-identity
}

step crd-drift crd_drift
step lint lint
step kubeconform validate
step dry-run dry_run
step assertions assertions
