#!/usr/bin/env bash
# `make demo NODE=1`: the product the way users run it. A real single-node cluster
# (hack/cluster-up.sh --node: kubelet, containerd, CNI), the image from `make image`
# installed with the Helm chart (two replicas, one leading), the vk-cocoon simulator on
# its virtual node, and pod demo/web-0 hibernated and woken through its CocoonHibernation.
# Leaves everything running; `make demo-down` stops it. Needs root.
set -euo pipefail
LOG_TAG=demo-node
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=hack/demo-lib.sh
source "$HACK_DIR/demo-lib.sh"
ROOT="$(cd "$HACK_DIR/.." && pwd)"
DEMO_DIR="${COCOON_DEMO_DIR:-$HOME/.cache/cocoon-hibernation/demo}"
NODE_DIR="$DEMO_DIR/node-cluster"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
NS=demo POD=web-0 RELEASE=cocoon-hibernation RELEASE_NS=cocoon-system
SIMULATOR=vk_cocoon_simulator
mkdir -p "$DEMO_DIR"
STATE_DIR="$DEMO_DIR" # lib.sh's start_daemon/stop_daemon keep the simulator's pid here

if [[ "${1:-up}" == down ]]; then
  stop_daemon "$SIMULATOR"
  [[ -d "$NODE_DIR" ]] && bash "$HACK_DIR/cluster-down.sh" --node "$NODE_DIR"
  exit 0
fi

say "1/6  building the vk-cocoon simulator and the helm tooling (cached after the first run)"
(cd "$ROOT" && cargo build --quiet --example "$SIMULATOR")
TOOLS_BIN="$(bash "$HACK_DIR/install-tools.sh" 2>"$DEMO_DIR/install-tools.log" | tail -n 1)" ||
  { cat "$DEMO_DIR/install-tools.log" >&2; die "hack/install-tools.sh failed"; }
HELM="$TOOLS_BIN/helm"

say "2/6  starting a real node: etcd, kube-apiserver, controller-manager, scheduler, kubelet, containerd, a registry"
demo_cluster_up "the node cluster" --node "$NODE_DIR"
say "     kube-apiserver $COCOON_K8S_VERSION at $COCOON_APISERVER_URL, node $COCOON_NODE_NAME, registry $COCOON_REGISTRY"

say "3/6  make image: the product image, pushed to that registry (first run: a release build)"
push_image "$DEMO_DIR/image.log"
say "     ${IMAGE_LINE#image: }"

say "4/6  helm install $RELEASE (two replicas; waits until they are Ready)"
"$HELM" upgrade --install "$RELEASE" "$ROOT/charts/cocoon-hibernation" -n "$RELEASE_NS" --create-namespace \
  --set image.repository="$IMAGE_REPO" --set image.digest="$IMAGE_DIGEST" \
  --set registry.base="$COCOON_REGISTRY" --set registry.plainHTTP=true \
  --set 'vmIdentityPolicy.allowedUsernames={admin}' \
  --wait --timeout 180s >"$DEMO_DIR/helm.log" 2>&1 ||
  { tail -n 20 "$DEMO_DIR/helm.log" >&2; "$KUBECTL" -n "$RELEASE_NS" get pods >&2 || true; die "helm install failed"; }
"$KUBECTL" -n "$RELEASE_NS" get pods -o wide | sed 's/^/     /'

say "5/6  starting the vk-cocoon simulator (virtual node $COCOON_VIRTUAL_NODE) and pod $NS/$POD on it"
stop_daemon "$SIMULATOR"
start_daemon "$SIMULATOR" "$CARGO_TARGET_DIR/debug/examples/$SIMULATOR" --registry "$COCOON_REGISTRY" \
  --virtual-node "$COCOON_VIRTUAL_NODE" --hibernate-delay-ms 2000 --wake-delay-ms 2000
demo_fresh_pod "$COCOON_VIRTUAL_NODE"

simulator_alive() {
  daemon_pid "$SIMULATOR" >/dev/null || die "the simulator exited; see $DEMO_DIR/$SIMULATOR.log"
}
say "6/6  hibernating it (desire: Hibernate), then waking it (desire: Wake)"
demo_round_trip simulator_alive "$KUBECTL -n $RELEASE_NS logs deploy/$RELEASE"
demo_procs "$NODE_DIR"/*.pid "$DEMO_DIR/$SIMULATOR.pid"
cat <<EOF

The demo runs on a real node and keeps running until you stop it (about $DEMO_RSS_MB MB of
memory plus the pods; the bridge ${COCOON_NODE_BRIDGE:-cocoon0} and one NAT rule on this host, see hack/README.md):
  $DEMO_PROCS
Try it yourself:
  export KUBECONFIG=$KUBECONFIG
  alias kubectl=$KUBECTL
  kubectl -n $RELEASE_NS get pods,lease                  # two replicas; the Lease names the leader
  kubectl -n $RELEASE_NS logs deploy/$RELEASE
  kubectl -n $NS patch ch $POD --type merge -p '{"spec":{"desire":"Hibernate"}}'
  kubectl -n $NS get ch -w
  $HELM -n $RELEASE_NS upgrade $RELEASE $ROOT/charts/cocoon-hibernation --reuse-values --set podAnnotations.rolled=\$(date +%s) --wait
Logs: $NODE_DIR/*.log, $DEMO_DIR/$SIMULATOR.log
Stop everything with: make demo-down
EOF
