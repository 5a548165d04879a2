#!/usr/bin/env bash
# Stops what hack/cluster-up.sh started (by pid file) and removes its runtime state.
# The built binaries (outside STATE_DIR) stay. Safe to run twice.
# Usage: hack/cluster-down.sh [--node] [STATE_DIR]
set -euo pipefail
LOG_TAG=cluster-down
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# shellcheck source=hack/node.sh
source "$HACK_DIR/node.sh"

if [[ "${1:-}" == --node ]]; then
  shift
  resolve_state_dir "${1:-${COCOON_NODE_STATE_DIR:-$HOME/.cache/cocoon-hibernation/node-cluster}}"
else
  resolve_state_dir "${1:-}"
fi
take_lock
# A real node's containers, mounts and bridge go first (they outlive the daemons).
if grep -qs '^RUN_NODE=1' "$STATE_DIR/run.state" || [[ -f "$STATE_DIR/containerd/config.toml" ]]; then
  DAEMONS+=("${NODE_DAEMONS[@]}")
  stop_node
fi
stop_all
# Everything but the lock file, which a concurrent cluster-up may be waiting on.
find "$STATE_DIR" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
log "stopped; cleaned $STATE_DIR"
