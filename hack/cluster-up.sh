#!/usr/bin/env bash
# Starts a local control plane for tests and demos, all on loopback:
#   etcd + kube-apiserver (RBAC, audit log of API writes) + an OCI registry (plain http).
# Usage: hack/cluster-up.sh [--node] [--restart-apiserver] [STATE_DIR]
#   --node: a real single-node cluster instead (hack/node.sh): kube-controller-manager,
#   kube-scheduler, a kubelet with containerd and a CNI bridge. The apiserver and the
#   registry then listen on the bridge's address (pods must reach them), not on loopback.
#   Needs root. STATE_DIR defaults to ~/.cache/cocoon-hibernation/node-cluster.
#   --restart-apiserver: stop and start only kube-apiserver of the running cluster (same
#   port, etcd, PKI and audit log); the soak uses it (tests/soak).
#   STATE_DIR defaults to ${COCOON_STATE_DIR:-$HOME/.cache/cocoon-hibernation/cluster}.
# Idempotent: a healthy running cluster is reused; stale state is cleaned and restarted.
# Writes $STATE_DIR/env (sourceable KEY=value lines) and prints where everything is.
set -euo pipefail
LOG_TAG=cluster-up
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# shellcheck source=hack/node.sh
source "$HACK_DIR/node.sh"

RESTART_APISERVER=0 NODE=0
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --restart-apiserver) RESTART_APISERVER=1 ;;
    --node) NODE=1 ;;
    *) die "unknown flag $1 (usage: hack/cluster-up.sh [--node] [--restart-apiserver] [STATE_DIR])" ;;
  esac
  shift
done
if ((NODE)); then
  resolve_state_dir "${1:-${COCOON_NODE_STATE_DIR:-$HOME/.cache/cocoon-hibernation/node-cluster}}"
  API_HOST="$NODE_IP"
  DAEMONS+=("${NODE_DAEMONS[@]}")
  node_preflight
else
  resolve_state_dir "${1:-}"
  API_HOST=127.0.0.1
fi
START=$SECONDS

missing=()
for tool in openssl curl flock setsid docker-registry; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  die "missing: ${missing[*]}. Install with: apt-get install -y docker-registry openssl curl util-linux"
fi

take_lock

node_flag=()
if ((NODE)); then node_flag=(--node); fi
BIN_DIR="$("$HACK_DIR/build-control-plane.sh" "${node_flag[@]}" | tail -n 1)" ||
  die "hack/build-control-plane.sh failed (it needs Go >= 1.24 on a cold cache)"
[[ -x "$BIN_DIR/kube-apiserver" && -x "$BIN_DIR/etcd" && -x "$BIN_DIR/kubectl" ]] ||
  die "build-control-plane.sh gave $BIN_DIR without kube-apiserver, etcd and kubectl"
KUBECTL="$BIN_DIR/kubectl"

PKI="$STATE_DIR/pki"
KUBECONFIG_FILE="$STATE_DIR/kubeconfig"
AUDIT_LOG="$STATE_DIR/audit.log"
RUN_STATE="$STATE_DIR/run.state"

# ---------------------------------------------------------------------------------------
# PKI (generated once per state dir), made with certs/certs.sh. One CA serves as apiserver
# serving CA, client CA and the CA tests sign webhook serving certs with; tests may also
# mint client identities. Its subject is a UTF8String CN (certs.sh's utf8only mask):
# testkit/src/cluster.rs rebuilds the issuer name with rcgen to sign webhook certs, and
# verifiers compare the bytes. Keep CA_CN equal to that file's CA_COMMON_NAME.
CERTS="$HACK_DIR/../certs/certs.sh"
CA_CN=cocoon-hibernation-test-ca

gen_pki() {
  rm -rf "$PKI"
  mkdir -p "$PKI"
  bash "$CERTS" ca --dir "$PKI" --cn "$CA_CN"
  local extra=()
  if ((NODE)); then extra=(--ip "$NODE_IP" --ip "$KUBERNETES_SERVICE_IP" --dns kubernetes.default.svc); fi
  bash "$CERTS" issue --ca "$PKI" --out "$PKI/apiserver" --cn kube-apiserver \
    --dns localhost --ip 127.0.0.1 "${extra[@]}"
  bash "$CERTS" issue --ca "$PKI" --out "$PKI/admin" --cn admin --org system:masters --client
  # The service-account token signing key pair: a key, not a certificate.
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/sa.key" 2>/dev/null)
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
  log "generated PKI in $PKI"
}

