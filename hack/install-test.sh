#!/usr/bin/env bash
# `make install-test`: the install suite (tests/e2e_install) — the chart as users install
# it, on a real node, first the previous release (`cargo xtask old-release`: its chart and
# image), then upgraded to this tree. Builds what it needs (the node's binaries, helm,
# both images; the old release binary once, cached by commit), starts
# a fresh node cluster (hack/cluster-up.sh --node), runs the suite and stops the cluster
# again. COCOON_KEEP_NODE=1 leaves the cluster running for a look around; then
# `bash hack/cluster-down.sh --node` stops it. Needs root (network namespaces, mounts).
# The last line is the suite's summary:
#   install: image_mb=<n> upgrade_from=<commit> reuse_values=ok admissions=<n> failed=<n> transitions=<n> lost=<n> handover_s=<x> takeover_s=<x>
set -euo pipefail
LOG_TAG=install-test
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=hack/demo-lib.sh
source "$HACK_DIR/demo-lib.sh"
ROOT="$(cd "$HACK_DIR/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
t0=$SECONDS

TOOLS_BIN="$(bash hack/install-tools.sh | tail -n 1)" || die "hack/install-tools.sh failed"
# The previous release's binary (cached by commit; a cold build takes minutes), before
# the cluster starts: its clocks should not race a compile.
cargo xtask old-release build >/dev/null || die "cargo xtask old-release build failed"
# A fresh node: what an earlier run left (releases, CRs, tags) would change what it sees.
bash hack/cluster-down.sh --node >/dev/null 2>&1 || true
stop_node_cluster() {
  if [[ "${COCOON_KEEP_NODE:-}" == 1 ]]; then
    log "node cluster kept running (COCOON_KEEP_NODE=1); stop it with: bash hack/cluster-down.sh --node"
  else
    bash hack/cluster-down.sh --node >/dev/null 2>&1 || log "hack/cluster-down.sh --node failed"
  fi
}
trap stop_node_cluster EXIT
ENV_FILE="$(bash hack/cluster-up.sh --node | tail -n 1)"
log "node cluster ready in $((SECONDS - t0))s"
set -a
# shellcheck disable=SC1090
source "$ENV_FILE"
set +a

# The previous release: its image (from the cached binary) and its chart.
old_line="$(IMAGE_REGISTRY="$COCOON_REGISTRY" cargo xtask old-release image | tail -n 1)" ||
  die "cargo xtask old-release image failed"
[[ "$old_line" =~ ^image:\ ([^ ]+@sha256:[0-9a-f]{64})\  ]] || die "cargo xtask old-release image printed no pushed reference: $old_line"
OLD_IMAGE_REF="${BASH_REMATCH[1]}"
OLD_CHART="$(cargo xtask old-release chart "$COCOON_STATE_DIR/old-chart" | tail -n 1)"
OLD_COMMIT="$(cargo xtask old-release commit)"
log "previous release ${OLD_COMMIT:0:7}: image $OLD_IMAGE_REF, chart $OLD_CHART"

# The image users build, pushed to the node's registry (containerd pulls it from there).
# shellcheck disable=SC2119 # no log file: image.sh's stderr stays this script's stderr
push_image
log "image $IMAGE_REF ($IMAGE_MB MB)"

log "running tests/e2e_install"
log_file="$(mktemp)"
set +e
COCOON_NODE_CLUSTER_ENV="$ENV_FILE" COCOON_IMAGE_REF="$IMAGE_REF" COCOON_IMAGE_MB="$IMAGE_MB" \
  COCOON_HELM="$TOOLS_BIN/helm" KUBECONFIG="$KUBECONFIG" \
  COCOON_UPGRADE_FROM="$OLD_COMMIT" COCOON_OLD_CHART="$OLD_CHART" COCOON_OLD_IMAGE_REF="$OLD_IMAGE_REF" \
  cargo test --locked --test e2e_install 2>&1 | tee "$log_file"
status=${PIPESTATUS[0]}
set -e
summary="$(grep -E '^install: ' "$log_file" | tail -n 1 || true)"
rm -f "$log_file"
stop_node_cluster
trap - EXIT
log "install suite took $((SECONDS - t0))s"
[[ -n "$summary" ]] || die "the install suite printed no summary line"
echo "$summary"
exit "$status"
