#!/usr/bin/env bash
# Stops what hack/cluster-up.sh started (by pid file) and removes its runtime state.
# The built binaries (outside STATE_DIR) stay. Safe to run twice.
# Usage: hack/cluster-down.sh [STATE_DIR]
set -euo pipefail
LOG_TAG=cluster-down
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

resolve_state_dir "${1:-}"
take_lock
stop_all
# Everything but the lock file, which a concurrent cluster-up may be waiting on.
find "$STATE_DIR" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
log "stopped; cleaned $STATE_DIR"
