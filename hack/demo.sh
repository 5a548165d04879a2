#!/usr/bin/env bash
# `make demo`: a local control plane, the server, the vk-cocoon simulator, a demo pod and
# its CocoonHibernation; hibernates and wakes it, printing each phase with a timestamp.
# Leaves everything running. `make demo-down` (hack/demo.sh down) stops it all.
set -euo pipefail
LOG_TAG=demo
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$(cd "$HACK_DIR/.." && pwd)"
DEMO_DIR="${COCOON_DEMO_DIR:-$HOME/.cache/cocoon-hibernation/demo}"
CLUSTER_DIR="$DEMO_DIR/cluster"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
NS=demo
POD=web-0

stop_pid() {
  local f="$DEMO_DIR/$1.pid"
  if [[ -f "$f" ]]; then
    local pid
    pid="$(cat "$f")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  fi
}

if [[ "${1:-up}" == "down" ]]; then
  stop_pid simulator
  stop_pid server
  [[ -d "$CLUSTER_DIR" ]] && bash "$HACK_DIR/cluster-down.sh" "$CLUSTER_DIR"
  # The serving certificate is signed by the cluster CA just removed.
  rm -f "$DEMO_DIR"/tls.{crt,key,csr} "$DEMO_DIR/ext.cnf"
  log "demo stopped"
  exit 0
fi

mkdir -p "$DEMO_DIR"
log "building the server and the simulator (cached after the first run)"
(cd "$ROOT" && cargo build --quiet --bin cocoon-hibernation --example vk_cocoon_simulator)
BIN="$CARGO_TARGET_DIR/debug/cocoon-hibernation"
SIM="$CARGO_TARGET_DIR/debug/examples/vk_cocoon_simulator"

ENV_FILE="$(bash "$HACK_DIR/cluster-up.sh" "$CLUSTER_DIR" | tail -n 1)"
set -a
# shellcheck disable=SC1090
source "$ENV_FILE"
set +a
KUBECTL="$COCOON_BIN_DIR/kubectl"
log "kube-apiserver $COCOON_K8S_VERSION, registry $COCOON_REGISTRY"

"$BIN" crd | "$KUBECTL" apply --server-side -f - >/dev/null
"$KUBECTL" wait --for condition=Established crd/cocoonhibernations.cocoonset.cocoonstack.io --timeout=30s >/dev/null

# Webhook serving certificate for 127.0.0.1, signed by the cluster CA (made again when
# the cluster, and so its CA, is new).
if [[ ! -s "$DEMO_DIR/tls.crt" ]] ||
  ! openssl verify -CAfile "$COCOON_CA_CERT" "$DEMO_DIR/tls.crt" >/dev/null 2>&1; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$DEMO_DIR/tls.key" 2>/dev/null
  openssl req -new -key "$DEMO_DIR/tls.key" -subj "/CN=cocoon-hibernation-demo" -out "$DEMO_DIR/tls.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$DEMO_DIR/ext.cnf"
  openssl x509 -req -in "$DEMO_DIR/tls.csr" -CA "$COCOON_CA_CERT" -CAkey "$COCOON_CA_KEY" -CAcreateserial \
    -days 30 -extfile "$DEMO_DIR/ext.cnf" -out "$DEMO_DIR/tls.crt" 2>/dev/null
fi

WEBHOOK_PORT="${COCOON_DEMO_WEBHOOK_PORT:-18443}"
ADMIN_PORT="${COCOON_DEMO_ADMIN_PORT:-18080}"
stop_pid simulator
stop_pid server
setsid "$BIN" run \
  --webhook-addr "127.0.0.1:$WEBHOOK_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
  --tls-cert-file "$DEMO_DIR/tls.crt" --tls-key-file "$DEMO_DIR/tls.key" \
  --registry-base "$COCOON_REGISTRY" --registry-plain-http \
  --leader-election=true --lease-namespace default \
  </dev/null >>"$DEMO_DIR/server.log" 2>&1 &
echo $! >"$DEMO_DIR/server.pid"
setsid "$SIM" --registry "$COCOON_REGISTRY" --hibernate-delay-ms 2000 --wake-delay-ms 2000 \
  </dev/null >>"$DEMO_DIR/simulator.log" 2>&1 &
echo $! >"$DEMO_DIR/simulator.pid"

for _ in $(seq 1 300); do
  curl -fsS "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null || die "server not ready; see $DEMO_DIR/server.log"

CA_B64="$(base64 -w0 <"$COCOON_CA_CERT")"
"$KUBECTL" apply --server-side -f - >/dev/null <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: cocoon-hibernation-demo
webhooks:
  - name: validate.cocoonhibernation.cocoonstack.io
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Fail
    matchPolicy: Equivalent
    timeoutSeconds: 5
    clientConfig:
      url: https://127.0.0.1:$WEBHOOK_PORT/validate-cocoonhibernation
      caBundle: $CA_B64
    namespaceSelector:
      matchExpressions:
        - { key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system] }
    rules:
      - apiGroups: [cocoonset.cocoonstack.io]
        apiVersions: [v1]
        operations: [CREATE, UPDATE]
        resources: [cocoonhibernations]
YAML

"$KUBECTL" create namespace "$NS" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" -n "$NS" delete ch "$POD" --ignore-not-found --wait=true >/dev/null
"$KUBECTL" -n "$NS" delete pod "$POD" --ignore-not-found --grace-period=0 >/dev/null
"$KUBECTL" -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $POD
  annotations:
    vm.cocoonstack.io/name: demo-$POD
    cocoonset.cocoonstack.io/generation: "1"
    vm.cocoonstack.io/id: vm-$(date +%s)
    vm.cocoonstack.io/lifecycle-state: ready
spec:
  containers:
    - name: vm
      image: cocoon/vm:demo
YAML

phase() { "$KUBECTL" -n "$NS" get ch "$POD" -o jsonpath='{.status.phase}' 2>/dev/null || true; }
watch_until() {
  local want="$1" last="" now deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    now="$(phase)"
    if [[ -n "$now" && "$now" != "$last" ]]; then
      echo "$(date -u +%H:%M:%S.%3N)  $NS/$POD  ${now}"
      last="$now"
    fi
    [[ "$now" == "$want" ]] && return 0
    sleep 0.2
  done
  die "did not reach $want; see $DEMO_DIR/server.log"
}

START=$SECONDS
echo "--- hibernate"
"$KUBECTL" -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: cocoonset.cocoonstack.io/v1
kind: CocoonHibernation
metadata:
  name: $POD
spec:
  podRef: { name: $POD }
  desire: Hibernate
YAML
watch_until Hibernated
echo "--- wake"
"$KUBECTL" -n "$NS" patch ch "$POD" --type merge -p '{"spec":{"desire":"Wake"}}' >/dev/null
watch_until Active
echo "--- round trip took $((SECONDS - START))s"
"$KUBECTL" -n "$NS" get ch
echo
echo "Everything is still running. Try it yourself:"
echo "  export KUBECONFIG=$KUBECONFIG"
echo "  $KUBECTL get ch -A"
echo "Logs: $DEMO_DIR/server.log, $DEMO_DIR/simulator.log. Stop with: make demo-down"
