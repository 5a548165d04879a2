#!/usr/bin/env bash
# Builds (and pushes) the product image without a daemon: `make image`. See usage below.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${COCOON_CACHE:-$HOME/.cache/cocoon-hibernation}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_ROOT/target}"
IMAGE_DIR="$CACHE_ROOT/image"
BUILDAH_DIR="$CACHE_ROOT/buildah"

usage() {
  cat <<EOF
usage: hack/image.sh [build | pause | stage DIR | --help]

  build (default)  cargo build --release (the server and the kubectl plugin), stage a
                   minimal root filesystem and build ./Dockerfile from it with buildah (FROM scratch);
                   push it when a registry is known. Writes the pushed reference to
                   $IMAGE_DIR/ref.
  pause            the node harness's pause image (Debian's busybox-static,
                   hack/pause.Dockerfile); reference in $IMAGE_DIR/pause-ref.
  stage DIR        only stage the root filesystem into DIR/rootfs (what build copies).

The last line of build and pause is
  image: <repo>:<tag>@sha256:<digest> size_mb=<uncompressed MB>
(without @sha256:... when nothing was pushed).

Environment:
  IMAGE_REPO       repository to push to (default <registry>/cocoon-hibernation, and
                   <registry>/pause for the pause image)
  IMAGE_REGISTRY   registry host[:port]; default COCOON_REGISTRY from the cluster env file
                   \${COCOON_CLUSTER_ENV:-$CACHE_ROOT/cluster/env} if it exists.
                   Neither set: build only, nothing is pushed.
  IMAGE_TAG        tag (default the Cargo version, plus -<short rev>-dirty when the tree
                   has uncommitted changes)
  IMAGE_BIN        stage this binary instead of building the release binary
  IMAGE_PLUGIN_BIN with IMAGE_BIN, the kubectl-cocoon to stage (default: the one beside
                   IMAGE_BIN); the image holds it as /usr/local/bin/kubectl-cocoon
  SOURCE_DATE_EPOCH  image and file timestamps (default: the HEAD commit's time), so the
                   same binary gives the same digest
Needs buildah (apt-get install buildah), run as root. Storage (driver vfs) lives in
$BUILDAH_DIR. TLS is verified except for loopback and private (RFC 1918) registries,
which are reached with --tls-verify=false (plain http allowed).
EOF
}

log() { echo "[image] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# The one buildah setup: a private store, no daemon, nothing from /etc/containers but the
# signature policy (written here, so a host without containers-common works too).
bah() {
  buildah --root "$BUILDAH_DIR/root" --runroot "$BUILDAH_DIR/run" --storage-driver vfs "$@"
}
buildah_setup() {
  command -v buildah >/dev/null || die "buildah not found: apt-get install -y buildah"
  mkdir -p "$BUILDAH_DIR" "$IMAGE_DIR"
  POLICY="$BUILDAH_DIR/policy.json"
  [[ -f "$POLICY" ]] || echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$POLICY"
  if [[ -z "${SOURCE_DATE_EPOCH:-}" ]]; then
    SOURCE_DATE_EPOCH="$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)"
  fi
}

# registry_host: IMAGE_REGISTRY, else COCOON_REGISTRY from the cluster env file, else "".
registry_host() {
  if [[ -n "${IMAGE_REGISTRY:-}" ]]; then
    echo "$IMAGE_REGISTRY"
    return
  fi
  local env_file="${COCOON_CLUSTER_ENV:-$CACHE_ROOT/cluster/env}"
  [[ -f "$env_file" ]] || return 0
  sed -n 's/^COCOON_REGISTRY=//p' "$env_file" | tail -n 1
}

# tls_verify REPO: false only for loopback and private addresses (a local plain-http registry).
tls_verify() {
  local host="${1%%/*}"
  host="${host%:*}"
  host="${host#[}" host="${host%]}"
  case "$host" in
    localhost | 127.* | ::1 | 10.* | 192.168.* | 172.1[6-9].* | 172.2[0-9].* | 172.3[01].*) echo false ;;
    *) echo true ;;
  esac
}

