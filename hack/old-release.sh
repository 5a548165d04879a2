#!/usr/bin/env bash
# The previous release, for the install suite's upgrade (tests/e2e_install/upgrade.rs):
# its chart and its image, from the one pinned commit below. The source comes from git
# (`git archive`; a fresh clone has the history), the release binary is built once with a
# target dir of its own and cached by commit, so later runs only rebuild the image.
#
#   hack/old-release.sh commit       the pinned commit (full hash)
#   hack/old-release.sh build        build (or reuse) the old release binary; prints its path
#   hack/old-release.sh chart DIR    the old chart into DIR/cocoon-hibernation; prints the path
#   hack/old-release.sh image        the old image pushed like `make image` (needs
#                                    IMAGE_REGISTRY or a cluster env file); last line as
#                                    image.sh's: image: <repo>:<tag>@sha256:… size_mb=…
#
# Cache: ${COCOON_CACHE:-~/.cache/cocoon-hibernation}/old-release/<commit>/ (src/, target/,
# and the finished binary). The cold build took 26m13s wall (8m41s CPU) on a 2-core machine
# busy with other builds (load ~12); a cached one takes no time. Runs unattended (CI=true,
# no stdin).
set -euo pipefail
LOG_TAG=old-release
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$(cd "$HACK_DIR/.." && pwd)"

# The previous release: chart 0.4.0. Pinned here only; everything else asks this script.
OLD_COMMIT=f7064839ce863a7d3c44ba2de8a3334dede36002

CACHE_ROOT="${COCOON_CACHE:-$HOME/.cache/cocoon-hibernation}"
CACHE="$CACHE_ROOT/old-release/$OLD_COMMIT"
OLD_BIN="$CACHE/cocoon-hibernation"

have_commit() {
  git -C "$ROOT" cat-file -e "$OLD_COMMIT^{commit}" 2>/dev/null ||
    die "commit $OLD_COMMIT is not in this clone: git fetch --unshallow (a shallow clone lacks it)"
}

# The old tree's source, unpacked once (a finished unpack leaves .done).
old_source() {
  if [[ ! -f "$CACHE/src/.done" ]]; then
    have_commit
    rm -rf "$CACHE/src"
    mkdir -p "$CACHE/src"
    git -C "$ROOT" archive "$OLD_COMMIT" | tar -x -C "$CACHE/src"
    touch "$CACHE/src/.done"
  fi
}

build() {
  if [[ -x "$OLD_BIN" ]]; then
    log "cached: $OLD_BIN"
  else
    old_source
    local t=$SECONDS
    log "cold build of ${OLD_COMMIT:0:7}'s release binary (CARGO_TARGET_DIR=$CACHE/target); it takes minutes"
    (cd "$CACHE/src" && CARGO_TARGET_DIR="$CACHE/target" cargo build --release --locked --bin cocoon-hibernation) ||
      die "cargo build of $OLD_COMMIT failed"
    # Copied out, then renamed: the cache holds a binary only once it is whole.
    install -m 0755 "$CACHE/target/release/cocoon-hibernation" "$OLD_BIN.tmp"
    mv "$OLD_BIN.tmp" "$OLD_BIN"
    log "built in $((SECONDS - t))s"
  fi
  echo "$OLD_BIN"
}

chart() {
  local dir="${1:-}"
  [[ -n "$dir" ]] || die "usage: hack/old-release.sh chart DIR"
  have_commit
  mkdir -p "$dir"
  rm -rf "$dir/cocoon-hibernation"
  git -C "$ROOT" archive "$OLD_COMMIT" charts/cocoon-hibernation | tar -x -C "$dir" --strip-components=1
  [[ -f "$dir/cocoon-hibernation/Chart.yaml" ]] || die "no chart at $OLD_COMMIT"
  echo "$dir/cocoon-hibernation"
}

# The old tree's own image.sh (its Dockerfile and labels) on the cached binary, tagged by
# commit so it never replaces this tree's tag. Its timestamps are the commit's.
image() {
  local bin epoch
  bin="$(build | tail -n 1)"
  old_source
  epoch="$(git -C "$ROOT" log -1 --format=%ct "$OLD_COMMIT")"
  IMAGE_BIN="$bin" IMAGE_TAG="old-${OLD_COMMIT:0:12}" SOURCE_DATE_EPOCH="$epoch" \
    bash "$CACHE/src/hack/image.sh" build
}

case "${1:-}" in
  commit) echo "$OLD_COMMIT" ;;
  build) build ;;
  chart) chart "${2:-}" ;;
  image) image ;;
  *)
    sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