# pki_ok: every file is there, and the apiserver and admin certificates still chain to the
# CA with a week to spare (a PKI left half-made or expiring is made again).
pki_ok() {
  [[ -f "$PKI/ca.key" && -f "$PKI/sa.key" && -f "$PKI/sa.pub" && -f "$PKI/admin.key" && -f "$PKI/apiserver.key" ]] &&
    bash "$CERTS" check --ca "$PKI" --cert "$PKI/apiserver.crt" --ip "$API_HOST" 2>/dev/null &&
    bash "$CERTS" check --ca "$PKI" --cert "$PKI/admin.crt"
}

# ---------------------------------------------------------------------------------------
curl_api() {
  curl -fsS --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://$API_HOST:$API_PORT$1"
}
etcd_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
apiserver_healthy() { [[ "$(curl_api /healthz)" == ok ]]; }
default_ns_exists() { curl_api /api/v1/namespaces/default >/dev/null; }
registry_healthy() { curl -fsS --max-time 2 -o /dev/null "http://$REGISTRY/v2/"; }

running_and_healthy() {
  [[ -f "$RUN_STATE" && -f "$PKI/ca.key" && -f "$KUBECONFIG_FILE" ]] || return 1
  # shellcheck source=/dev/null
  source "$RUN_STATE"
  # Binaries from another version or place mean a restart, not a reuse.
  [[ "${RUN_BIN_DIR:-}" == "$BIN_DIR" ]] || return 1
  local d
  for d in "${DAEMONS[@]}"; do daemon_pid "$d" >/dev/null || return 1; done
  { etcd_healthy && apiserver_healthy && default_ns_exists && registry_healthy; } || return 1
  if ((NODE)); then node_ready; fi
}

write_kubeconfig() {
  local tmp="$KUBECONFIG_FILE.tmp"
  cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cocoon-local
  cluster:
    server: https://$API_HOST:$API_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 "$PKI/admin.crt")
    client-key-data: $(base64 -w0 "$PKI/admin.key")
contexts:
- name: cocoon-local
  context:
    cluster: cocoon-local
    user: admin
    namespace: default
current-context: cocoon-local
EOF
  chmod 600 "$tmp"
  mv "$tmp" "$KUBECONFIG_FILE"
}

# kube-apiserver on $API_PORT over the etcd on $ETCD_PORT (both set by the caller).
start_apiserver() {
  # A bare apiserver has no controller-manager to make ServiceAccounts; a real node has,
  # and its kubelet mounts their tokens. It reaches webhook Services through their
  # endpoints (no kube-proxy) and kubelets by their InternalIP (no DNS).
  local mode=(--disable-admission-plugins=ServiceAccount)
  if ((NODE)); then
    mode=(--enable-aggregator-routing=true --kubelet-preferred-address-types=InternalIP
      --kubelet-client-certificate="$PKI/admin.crt" --kubelet-client-key="$PKI/admin.key")
  fi
  start_daemon kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$API_HOST" --secure-port="$API_PORT" --advertise-address="$API_HOST" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --authorization-mode=RBAC \
    "${mode[@]}" \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --service-account-issuer="https://127.0.0.1:$API_PORT/" \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --audit-policy-file="$STATE_DIR/audit-policy.yaml" \
    --audit-log-path="$AUDIT_LOG" --audit-log-format=json --audit-log-mode=blocking \
    --audit-log-maxsize=0 --audit-log-maxbackup=0
}