# image_holds_plugin REF PLUGIN: the built image has PLUGIN, byte for byte, at the path
# the docs name (docs/install.md, "kubectl plugin").
image_holds_plugin() {
  local ref="$1" plugin="$2" ctr mnt ok=0
  ctr="$(bah from --pull=never --signature-policy "$POLICY" "$ref")" || die "buildah from $ref failed"
  mnt="$(bah mount "$ctr")" || die "buildah mount $ctr failed"
  cmp -s "$mnt/usr/local/bin/kubectl-cocoon" "$plugin" && [[ -x "$mnt/usr/local/bin/kubectl-cocoon" ]] || ok=1
  bah umount "$ctr" >/dev/null || true
  bah rm "$ctr" >/dev/null || true
  ((ok == 0)) || die "$ref has no /usr/local/bin/kubectl-cocoon, or not the one staged"
  log "$ref holds the kubectl plugin at /usr/local/bin/kubectl-cocoon"
}

# build_and_push NAME REPO TAG DOCKERFILE CONTEXT [buildah build args...]: the reference
# pushed goes to $IMAGE_DIR/<ref file>: ref for the product, pause-ref for pause.
build_and_push() {
  local name="$1" repo="$2" tag="$3" dockerfile="$4" context="$5" ref_file cmd
  shift 5
  case "$name" in
    pause) ref_file="$IMAGE_DIR/pause-ref" cmd="hack/image.sh pause" ;;
    *) ref_file="$IMAGE_DIR/ref" cmd="make image" ;;
  esac
  local t=$SECONDS local_ref="localhost/$name:$tag" size digest ref
  log "building $local_ref from $dockerfile"
  bah build --quiet --isolation chroot --pull=never --identity-label=false \
    --signature-policy "$POLICY" --timestamp "$SOURCE_DATE_EPOCH" \
    -f "$dockerfile" -t "$local_ref" "$@" "$context" >/dev/null
  [[ "$name" == pause ]] || image_holds_plugin "$local_ref" "$context/rootfs/usr/local/bin/kubectl-cocoon"
  # The image this tag named before, if any, is garbage now (vfs keeps full copies).
  bah rmi --prune >/dev/null 2>&1 || log "warning: buildah rmi --prune failed; $BUILDAH_DIR may grow"
  # The layer's content: what the rootfs holds (buildah reports sizes only rounded, as text).
  size="$(du -sb "$context/rootfs" | awk '{ printf "%.1f", $1 / 1e6 }')"
  log "built in $((SECONDS - t))s, $size MB uncompressed"
  rm -f "$ref_file"
  if [[ -z "$repo" ]]; then
    log "no registry known (IMAGE_REPO, IMAGE_REGISTRY or a cluster env file): not pushed."
    log "push it with: IMAGE_REPO=<registry>/$name $cmd"
    echo "image: $local_ref size_mb=$size"
    return
  fi
  t=$SECONDS
  bah push --quiet --signature-policy "$POLICY" --tls-verify="$(tls_verify "$repo")" \
    --digestfile "$IMAGE_DIR/$name.digest" "$local_ref" "docker://$repo:$tag"
  digest="$(cat "$IMAGE_DIR/$name.digest")"
  [[ "$digest" == sha256:* ]] || die "buildah push wrote no digest"
  ref="$repo:$tag@$digest"
  echo "$ref" >"$ref_file"
  log "pushed in $((SECONDS - t))s; reference in $ref_file"
  echo "image: $ref size_mb=$size"
}

