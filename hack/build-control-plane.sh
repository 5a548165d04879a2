#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd from the Go module proxy into a cache outside
# the repo, keyed by version. Existing binaries in KUBEBUILDER_ASSETS win.
# --node also builds what a real node needs: kubelet, kube-controller-manager and
# kube-scheduler (from the same wrapper module; about 1.5 min with a warm module cache).
# Prints the directory holding the binaries on its last line.
set -euo pipefail

NODE=0
if [[ "${1:-}" == --node ]]; then NODE=1; fi
NODE_BINARIES=(kubelet kube-controller-manager kube-scheduler)
K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${COCOON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-hibernation}"
OUT="$CACHE_ROOT/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"

log() { echo "[build-control-plane] $*" >&2; }

have_all() {
  local dir="$1" b
  [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" && -x "$dir/kubectl" ]] || return 1
  if ((NODE)); then
    for b in "${NODE_BINARIES[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
  fi
}

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  if have_all "$KUBEBUILDER_ASSETS"; then
    log "using KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    echo "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks kube-apiserver, etcd or kubectl; building instead"
fi

if have_all "$OUT"; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { log "go is required to build kube-apiserver and etcd (install Go >= 1.24)"; exit 1; }
mkdir -p "$OUT"
work="$CACHE_ROOT/build"
mkdir -p "$work"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod"

build_kubernetes() {
  local dir="$work/kubernetes-$K8S_VERSION"
  local staging="v0.${K8S_VERSION#v1.}"
  mkdir -p "$dir"
  local upstream_mod
  upstream_mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [[ -f "$upstream_mod" ]] || { log "cannot download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  local go_line godebug_line
  go_line=$(grep -m1 -E '^go [0-9]' "$upstream_mod")
  godebug_line=$(grep -m1 -E '^godebug ' "$upstream_mod" || true)
  {
    echo "module local/kubernetes-build"
    echo
    echo "$go_line"
    [[ -n "$godebug_line" ]] && echo "$godebug_line"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # Each staging module upstream maps to ./staging maps here to its published v0.x.y.
    grep -oE 'k8s.io/[a-z0-9-]+ => ./staging/src/k8s.io/[a-z0-9-]+' "$upstream_mod" |
      awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  (cd "$dir" && go mod tidy >/dev/null 2>&1) || true
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  local cmd wanted=(kube-apiserver kubectl)
  ((NODE)) && wanted+=("${NODE_BINARIES[@]}")
  for cmd in "${wanted[@]}"; do
    [[ -x "$OUT/$cmd" ]] && continue
    log "building $cmd $K8S_VERSION (slow on a cold cache)"
    (cd "$dir" && go build -trimpath -ldflags "$ld" -o "$OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
}

build_etcd() {
  local dir="$work/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  cat >"$dir/go.mod" <<GOMOD
module local/etcd-build

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  (cd "$dir" && go mod tidy >/dev/null 2>&1) || true
  log "building etcd $ETCD_VERSION"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3)
}

[[ -x "$OUT/etcd" ]] || build_etcd
have_all "$OUT" || build_kubernetes
have_all "$OUT" || { log "build finished without all binaries in $OUT"; exit 1; }
log "built into $OUT"
echo "$OUT"