start_all() {
  if ((NODE)); then stop_node; fi
  stop_all
  # Runtime state goes; the PKI stays unless it is incomplete.
  rm -rf "$STATE_DIR/etcd-data" "$STATE_DIR/registry-data" "$RUN_STATE" "$STATE_DIR/env" \
    "$AUDIT_LOG" "$STATE_DIR"/*.log
  pki_ok || gen_pki

  ETCD_PORT="$(free_port)"
  ETCD_PEER_PORT="$(free_port)"
  API_PORT="$(free_port)"
  REGISTRY_PORT="$(free_port)"
  REGISTRY="$API_HOST:$REGISTRY_PORT"
  # The apiserver and the registry bind the bridge's address on a real node.
  if ((NODE)); then node_network_up; fi

  start_daemon etcd "$BIN_DIR/etcd" \
    --name=cocoon --data-dir="$STATE_DIR/etcd-data" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="cocoon=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync=true --log-level=warn

  # Tests count API writes from this log; reads would drown them, so they are not logged.
  cat >"$STATE_DIR/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
# CR status writes keep their body (the status sent), so the benchmark can tell a write
# that moves the phase from one that only changes a condition.
- level: Request
  verbs: ["update", "patch"]
  resources: [{group: "cocoonset.cocoonstack.io", resources: ["cocoonhibernations/status"]}]
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
EOF

  mkdir -p "$STATE_DIR/registry-data"
  # On a real node the install suite reads who sent which DELETE, and when (S1's fence).
  local access_log_off=true
  if ((NODE)); then access_log_off=false; fi
  cat >"$STATE_DIR/registry.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: $access_log_off
storage:
  filesystem:
    rootdirectory: $STATE_DIR/registry-data
  delete:
    enabled: true
http:
  addr: $REGISTRY
  secret: cocoon-local-not-a-secret
EOF
  start_daemon registry docker-registry serve "$STATE_DIR/registry.yml"

  wait_until 30 etcd etcd_healthy || die "etcd not healthy after 30s (see $STATE_DIR/etcd.log)"

  start_apiserver

  wait_until 10 registry registry_healthy || die "registry not healthy after 10s (see $STATE_DIR/registry.log)"
  wait_until 90 kube-apiserver apiserver_healthy ||
    die "kube-apiserver /healthz not ok after 90s (see $STATE_DIR/kube-apiserver.log)"
  wait_until 30 "namespace default" default_ns_exists ||
    die "namespace default missing after 30s (see $STATE_DIR/kube-apiserver.log)"

  write_kubeconfig
  if ((NODE)); then start_node; fi
  # shellcheck disable=SC2034 # both are read through ${!key} below
  local RUN_BIN_DIR="$BIN_DIR" RUN_NODE="$NODE" key
  for key in ETCD_PORT ETCD_PEER_PORT API_PORT REGISTRY_PORT REGISTRY RUN_BIN_DIR RUN_NODE; do
    echo "$key=${!key}"
  done >"$RUN_STATE"
}

if ((RESTART_APISERVER)); then
  running_and_healthy || die "no healthy cluster in $STATE_DIR whose kube-apiserver could be restarted"
  stop_daemon kube-apiserver
  start_apiserver
  wait_until 90 kube-apiserver apiserver_healthy ||
    die "kube-apiserver /healthz not ok 90s after its restart (see $STATE_DIR/kube-apiserver.log)"
  log "kube-apiserver restarted in $((SECONDS - START))s"
  echo "$STATE_DIR/env"
  exit 0
fi

if running_and_healthy; then
  log "reusing the running cluster in $STATE_DIR"
else
  log "starting a fresh cluster in $STATE_DIR"
  start_all
fi

K8S_VERSION="$(curl_api /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')"
[[ "$K8S_VERSION" == v1.* ]] ||
  die "kube-apiserver reports version '$K8S_VERSION'; rebuild it with version ldflags (hack/build-control-plane.sh)"

# Written last and atomically: its presence means "up and healthy".
cat >"$STATE_DIR/env.tmp" <<EOF
KUBECONFIG=$KUBECONFIG_FILE
COCOON_APISERVER_URL=https://$API_HOST:$API_PORT
COCOON_CA_CERT=$PKI/ca.crt
COCOON_CA_KEY=$PKI/ca.key
COCOON_REGISTRY=$REGISTRY
COCOON_AUDIT_LOG=$AUDIT_LOG
COCOON_K8S_VERSION=$K8S_VERSION
COCOON_BIN_DIR=$BIN_DIR
COCOON_STATE_DIR=$STATE_DIR
COCOON_NODE=$NODE
EOF
if ((NODE)); then
  cat >>"$STATE_DIR/env.tmp" <<EOF
COCOON_NODE_NAME=$NODE_NAME
COCOON_NODE_IP=$NODE_IP
COCOON_VIRTUAL_NODE=$VIRTUAL_NODE
COCOON_CONTAINERD_SOCK=$(node_sock)
EOF
fi
mv "$STATE_DIR/env.tmp" "$STATE_DIR/env"

cat >&2 <<EOF
[cluster-up] ready in $((SECONDS - START))s
  kube-apiserver  https://$API_HOST:$API_PORT  ($K8S_VERSION, pid $(cat "$STATE_DIR/kube-apiserver.pid"))
  etcd            http://127.0.0.1:$ETCD_PORT  (pid $(cat "$STATE_DIR/etcd.pid"))
  registry        http://$REGISTRY  (pid $(cat "$STATE_DIR/registry.pid"), data $STATE_DIR/registry-data)
  kubeconfig      $KUBECONFIG_FILE  (admin, system:masters)
  CA              $PKI/ca.crt  key $PKI/ca.key
  audit log       $AUDIT_LOG  (create/update/patch/delete at Metadata level)
  logs            $STATE_DIR/{etcd,kube-apiserver,registry}.log
  kubectl         $KUBECTL
  env file        $STATE_DIR/env   (source it: set -a; . $STATE_DIR/env; set +a)
EOF
echo "$STATE_DIR/env"
