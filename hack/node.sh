#!/usr/bin/env bash
# The root-only steps of a real node for `cargo xtask cluster-up --node` (which starts and
# stops the daemons: containerd, kube-controller-manager, kube-scheduler, kubelet):
#   node.sh preflight    root and the node's packages (containerd, runc, CNI, buildah, ...)
#   node.sh network-up   the bridge, the simulated VMs' addresses on it, and one DNAT rule
#                        to the apiserver (API_PORT)
#   node.sh configs      containerd's, the CNI's and the kubelet's configs, and the pause
#                        image (REGISTRY, KUBELET_PORT, KUBELET_HEALTHZ_PORT)
#   node.sh drain        kills the pods' containers (containerd still running)
#   node.sh clean        their shims, the kubelet's mounts, the pods' network namespaces,
#                        the bridge and the DNAT rule
# The harness passes STATE_DIR, NODE_BRIDGE, NODE_IP and KUBERNETES_SERVICE_IP. Everything
# stays on one bridge (no masquerade, no default route out): nothing leaves the machine.
set -euo pipefail
LOG_TAG=node
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

: "${STATE_DIR:?set by cargo xtask cluster-up}" "${NODE_BRIDGE:?}" "${NODE_IP:?}" "${KUBERNETES_SERVICE_IP:?}"
NODE_SUBNET="${NODE_IP%.*}.0/24"
# The subnet's top /26 is the simulated VMs' (vk-sim's `set_serve_net`): local to the host,
# so a pod reaches a VM's server there; pods get addresses below it.
NODE_VMS="${NODE_IP%.*}.192/26"
NODE_POD_END="${NODE_IP%.*}.191"
NAT_CHAIN=COCOON-NODE
# Which state dir owns the bridge now.
NODE_OWNER=/run/cocoon-hibernation-node.owner
SOCK="$STATE_DIR/containerd/containerd.sock"
PKI="$STATE_DIR/pki"

preflight() {
  local missing=() tool
  for tool in containerd runc ctr buildah ip iptables busybox; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
    missing+=(containernetworking-plugins)
  ((${#missing[@]} == 0)) || die "the real node needs: ${missing[*]}. Install with:
  apt-get install -y containerd runc containernetworking-plugins buildah iproute2 iptables busybox-static"
  [[ $EUID -eq 0 ]] || die "the real node needs root (network namespaces, mounts, cgroups)"
}

ctr_k8s() { ctr --address "$SOCK" --namespace k8s.io "$@"; }

# The bridge and one DNAT rule: pods reach the apiserver at the `kubernetes` Service's
# address (what in-cluster clients use) without a kube-proxy.
network_up() {
  : "${API_PORT:?}"
  # One bridge, one address, one DNAT rule: one node cluster per machine at a time.
  local owner
  owner="$(cat "$NODE_OWNER" 2>/dev/null || true)"
  if [[ -n "$owner" && "$owner" != "$STATE_DIR" && -f "$owner/run.state" ]] &&
    grep -qs '^RUN_NODE=1' "$owner/run.state"; then
    die "another node cluster runs in $owner (make install-test and make demo NODE=1 take turns); stop it with: cargo xtask cluster-down --node $owner"
  fi
  echo "$STATE_DIR" >"$NODE_OWNER"
  if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    ip link add "$NODE_BRIDGE" type bridge
  fi
  ip addr replace "$NODE_IP/24" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  ip route replace local "$NODE_VMS" dev "$NODE_BRIDGE"
  iptables -t nat -N "$NAT_CHAIN" 2>/dev/null || iptables -t nat -F "$NAT_CHAIN"
  iptables -t nat -C PREROUTING -i "$NODE_BRIDGE" -j "$NAT_CHAIN" 2>/dev/null ||
    iptables -t nat -A PREROUTING -i "$NODE_BRIDGE" -j "$NAT_CHAIN"
  iptables -t nat -A "$NAT_CHAIN" -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "$NODE_IP:$API_PORT"
}

network_down() {
  iptables -t nat -D PREROUTING -i "$NODE_BRIDGE" -j "$NAT_CHAIN" 2>/dev/null || true
  iptables -t nat -F "$NAT_CHAIN" 2>/dev/null || true
  iptables -t nat -X "$NAT_CHAIN" 2>/dev/null || true
  ip link del "$NODE_BRIDGE" 2>/dev/null || true
  if [[ "$(cat "$NODE_OWNER" 2>/dev/null || true)" == "$STATE_DIR" ]]; then rm -f "$NODE_OWNER"; fi
}

# pause_image: the sandbox image, built from busybox-static (nothing can be pulled here).
pause_image() {
  local ref
  ref="$(IMAGE_REGISTRY="$REGISTRY" bash "$HACK_DIR/image.sh" pause 2>"$STATE_DIR/pause-image.log" |
    sed -n 's/^image: \([^ ]*\) .*/\1/p' | tail -n 1)"
  [[ -n "$ref" ]] || {
    cat "$STATE_DIR/pause-image.log" >&2
    die "hack/image.sh pause gave no image"
  }
  echo "$ref"
}

configs() {
  : "${REGISTRY:?}" "${KUBELET_PORT:?}" "${KUBELET_HEALTHZ_PORT:?}"
  local pause
  pause="$(pause_image)"
  mkdir -p "$STATE_DIR/containerd" "$STATE_DIR/cni/net.d" "$STATE_DIR/cni/ipam" "$STATE_DIR/kubelet"
  cat >"$STATE_DIR/containerd/config.toml" <<EOF
version = 2
root = "$STATE_DIR/containerd/root"
state = "$STATE_DIR/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE_DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  # This machine lacks CAP_SYS_RESOURCE: a negative oom_score_adj for the sandbox fails.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE_DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."$REGISTRY"]
    endpoint = ["http://$REGISTRY"]
EOF
  # No ipMasq and no default route: pods reach the bridge's subnet and the host only.
  cat >"$STATE_DIR/cni/net.d/10-cocoon.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cocoon-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$NODE_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$NODE_SUBNET", "gateway": "$NODE_IP", "rangeEnd": "$NODE_POD_END"}]],
        "routes": [{"dst": "$KUBERNETES_SERVICE_IP/32"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
  cat >"$STATE_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
# No KUBE-FIREWALL or canary chains in the host's iptables: nothing here needs them, and
# they would outlive the node (cluster-down removes only the harness's own NAT chain).
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: AlwaysAllow}
serializeImagePulls: false
# The machine's disk is shared with the build caches; do not evict pods over it.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
resolvConf: ""
EOF
}

# Containers outlive containerd (their shims keep running): they go first.
drain() {
  local id
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  sleep 0.5
  for id in $(ctr_k8s tasks ls -q 2>/dev/null); do ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true; done
}

# After the daemons: their shims, what the kubelet mounted and the network, so nothing of
# the node stays behind.
clean() {
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null || true
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    findmnt -rn -o TARGET | grep -F "$STATE_DIR/" | sort -r
  )
  local ns
  for ns in /run/netns/cni-*; do
    [[ -e "$ns" ]] || continue
    ip netns delete "$(basename "$ns")" 2>/dev/null || true
  done
  network_down
}

case "${1:-}" in
  preflight) preflight ;;
  network-up) network_up ;;
  configs) configs ;;
  drain) drain ;;
  clean) clean ;;
  *) die "usage: hack/node.sh preflight|network-up|configs|drain|clean (run by cargo xtask cluster-up --node)" ;;
esac
