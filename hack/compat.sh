#!/usr/bin/env bash
# `make compat`: the e2e suite and the chart checks against each Kubernetes version the
# docs claim, each on a control plane of its own (built from the Go module proxy and
# cached like make test's, by hack/build-control-plane.sh), stopped again afterwards.
# Usage: hack/compat.sh [VERSION...]   (default: $COMPAT_VERSIONS, else the oldest
# supported minor and make test's version). Prints one line per version, then a total:
#   compat: v1.30.14 passed=62 failed=0 chart=pass
# Each version's output goes to $CARGO_TARGET_DIR/compat/<version>.log.
# Each version takes ~6 min here (2 cores); a cold build of another kube-apiserver took
# 18 min. Not in .ci/run: with make test that does not fit its 90 min.
set -euo pipefail
LOG_TAG=compat
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT="$(cd "$HACK_DIR/.." && pwd)"
cd "$ROOT"

# The oldest minor docs/install.md claims (its newest patch), and make test's version.
DEFAULT_VERSIONS="v1.30.14 v1.34.4"
read -r -a VERSIONS <<<"${*:-${COMPAT_VERSIONS:-$DEFAULT_VERSIONS}}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
CACHE_ROOT="${COCOON_CACHE:-$HOME/.cache/cocoon-hibernation}"
LOGS="$CARGO_TARGET_DIR/compat"
mkdir -p "$LOGS"

for v in "${VERSIONS[@]}"; do
  [[ "$v" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "not a Kubernetes version: '$v' (want e.g. v1.30.14)"
done

# Build the tests once, before any control plane runs (a 2-core machine cannot compile
# and keep the tests' second-scale timeouts at the same time).
log "building the e2e tests"
cargo test --locked --test e2e --test e2e_alone --no-run >"$LOGS/build.log" 2>&1 ||
  die "cargo test --no-run failed (see $LOGS/build.log)"
cargo build --locked --bin cocoon-hibernation >>"$LOGS/build.log" 2>&1 ||
  die "cargo build failed (see $LOGS/build.log)"

STATE_DIR=""
stop_cluster() {
  if [[ -n "$STATE_DIR" ]]; then
    bash "$HACK_DIR/cluster-down.sh" "$STATE_DIR" >/dev/null 2>&1 ||
      log "hack/cluster-down.sh $STATE_DIR failed"
  fi
  STATE_DIR=""
}
trap stop_cluster EXIT

# run_version VERSION: one control plane, the e2e suite, the chart checks; appends the
# version's result line to RESULTS. Fails only for a control plane that does not start.
RESULTS=()
run_version() {
  local v="$1" log_file="$LOGS/$1.log" t0=$SECONDS env_file
  STATE_DIR="$CACHE_ROOT/cluster-compat-$v"
  : >"$log_file"
  log "$v: control plane in $STATE_DIR (building kube-apiserver $v first if not cached: ~20 min on 2 cores)"
  # Always a fresh one: objects left by an earlier run would change what the tests see.
  bash "$HACK_DIR/cluster-down.sh" "$STATE_DIR" >>"$log_file" 2>&1
  env_file="$(K8S_VERSION="$v" bash "$HACK_DIR/cluster-up.sh" "$STATE_DIR" 2>>"$log_file" | tail -n 1)" ||
    die "$v: hack/cluster-up.sh failed (see $log_file)"
  local served
  served="$(sed -n 's/^COCOON_K8S_VERSION=//p' "$env_file")"
  [[ "$served" == "$v" ]] || die "$v: the control plane in $STATE_DIR serves '$served'"

  log "$v: e2e suite (log $log_file)"
  local rc=0
  COCOON_CLUSTER_ENV="$env_file" cargo test --locked --no-fail-fast --test e2e --test e2e_alone \
    -- --test-threads="${COCOON_TEST_THREADS:-4}" >>"$log_file" 2>&1 || rc=$?
  local passed failed
  read -r passed failed < <(awk '/^test result:/ {p += $4; f += $6} END {print p + 0, f + 0}' "$log_file")
  # A run that stopped before any test result (a build or harness failure) counts as one.
  ((rc == 0 || failed > 0)) || failed=$((failed + 1))

  log "$v: chart checks against its apiserver"
  local chart=pass
  (
    set -a
    # shellcheck disable=SC1090
    source "$env_file"
    set +a
    KUBECTL="$COCOON_BIN_DIR/kubectl" COCOON_BIN="$CARGO_TARGET_DIR/debug/cocoon-hibernation" \
      CHECK_NAMESPACE="cocoon-compat-check" cargo xtask chart-check
  ) >>"$log_file" 2>&1 || chart=fail
  stop_cluster
  RESULTS+=("compat: $v passed=$passed failed=$failed chart=$chart took_s=$((SECONDS - t0))")
  log "${RESULTS[-1]}"
}

for v in "${VERSIONS[@]}"; do run_version "$v"; done

echo
printf '%s\n' "${RESULTS[@]}"
total_passed=0 total_failed=0
for line in "${RESULTS[@]}"; do
  p="${line#*passed=}" f="${line#*failed=}"
  total_passed=$((total_passed + ${p%% *}))
  total_failed=$((total_failed + ${f%% *}))
  [[ "$line" == *chart=pass* ]] || total_failed=$((total_failed + 1))
done
echo "${total_passed} passed, ${total_failed} failed"
((total_failed == 0))