# stage_rootfs BIN PLUGIN DIR: DIR/rootfs holds BIN as /cocoon-hibernation, PLUGIN as
# /usr/local/bin/kubectl-cocoon (for users to copy out: docs/install.md), and what they need.
stage_rootfs() {
  local bin="$1" plugin="$2" rootfs="$3/rootfs" lib
  [[ -x "$bin" ]] || die "not an executable: $bin"
  [[ -x "$plugin" ]] || die "not an executable: $plugin (the kubectl plugin)"
  rm -rf "$rootfs"
  mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp"
  chmod 1777 "$rootfs/tmp" # the chart mounts an emptyDir here; without it, a writable /tmp
  install -m 0755 "$bin" "$rootfs/cocoon-hibernation"
  install -D -m 0755 "$plugin" "$rootfs/usr/local/bin/kubectl-cocoon"
  # Every library at the path the binary asks for, the loader included (lines `x => /path`
  # and `/lib64/ld-linux-x86-64.so.2 (0x..)`; linux-vdso has no file).
  while read -r lib; do
    install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
  done < <({ ldd "$bin"; ldd "$plugin"; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
  compgen -G "$rootfs/lib*/ld-linux*" >/dev/null || die "ldd named no dynamic loader for $bin"
  local ca=/etc/ssl/certs/ca-certificates.crt
  [[ -s "$ca" ]] || die "$ca missing: apt-get install -y ca-certificates"
  install -m 0644 "$ca" "$rootfs$ca"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
  # glibc's default without this file asks DNS before /etc/hosts.
  echo 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"
  chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
}

cargo_version() { sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1; }

# product_bin: sets BIN and PLUGIN to IMAGE_BIN and IMAGE_PLUGIN_BIN (or the plugin
# beside IMAGE_BIN), or to the release binaries, built (incrementally).
product_bin() {
  BIN="${IMAGE_BIN:-}"
  if [[ -n "$BIN" ]]; then
    PLUGIN="${IMAGE_PLUGIN_BIN:-$(dirname "$BIN")/kubectl-cocoon}"
    return 0
  fi
  local t=$SECONDS
  log "cargo build --release (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
  (cd "$ROOT" && cargo build --release --locked -p cocoon-hibernation -p kubectl-cocoon)
  BIN="$CARGO_TARGET_DIR/release/cocoon-hibernation"
  PLUGIN="$CARGO_TARGET_DIR/release/kubectl-cocoon"
  log "release binary ready in $((SECONDS - t))s"
}

build_product() {
  buildah_setup
  local version rev tag repo registry
  product_bin
  stage_rootfs "$BIN" "$PLUGIN" "$IMAGE_DIR/context"
  version="$(cargo_version)"
  [[ -n "$version" ]] || die "no version in Cargo.toml"
  rev="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  tag="${IMAGE_TAG:-$version}"
  if [[ -z "${IMAGE_TAG:-}" && "$rev" != unknown ]] &&
    [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]]; then
    tag="$version-${rev:0:12}-dirty"
  fi
  repo="${IMAGE_REPO:-}"
  if [[ -z "$repo" ]]; then
    registry="$(registry_host)"
    [[ -z "$registry" ]] || repo="$registry/cocoon-hibernation"
  fi
  build_and_push cocoon-hibernation "$repo" "$tag" "$ROOT/Dockerfile" "$IMAGE_DIR/context" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$rev" \
    --build-arg "CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
}

build_pause() {
  buildah_setup
  local busybox=/bin/busybox context="$IMAGE_DIR/pause-context" repo registry
  # Static: the image holds no libraries. (ldd fails on a static binary.)
  if [[ ! -x "$busybox" ]] || ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox missing or not static: apt-get install -y busybox-static"
  fi
  rm -rf "$context"
  install -D -m 0755 "$busybox" "$context/rootfs/bin/busybox"
  repo="${IMAGE_REPO:-}"
  if [[ -z "$repo" ]]; then
    registry="$(registry_host)"
    [[ -z "$registry" ]] || repo="$registry/pause"
  fi
  build_and_push pause "$repo" "${IMAGE_TAG:-busybox}" "$ROOT/hack/pause.Dockerfile" "$context"
}

case "${1:-build}" in
  build) build_product ;;
  pause) build_pause ;;
  stage)
    [[ -n "${2:-}" ]] || die "usage: hack/image.sh stage DIR"
    product_bin
    stage_rootfs "$BIN" "$PLUGIN" "$2"
    ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
