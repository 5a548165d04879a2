#!/usr/bin/env bash
# `make demo`: a local control plane, the server, the vk-cocoon simulator, a demo pod and
# its CocoonHibernation; hibernates and wakes it, printing each phase with a timestamp.
# Leaves everything running. `make demo-down` (hack/demo.sh down) stops it all. Safe to
# run again at any time, before or after `make demo-down`.
#
# Ports are picked free on loopback unless given:
#   COCOON_DEMO_WEBHOOK_PORT  the webhook (HTTPS)      COCOON_DEMO_ADMIN_PORT  /metrics, /readyz
# State, logs and the webhook certificate: ${COCOON_DEMO_DIR:-~/.cache/cocoon-hibernation/demo}.
set -euo pipefail
LOG_TAG=demo
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=hack/demo-lib.sh
source "$HACK_DIR/demo-lib.sh"
ROOT="$(cd "$HACK_DIR/.." && pwd)"
DEMO_DIR="${COCOON_DEMO_DIR:-$HOME/.cache/cocoon-hibernation/demo}"
CLUSTER_DIR="$DEMO_DIR/cluster"
CERTS="$ROOT/certs/certs.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
NS=demo
POD=web-0
SERVER=cocoon-hibernation SIMULATOR=vk_cocoon_simulator # also their executables' names
mkdir -p "$DEMO_DIR"
STATE_DIR="$DEMO_DIR" # where lib.sh's start_daemon/stop_daemon keep pid files and logs

