# Shared by hack/demo.sh and hack/demo-node.sh (and the image step of hack/install-test.sh).
# Source it after lib.sh; do not run it.
# shellcheck shell=bash

say() { echo "$(date -u +%H:%M:%S)  $*"; }

# push_image: `make image` into $COCOON_REGISTRY; sets IMAGE_REPO, IMAGE_DIGEST, IMAGE_REF
# (repo@digest) and IMAGE_MB from its last line. Its log goes to $1 (default: stderr).
push_image() {
  local log="${1:-}" line
  # Without a log file, stderr as it is: `2>/dev/stderr` would reopen it and, when it is a
  # file (a CI log), truncate what was written to it so far.
  if [[ -n "$log" ]]; then
    line="$(IMAGE_REGISTRY="$COCOON_REGISTRY" bash "$HACK_DIR/image.sh" build 2>"$log" | tail -n 1)" ||
      { cat "$log" >&2; die "make image failed"; }
  else
    line="$(IMAGE_REGISTRY="$COCOON_REGISTRY" bash "$HACK_DIR/image.sh" build | tail -n 1)" ||
      die "make image failed"
  fi
  local pushed='^image: ([^ @]+):[^ @]+@(sha256:[0-9a-f]{64}) size_mb=([0-9.]+)$'
  [[ "$line" =~ $pushed ]] || die "make image printed no pushed reference: $line"
  # shellcheck disable=SC2034 # read by the scripts that source this file
  IMAGE_REPO="${BASH_REMATCH[1]}" IMAGE_DIGEST="${BASH_REMATCH[2]}" IMAGE_MB="${BASH_REMATCH[3]}"
  # shellcheck disable=SC2034
  IMAGE_REF="${BASH_REMATCH[1]}@${BASH_REMATCH[2]}" IMAGE_LINE="$line"
}

# demo_round_trip ALIVE HINT: the demo's last step. Creates CocoonHibernation $NS/$POD with
# desire Hibernate, then flips it to Wake, printing each phase as it changes. ALIVE is a
# command that dies when a process the demo needs has exited; HINT says where to look when
# a phase does not come within 90 s.
demo_round_trip() {
  local alive_check="$1" hint="$2" start=$SECONDS
  "$KUBECTL" -n "$NS" apply -f - >/dev/null <<YAML
apiVersion: cocoonset.cocoonstack.io/v1
kind: CocoonHibernation
metadata:
  name: $POD
spec:
  podRef: { name: $POD }
  desire: Hibernate
YAML
  demo_watch_until Hibernated "$alive_check" "$hint"
  "$KUBECTL" -n "$NS" patch ch "$POD" --type merge -p '{"spec":{"desire":"Wake"}}' >/dev/null
  demo_watch_until Active "$alive_check" "$hint"
  say "     round trip took $((SECONDS - start))s"
  echo
  "$KUBECTL" -n "$NS" get ch
}

demo_watch_until() {
  local want="$1" alive_check="$2" hint="$3" last="" now deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    $alive_check
    now="$("$KUBECTL" -n "$NS" get ch "$POD" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
    if [[ -n "$now" && "$now" != "$last" ]]; then
      echo "$(date -u +%H:%M:%S.%3N)     $NS/$POD  ${now}"
      last="$now"
    fi
    [[ "$now" == "$want" ]] && return 0
    sleep 0.2
  done
  die "$NS/$POD did not reach $want in 90s; see $hint"
}

# demo_cluster_up WHAT ARGS...: hack/cluster-up.sh ARGS (its log in $DEMO_DIR/cluster-up.log),
# then its environment exported into this shell and KUBECTL set. WHAT names it in the error.
demo_cluster_up() {
  local what="$1" env_file
  shift
  env_file="$(bash "$HACK_DIR/cluster-up.sh" "$@" 2>"$DEMO_DIR/cluster-up.log" | tail -n 1)" ||
    { cat "$DEMO_DIR/cluster-up.log" >&2; die "$what did not start"; }
  set -a
  # shellcheck disable=SC1090
  source "$env_file"
  set +a
  KUBECTL="$COCOON_BIN_DIR/kubectl"
}

# demo_fresh_pod [NODE]: pod $NS/$POD recreated as vk-cocoon would run it (a fresh VMID, state
# ready), bound to NODE when given, with any CocoonHibernation left by an earlier run gone.
demo_fresh_pod() {
  local node_line=""
  [[ -n "${1:-}" ]] && node_line="  nodeName: $1"
  "$KUBECTL" create namespace "$NS" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
  "$KUBECTL" -n "$NS" delete ch "$POD" --ignore-not-found --wait=true >/dev/null
  "$KUBECTL" -n "$NS" delete pod "$POD" --ignore-not-found --grace-period=0 --force >/dev/null 2>&1
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
$node_line
  containers:
    - name: vm
      image: cocoon/vm:demo
YAML
}

# demo_procs PIDFILE...: sets DEMO_PROCS ("name (pid), …" of those still running, or
# "nothing") and DEMO_RSS_MB (their resident memory), so the demo can say what it leaves
# running and what `make demo-down` stopped.
demo_procs() {
  local f pid rss kb=0 list=()
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    pid="$(cat "$f" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    kill -0 "$pid" 2>/dev/null || continue
    rss="$(ps -o rss= -p "$pid" 2>/dev/null || true)"
    kb=$((kb + ${rss:-0}))
    list+=("$(basename "$f" .pid) ($pid)")
  done
  DEMO_PROCS="nothing"
  if ((${#list[@]})); then
    DEMO_PROCS="$(printf '%s, ' "${list[@]}")"
    DEMO_PROCS="${DEMO_PROCS%, }"
  fi
  # shellcheck disable=SC2034 # read by the scripts that source this file
  DEMO_RSS_MB=$((kb / 1024))
}
