#!/usr/bin/env bash
# The machine's prerequisites, one list for `make test-unit`, `make demo`, `make demo NODE=1`
# (and `make install-test`) and `make test` (so also .ci/run):
#   hack/prereqs.sh unit|demo|node|test
# The toolchains (Rust, Go, a C compiler, git) are checked; Rust and Go are never
# installed here, since Debian's are older than the build needs. Missing Debian packages
# are installed when run as root, else the one `apt-get` line to run is printed and the
# script fails. COCOON_APT=print prints that line and fails even as root (installs nothing).
# Debian's docker-registry package starts a registry service on :5000 (no auth); the tests
# and demos run their own on free ports, so when this script installs the package it
# stops and disables that service again.
set -euo pipefail
LOG_TAG=prereqs
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUST_MIN="$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$HACK_DIR/../Cargo.toml")"
[[ -n "$RUST_MIN" ]] || die "Cargo.toml names no rust-version"
# The highest `go` directive of what the first run builds: promtool v0.316.0 (make test's
# chart checks) says 1.26.7; etcd v3.6.16 and helm v3.21.4 say 1.26.0.
GO_MIN=1.26.7

what="${1:-}"
case "$what" in
  unit) for_what="make test-unit" ;;
  demo) for_what="make demo" ;;
  node) for_what="make demo NODE=1 and make install-test" ;;
  test) for_what="make test" ;;
  bench) for_what="make bench" ;;
  *) die "usage: hack/prereqs.sh unit|demo|node|test|bench" ;;
esac

# version_ge A B: A >= B for dotted versions.
version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" == "$2" ]]; }

rustc_version="$(rustc --version 2>/dev/null | awk '{print $2}')" || true
[[ -n "$rustc_version" ]] ||
  die "Rust >= $RUST_MIN is needed and rustc is not on PATH. Install rustup (rustup.rs), then: rustup toolchain install stable"
version_ge "$rustc_version" "$RUST_MIN" ||
  die "Rust >= $RUST_MIN is needed; rustc on PATH is $rustc_version (Debian's is older). With rustup: rustup toolchain install stable && rustup default stable"
if [[ "$what" != unit && -z "${KUBEBUILDER_ASSETS:-}" ]]; then
  go_version="$(go env GOVERSION 2>/dev/null)" || true
  go_version="${go_version#go}"
  [[ -n "$go_version" ]] ||
    die "Go >= $GO_MIN is needed (the first run builds kube-apiserver, etcd and helm) and go is not on PATH. Install it from go.dev/dl"
  # Go >= 1.21 with GOTOOLCHAIN=auto fetches the toolchain a go.mod asks for by itself.
  go_auto=0
  [[ "$(go env GOTOOLCHAIN 2>/dev/null)" == *auto ]] && version_ge "$go_version" 1.21 && go_auto=1
  ((go_auto)) || version_ge "$go_version" "$GO_MIN" ||
    die "Go >= $GO_MIN is needed; go on PATH is $go_version (Debian's is older). Install it from go.dev/dl, or set GOTOOLCHAIN=auto"
fi

pkgs=()
# need COMMAND PACKAGE: PACKAGE is missing unless COMMAND is on PATH (or, with a slash, is
# a file).
need() {
  if [[ "$1" == */* ]]; then [[ -e "$1" ]]; else command -v "$1" >/dev/null; fi && return 0
  [[ " ${pkgs[*]} " == *" $2 "* ]] || pkgs+=("$2")
}
# ring (rustls' crypto) compiles C.
need cc gcc
need cc libc6-dev
need docker-registry docker-registry
if [[ "$what" == unit || "$what" == test ]]; then
  need htpasswd apache2-utils
fi
# The control plane (`cargo xtask cluster-up`, certs/certs.sh) and the scripts around it.
if [[ "$what" != unit ]]; then
  need git git
  need curl curl
  need openssl openssl
  need /etc/ssl/certs/ca-certificates.crt ca-certificates
  need flock util-linux
  need setsid util-linux
  need pkill procps
  need ss iproute2
fi
if [[ "$what" == node || "$what" == test ]]; then
  need python3 python3
  need findmnt util-linux
  need buildah buildah
  need containerd containerd
  need ctr containerd
  need runc runc
  need /usr/lib/cni/bridge containernetworking-plugins
  need busybox busybox-static
  need iptables iptables
  need ip iproute2
fi
# The bench's proxy part measures Debian's nginx beside the wake proxy.
if [[ "$what" == bench ]]; then
  need /usr/sbin/nginx nginx-light
fi
# The chart checks read YAML with the python3 first on PATH. Debian's python3-yaml serves
# /usr/bin/python3; another python3 (pyenv, a venv) gets PyYAML from pip below.
pip_yaml=0
if [[ "$what" == test ]]; then
  # make test's quality gates run shellcheck over every shell script.
  need shellcheck shellcheck
  need python3 python3
  if ! python3 -c 'import yaml' 2>/dev/null; then
    if [[ "$(command -v python3 || true)" == /usr/bin/python3 || ! -x "$(command -v python3 || true)" ]]; then
      pkgs+=(python3-yaml)
    else
      pip_yaml=1
    fi
  fi
fi

registry_installed_now=0
if ((${#pkgs[@]})); then
  line="apt-get update && apt-get install -y ${pkgs[*]}"
  if [[ $EUID -ne 0 || "${COCOON_APT:-}" == print ]] || ! command -v apt-get >/dev/null; then
    log "missing for $for_what: ${pkgs[*]}"
    log "run as root: $line"
    ((pip_yaml == 0)) || log "and: python3 -m pip install pyyaml"
    exit 1
  fi
  [[ " ${pkgs[*]} " == *" docker-registry "* ]] && registry_installed_now=1
  log "installing: ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
if ((pip_yaml)); then
  [[ "${COCOON_APT:-}" != print ]] || die "python3 ($(command -v python3)) cannot import yaml; run: python3 -m pip install pyyaml"
  log "installing PyYAML for $(command -v python3) with pip"
  python3 -m pip install -q pyyaml
fi

# Debian's registry service: stopped and disabled when installed just now (or on CI);
# one installed before is left alone, with a word that it is not needed.
service_active() {
  if [[ -d /run/systemd/system ]]; then
    systemctl is-active --quiet docker-registry 2>/dev/null
  else
    [[ -x /etc/init.d/docker-registry ]] && /etc/init.d/docker-registry status >/dev/null 2>&1
  fi
}
if ((registry_installed_now)) || [[ "${CI:-}" == true && $EUID -eq 0 ]]; then
  if [[ -d /run/systemd/system ]]; then
    systemctl disable --now --quiet docker-registry 2>/dev/null || true
  elif [[ -x /etc/init.d/docker-registry ]]; then
    /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
    update-rc.d docker-registry disable >/dev/null 2>&1 || true
  fi
  ! service_active || die "Debian's docker-registry service still runs on :5000; stop it: systemctl disable --now docker-registry"
  ((registry_installed_now == 0)) || log "stopped and disabled Debian's docker-registry service (:5000); the tests run their own registries"
elif service_active; then
  log "note: Debian's docker-registry service runs on :5000 (open, unauthenticated); nothing here uses it. Stop it: systemctl disable --now docker-registry"
fi
log "ready for $for_what"
