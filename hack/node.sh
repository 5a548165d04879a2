# A real node for hack/cluster-up.sh --node: containerd + runc + a CNI bridge from Debian,
# and kubelet, kube-controller-manager and kube-scheduler built like kube-apiserver.
# Source it after lib.sh; do not run it. Everything stays on one bridge the harness makes
# (no masquerade, no default route out): nothing leaves the machine.
# shellcheck shell=bash

NODE_BRIDGE="${COCOON_NODE_BRIDGE:-cocoon0}"
# The bridge's own address; pods get the rest of the /24. 10.0.0.0/24 is the Service range.
NODE_IP="${COCOON_NODE_IP:-10.77.0.1}"
NODE_SUBNET="${NODE_IP%.*}.0/24"
NODE_NAME=cocoon-node
# The node the vk-cocoon simulator registers; VM pods are bound to it, never to the kubelet.
# shellcheck disable=SC2034 # cluster-up.sh writes it to the env file
VIRTUAL_NODE=vk-cocoon
KUBERNETES_SERVICE_IP=10.0.0.1
NODE_DAEMONS=(containerd kube-controller-manager kube-scheduler kubelet)
NAT_CHAIN=COCOON-NODE
# Which state dir owns the bridge now.
NODE_OWNER=/run/cocoon-hibernation-node.owner

node_preflight() {
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

node_sock() { echo "$STATE_DIR/containerd/containerd.sock"; }
node_ctr() { ctr --address "$(node_sock)" --namespace k8s.io "$@"; }

# The bridge and one DNAT rule: pods reach the apiserver at the `kubernetes` Service's
# address (what in-cluster clients use) without a kube-proxy.
node_network_up() {
  # One bridge, one address, one DNAT rule: one node cluster per machine at a time.
  local owner
  owner="$(cat "$NODE_OWNER" 2>/dev/null || true)"
  if [[ -n "$owner" && "$owner" != "$STATE_DIR" && -f "$owner/run.state" ]] &&
    grep -qs '^RUN_NODE=1' "$owner/run.state"; then
    die "another node cluster runs in $owner (make install-test and make demo NODE=1 take turns); stop it with: bash hack/cluster-down.sh --node $owner"
  fi
  echo "$STATE_DIR" >"$NODE_OWNER"
  if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    ip link add "$NODE_BRIDGE" type bridge
  fi
  ip addr replace "$NODE_IP/24" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  iptables -t nat -N "$NAT_CHAIN" 2>/dev/null || iptables -t nat -F "$NAT_CHAIN"
  iptables -t nat -C PREROUTING -i "$NODE_BRIDGE" -j "$NAT_CHAIN" 2>/dev/null ||
    iptables -t nat -A PREROUTING -i "$NODE_BRIDGE" -j "$NAT_CHAIN"
  iptables -t nat -A "$NAT_CHAIN" -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "$NODE_IP:$API_PORT"
}

node_network_down() {
  iptables -t nat -D PREROUTING -i "$NODE_BRIDGE" -j "$NAT_CHAIN" 2>/dev/null || true
  iptables -t nat -F "$NAT_CHAIN" 2>/dev/null || true
  iptables -t nat -X "$NAT_CHAIN" 2>/dev/null || true
  ip link del "$NODE_BRIDGE" 2>/dev/null || true
  if [[ "$(cat "$NODE_OWNER" 2>/dev/null || true)" == "$STATE_DIR" ]]; then rm -f "$NODE_OWNER"; fi
}

write_node_configs() {
  local pause="$1"
  mkdir -p "$STATE_DIR/containerd" "$STATE_DIR/cni/net.d" "$STATE_DIR/cni/ipam" "$STATE_DIR/kubelet"
  cat >"$STATE_DIR/containerd/config.toml" <<EOF
version = 2
root = "$STATE_DIR/containerd/root"
state = "$STATE_DIR/containerd/state"
[grpc]
  address = "$(node_sock)"
[ttrpc]
  address = "$(node_sock).ttrpc"
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
        "ranges": [[{"subnet": "$NODE_SUBNET", "gateway": "$NODE_IP"}]],
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
# they would outlive the node (cluster-down.sh removes only the harness's own NAT chain).
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://$(node_sock)
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

start_node() {
  node_preflight
  node_network_up
  KUBELET_PORT="$(free_port)"
  KUBELET_HEALTHZ_PORT="$(free_port)"
  local pause
  pause="$(pause_image)"
  write_node_configs "$pause"
  start_daemon containerd containerd --config "$STATE_DIR/containerd/config.toml"
  wait_until 30 containerd node_ctr version || die "containerd not up after 30s (see $STATE_DIR/containerd.log)"

  local kc="$KUBECONFIG_FILE"
  start_daemon kube-controller-manager "$BIN_DIR/kube-controller-manager" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$(free_port)" --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key"
  start_daemon kube-scheduler "$BIN_DIR/kube-scheduler" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --secure-port="$(free_port)" --leader-elect=false
  start_daemon kubelet "$BIN_DIR/kubelet" \
    --config="$STATE_DIR/kubelet/config.yaml" --kubeconfig="$kc" \
    --root-dir="$STATE_DIR/kubelet/root" --cert-dir="$STATE_DIR/kubelet/pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP"
  wait_until 120 "node $NODE_NAME Ready" node_ready ||
    die "node $NODE_NAME not Ready after 120s (see $STATE_DIR/kubelet.log, $STATE_DIR/containerd.log)"
  wait_until 60 "default ServiceAccount" curl_api /api/v1/namespaces/default/serviceaccounts/default ||
    die "no default ServiceAccount after 60s (see $STATE_DIR/kube-controller-manager.log)"
}

node_ready() {
  curl_api "/api/v1/nodes/$NODE_NAME" |
    python3 -c 'import json,sys; c=[x for x in json.load(sys.stdin)["status"]["conditions"] if x["type"]=="Ready"]; sys.exit(0 if c and c[0]["status"]=="True" else 1)'
}

# Containers outlive containerd (their shims keep running): kill them first, then unmount
# what the kubelet mounted and drop the network, so nothing of the node stays behind.
stop_node() {
  if daemon_pid containerd >/dev/null; then
    local id
    for id in $(node_ctr tasks ls -q 2>/dev/null); do node_ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 0.5
    for id in $(node_ctr tasks ls -q 2>/dev/null); do node_ctr tasks delete -f "$id" >/dev/null 2>&1 || true; done
  fi
  local d i
  for ((i = ${#NODE_DAEMONS[@]} - 1; i >= 0; i--)); do
    d="${NODE_DAEMONS[$i]}"
    stop_daemon "$d"
  done
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $(node_sock)" 2>/dev/null || true
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    findmnt -rn -o TARGET | grep -F "$STATE_DIR/" | sort -r
  )
  local ns
  for ns in /run/netns/cni-*; do
    [[ -e "$ns" ]] || continue
    ip netns delete "$(basename "$ns")" 2>/dev/null || true
  done
  node_network_down
}