if [[ "${1:-up}" == "down" ]]; then
  demo_procs "$DEMO_DIR"/*.pid "$CLUSTER_DIR"/*.pid "$DEMO_DIR/node-cluster"/*.pid
  stop_daemon "$SIMULATOR"
  stop_daemon "$SERVER"
  [[ -d "$CLUSTER_DIR" ]] && bash "$HACK_DIR/cluster-down.sh" "$CLUSTER_DIR"
  # `make demo NODE=1` (hack/demo-node.sh) shares this directory and this command.
  [[ -d "$DEMO_DIR/node-cluster" ]] && bash "$HACK_DIR/demo-node.sh" down
  # The webhook certificate goes with the cluster's CA that signed it; the next
  # `make demo` issues a new one.
  rm -f "$DEMO_DIR/ports" "$DEMO_DIR/tls.crt" "$DEMO_DIR/tls.key"
  if [[ "$DEMO_PROCS" == nothing ]]; then
    say "nothing of the demo was running (logs kept in $DEMO_DIR)"
  else
    say "demo stopped: $DEMO_PROCS; nothing of it runs now (logs kept in $DEMO_DIR)"
  fi
  exit 0
fi
[[ "${1:-up}" == "up" ]] || die "usage: hack/demo.sh [up|down]"

# port VAR OUT: sets OUT to the port the user gave in VAR (refused if taken), else a free one.
port() {
  local given="${!1:-}" p
  if [[ -n "$given" ]]; then
    [[ "$given" =~ ^[0-9]+$ ]] || die "$1=$given is not a port"
    ! port_in_use "$given" || die "$1=$given: another program listens on 127.0.0.1:$given; pick another port, or unset $1 for a free one"
    p="$given"
  else
    p="$(free_port)"
  fi
  TAKEN_PORTS+="$p "
  printf -v "$2" '%s' "$p"
}

# alive NAME: dies with the end of NAME's log if its process has exited.
alive() {
  daemon_pid "$1" >/dev/null && return 0
  echo "---- last lines of $DEMO_DIR/$1.log:" >&2
  tail -n 20 "$DEMO_DIR/$1.log" >&2 || true
  die "$1 exited; see $DEMO_DIR/$1.log"
}

say "1/6  building the server and the vk-cocoon simulator (cached after the first run)"
(cd "$ROOT" && cargo build --quiet --bin "$SERVER" --example "$SIMULATOR")
BIN="$CARGO_TARGET_DIR/debug/$SERVER"
SIM="$CARGO_TARGET_DIR/debug/examples/$SIMULATOR"

say "2/6  starting a local control plane: etcd, kube-apiserver, an OCI registry (first run: builds them, ~7 min)"
demo_cluster_up "the control plane" "$CLUSTER_DIR"
say "     kube-apiserver $COCOON_K8S_VERSION at $COCOON_APISERVER_URL, registry at $COCOON_REGISTRY"
"$BIN" crd | "$KUBECTL" apply --server-side -f - >/dev/null
"$KUBECTL" wait --for condition=Established crd/cocoonhibernations.cocoonset.cocoonstack.io --timeout=30s >/dev/null

say "3/6  webhook serving certificate for 127.0.0.1, signed by the cluster's CA"
# Kept while it still chains to this cluster's CA (`make demo` run again without
# `make demo-down`); issued again otherwise.
bash "$CERTS" ensure --ca "$(dirname "$COCOON_CA_CERT")" --out "$DEMO_DIR/tls" \
  --cn cocoon-hibernation-demo --ip 127.0.0.1 --dns localhost --days 30 2>&1 | sed 's/^/     /'
bash "$CERTS" check --ca "$(dirname "$COCOON_CA_CERT")" --cert "$DEMO_DIR/tls.crt" --ip 127.0.0.1 2>/dev/null ||
  die "the webhook certificate $DEMO_DIR/tls.crt does not chain to $COCOON_CA_CERT"

stop_daemon "$SIMULATOR"
stop_daemon "$SERVER"
port COCOON_DEMO_WEBHOOK_PORT WEBHOOK_PORT
port COCOON_DEMO_ADMIN_PORT ADMIN_PORT
[[ "$WEBHOOK_PORT" != "$ADMIN_PORT" ]] || die "the webhook and admin ports must differ"
echo "WEBHOOK_PORT=$WEBHOOK_PORT ADMIN_PORT=$ADMIN_PORT" >"$DEMO_DIR/ports"
say "4/6  starting the server (webhook https://127.0.0.1:$WEBHOOK_PORT, metrics http://127.0.0.1:$ADMIN_PORT/metrics)"
start_daemon "$SERVER" "$BIN" run \
  --webhook-addr "127.0.0.1:$WEBHOOK_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
  --tls-cert-file "$DEMO_DIR/tls.crt" --tls-key-file "$DEMO_DIR/tls.key" \
  --registry-base "$COCOON_REGISTRY" --registry-plain-http \
  --leader-election=true --lease-namespace default --identity "cocoon-hibernation-demo"
start_daemon "$SIMULATOR" "$SIM" --registry "$COCOON_REGISTRY" --hibernate-delay-ms 2000 --wake-delay-ms 2000
# Ready means: our own server process is alive, and it answers /readyz on its port. A
# server that cannot bind its port exits, so another program there cannot fool this.
deadline=$((SECONDS + 60))
until curl -fsS --max-time 1 "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null 2>&1; do
  alive "$SERVER"
  alive "$SIMULATOR"
  ((SECONDS < deadline)) || die "the server (pid $(daemon_pid "$SERVER")) is not ready after 60s; see $DEMO_DIR/$SERVER.log"
  sleep 0.2
done
alive "$SERVER"
if command -v ss >/dev/null; then # and the port is really its own
  ss -Hltnp "sport = :$ADMIN_PORT" | grep -q "pid=$(daemon_pid "$SERVER")," ||
    die "127.0.0.1:$ADMIN_PORT is not served by our server (pid $(daemon_pid "$SERVER"))"
fi
say "     server pid $(daemon_pid "$SERVER") ready; simulator pid $(daemon_pid "$SIMULATOR")"

CA_B64="$(base64 -w0 <"$COCOON_CA_CERT")"
"$KUBECTL" apply --server-side --force-conflicts -f - >/dev/null <<YAML
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

say "5/6  creating pod $NS/$POD (a VM-backed pod, as vk-cocoon would run it)"
# shellcheck disable=SC2119 # NODE is optional: the local demo binds the pod to no node
demo_fresh_pod

say "6/6  hibernating it (CocoonHibernation desire: Hibernate), then waking it (desire: Wake)"
demo_round_trip "alive $SERVER" "$DEMO_DIR/$SERVER.log"
demo_procs "$CLUSTER_DIR"/*.pid "$DEMO_DIR/$SERVER.pid" "$DEMO_DIR/$SIMULATOR.pid"
cat <<EOF

The demo is up and keeps running until you stop it (about $DEMO_RSS_MB MB of memory, on loopback):
  $DEMO_PROCS
Try it yourself:
  export KUBECONFIG=$KUBECONFIG
  alias kubectl=$KUBECTL
  kubectl -n $NS patch ch $POD --type merge -p '{"spec":{"desire":"Hibernate"}}'
  kubectl -n $NS get ch -w
  curl -s http://127.0.0.1:$ADMIN_PORT/metrics | grep ^cocoon_hibernation
Logs: $DEMO_DIR/$SERVER.log, $DEMO_DIR/$SIMULATOR.log
Stop everything with: make demo-down
EOF
