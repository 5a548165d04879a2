#!/usr/bin/env bash
# The kubectl plugin as users get it: `make plugin`, `make plugin-dist`, and the krew test.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${COCOON_CACHE:-$HOME/.cache/cocoon-hibernation}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_ROOT/target}"
KREW_VERSION="${KREW_VERSION:-v0.4.3}"
LOG_TAG=plugin
# shellcheck source=hack/lib.sh
source "$ROOT/hack/lib.sh"

usage() {
  cat <<EOF
usage: hack/plugin.sh [build [DIR] | dist [DIR] | krew-test | --help]

  build [DIR]  (make plugin) the release kubectl-cocoon, copied into DIR
               (default \$PLUGIN_DIR, else $CACHE_ROOT/plugin); prints where it is and the
               line that puts it on PATH.
  dist [DIR]   (make plugin-dist) DIR (default $CACHE_ROOT/plugin-dist) gets
               kubectl-cocoon_v<version>_linux_amd64.tar.gz and cocoon.yaml, the krew
               manifest (krew/cocoon.yaml) with that tarball's sha256.
  krew-test    builds krew $KREW_VERSION from the Go module proxy (cached in
               $CACHE_ROOT/tools), installs the dist tarball with
               \`kubectl krew install --manifest --archive\` into a temporary KREW_ROOT,
               without a network (a network namespace of its own), and runs
               \`kubectl cocoon --help\` through the installed copy.
EOF
}

cargo_version() { sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1; }

release_bin() {
  log "cargo build --release -p kubectl-cocoon (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
  (cd "$ROOT" && cargo build --release --locked -p kubectl-cocoon)
  BIN="$CARGO_TARGET_DIR/release/kubectl-cocoon"
  [[ -x "$BIN" ]] || die "cargo built no $BIN"
}

build() {
  local dir="${1:-${PLUGIN_DIR:-$CACHE_ROOT/plugin}}"
  release_bin
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  install -m 0755 "$BIN" "$dir/kubectl-cocoon"
  echo "kubectl-cocoon: $dir/kubectl-cocoon"
  if [[ ":$PATH:" == *":$dir:"* ]]; then
    echo "$dir is on PATH already: kubectl cocoon --help"
  else
    echo "put it on PATH (then: kubectl cocoon --help):"
    echo "export PATH=\"$dir:\$PATH\""
  fi
}

dist() {
  local out="${1:-$CACHE_ROOT/plugin-dist}" version stage tarball sha epoch
  version="v$(cargo_version)"
  [[ "$version" != v ]] || die "no version in Cargo.toml"
  [[ "$(uname -m)" == x86_64 ]] || die "the dist tarball is linux/amd64; this machine is $(uname -m)"
  release_bin
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  stage="$out/.stage"
  rm -rf "$stage"
  mkdir -p "$stage"
  install -m 0755 "$BIN" "$stage/kubectl-cocoon"
  install -m 0644 "$ROOT/LICENSE" "$stage/LICENSE"
  tarball="$out/kubectl-cocoon_${version}_linux_amd64.tar.gz"
  # Same binary, same bytes: fixed order, owner and times, no gzip name or time.
  epoch="$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)"
  tar -C "$stage" --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    -cf - LICENSE kubectl-cocoon | gzip -n -9 >"$tarball"
  rm -rf "$stage"
  sha="$(sha256sum "$tarball" | cut -d' ' -f1)"
  sed -e "s/@VERSION@/$version/g" -e "s/@SHA256@/$sha/" "$ROOT/krew/cocoon.yaml" >"$out/cocoon.yaml"
  ! grep -q '@[A-Z0-9]*@' "$out/cocoon.yaml" || die "a placeholder is left in $out/cocoon.yaml"
  echo "tarball: $tarball"
  echo "sha256: $sha"
  echo "manifest: $out/cocoon.yaml"
}

# krew_bin: sets KREW to the cached krew binary, built from the Go module proxy if missing.
krew_bin() {
  local dir="$CACHE_ROOT/tools/krew-$KREW_VERSION"
  KREW="$dir/krew"
  [[ -x "$KREW" ]] && return 0
  command -v go >/dev/null || die "go is required to build krew (install Go >= 1.24)"
  log "building sigs.k8s.io/krew/cmd/krew@$KREW_VERSION"
  mkdir -p "$dir"
  (cd "$dir" && CGO_ENABLED=0 GOBIN="$dir" GOFLAGS=-buildvcs=false go install -trimpath \
    -ldflags="-s -w -X sigs.k8s.io/krew/internal/version.gitTag=$KREW_VERSION" \
    "sigs.k8s.io/krew/cmd/krew@$KREW_VERSION" >&2) || { rm -rf "$dir"; die "building krew failed"; }
  [[ -x "$KREW" ]] || die "go install left no $KREW"
}

krew_test() {
  local t=$SECONDS out help
  # The tests' kubectl (built and cached like the control plane), so no host kubectl is needed.
  local kube_bin
  kube_bin="$(bash "$ROOT/hack/build-control-plane.sh" | tail -n 1)" || die "hack/build-control-plane.sh failed"
  [[ -x "$kube_bin/kubectl" ]] || die "no kubectl in $kube_bin"
  command -v unshare >/dev/null || die "unshare not found: apt-get install -y util-linux"
  krew_bin
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  dist "$work/dist" >"$work/dist.out"
  export KREW_ROOT="$work/krew" KREW_NO_UPGRADE_CHECK=1
  # A network namespace of its own (loopback only, down): krew cannot reach anything.
  unshare --map-root-user --net "$KREW" install \
    --manifest="$work/dist/cocoon.yaml" \
    --archive="$work/dist/kubectl-cocoon_v$(cargo_version)_linux_amd64.tar.gz" \
    </dev/null >"$work/install.out" 2>&1 || {
    cat "$work/install.out" >&2
    die "krew install --manifest --archive failed"
  }
  # krew's receipt of the install (`krew list` needs an index, which this test has none of).
  grep -q '^  name: cocoon$' "$KREW_ROOT/receipts/cocoon.yaml" 2>/dev/null ||
    die "krew wrote no receipt for cocoon: $(cat "$work/install.out")"
  # kubectl finds the krew-installed copy, and it is the tarball's binary.
  out="$(PATH="$KREW_ROOT/bin:$kube_bin:$PATH" kubectl plugin list 2>/dev/null)" || true
  grep -qx "$KREW_ROOT/bin/kubectl-cocoon" <<<"$out" || die "kubectl plugin list does not show $KREW_ROOT/bin/kubectl-cocoon: $out"
  cmp -s "$(readlink -f "$KREW_ROOT/bin/kubectl-cocoon")" "$CARGO_TARGET_DIR/release/kubectl-cocoon" ||
    die "the installed kubectl-cocoon is not the one built"
  help="$(PATH="$KREW_ROOT/bin:$kube_bin:$PATH" kubectl cocoon --help)" || die "kubectl cocoon --help failed"
  for cmd in hibernate wake status orphans schedule; do
    grep -qE "^  $cmd " <<<"$help" || die "kubectl cocoon --help does not list $cmd: $help"
  done
  echo "plugin: krew $KREW_VERSION installed cocoon offline; kubectl cocoon --help ok in $((SECONDS - t))s"
}

case "${1:-build}" in
  build) build "${2:-}" ;;
  dist) dist "${2:-}" ;;
  krew-test) krew_test ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
