#!/usr/bin/env bash
# The README's test command (`make test`): quality gates, then three lanes at once, each on
# a control plane of its own: every cargo test and the chart checks on the shared local
# control plane, the short soak, and the install suite on a real node. The lanes mostly
# wait on clocks (the e2e lane leaves a 2-core machine ~85% idle), so running them side by
# side costs little CPU and saves their sum. Each lane's output goes to a log under
# $CARGO_TARGET_DIR/make-test/; a failing lane's log is printed in full.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "toolchain"
cargo --version
go version || { echo "Go is required to build kube-apiserver, etcd and helm (bash hack/prereqs.sh test says which)" >&2; exit 1; }

step "cargo fmt --check"
cargo fmt --all -- --check
# The fuzz crate is outside the workspace (it needs nightly to build, not to format).
(cd fuzz && cargo fmt -- --check)
step "rule IDs cited by tests are defined in docs/rules.md"
python3 hack/rule-index.py
step "chart files changed only with a version bump and a CHANGELOG section"
cargo xtask chart-version
# The check's own cases, on temporary copies (and the rest of the harness's unit tests).
cargo test --locked -p xtask
step "every link in README and docs resolves inside the repository"
python3 hack/check-links.py
step "shellcheck: every tracked shell script"
# The *.sh files, .ci/run, and any other tracked file whose first line is a sh or bash
# shebang. Any finding fails; -x follows each script's `# shellcheck source=` lines.
shellcheck --version >/dev/null || { echo "shellcheck is required (bash hack/prereqs.sh test installs it)" >&2; exit 1; }
mapfile -t shell_scripts < <({
  git ls-files '*.sh' .ci/run
  git ls-files -z | xargs -0 awk 'FNR == 1 && /^#!(.*[\/ ])?(ba)?sh( |$)/ { print FILENAME } { nextfile }'
} | sort -u)
shellcheck -x "${shell_scripts[@]}"
echo "${#shell_scripts[@]} scripts, no findings"
# The `test = false` targets (Cargo.toml: a bare `cargo test` runs only the tests that need
# no cluster) are not in --all-targets or --tests, and naming one beside those flags does
# not add it (cargo keeps the flag's set), so they get a command of their own.
CLUSTER_TESTS=(--test e2e --test e2e_alone)
OFF_TARGETS=("${CLUSTER_TESTS[@]}" --test soak --test e2e_install)
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings
cargo clippy --locked "${OFF_TARGETS[@]}" -- -D warnings
step "cargo build"
cargo build --locked --all-targets
cargo build --locked "${OFF_TARGETS[@]}"
# The install suite's image binary, built here rather than beside the tests: a 2-core
# machine cannot compile and keep the tests' second-scale timeouts at the same time.
cargo build --locked --release -p cocoon-hibernation -p kubectl-cocoon
# The previous release's binary for the install suite's upgrade: built once, then cached.
cargo xtask old-release build
step "the kubectl plugin through krew (offline)"
cargo xtask plugin krew-test

step "certs/ tooling"
bash certs/test.sh

# Every lane writes its log here; this run's logs replace the last run's.
LANES="$CARGO_TARGET_DIR/make-test"
rm -rf "$LANES"
mkdir -p "$LANES"
SOAK_STATE_DIR="${SOAK_STATE_DIR:-$HOME/.cache/cocoon-hibernation/cluster-soak}"
export SOAK_STATE_DIR

stop_cluster() {
  if [[ "${COCOON_KEEP_CLUSTER:-}" == 1 ]]; then
    echo "control plane kept running (COCOON_KEEP_CLUSTER=1); stop it with: bash hack/cluster-down.sh"
  else
    bash hack/cluster-down.sh >/dev/null 2>&1 || echo "hack/cluster-down.sh failed" >&2
  fi
}

# Lane "tests": the shared control plane, every cargo test, then the chart checks.
lane_tests() {
  local t0=$SECONDS
  # CI starts from an empty control plane: objects left by an earlier run would change
  # what the tests see (cluster-up.sh otherwise reuses a running one, for quick reruns).
  [[ "${CI:-}" == true ]] && bash hack/cluster-down.sh
  local env_file
  env_file="$(bash hack/cluster-up.sh | tail -n 1)"
  # COCOON_KEEP_CLUSTER=1 keeps the control plane for a quick rerun of single tests.
  trap stop_cluster EXIT
  echo "control plane ready in $((SECONDS - t0))s"
  set -a
  # shellcheck disable=SC1090
  source "$env_file"
  set +a
  export COCOON_CLUSTER_ENV="$env_file"
  echo "kube-apiserver version: $COCOON_K8S_VERSION"
  step "cargo test"
  t0=$SECONDS
  cargo test --locked --lib --bins --tests -- --test-threads="${COCOON_TEST_THREADS:-4}"
  cargo test --locked "${CLUSTER_TESTS[@]}" -- --test-threads="${COCOON_TEST_THREADS:-4}"
  echo "cargo test took $((SECONDS - t0))s"
  step "chart checks"
  COCOON_BIN="$CARGO_TARGET_DIR/debug/cocoon-hibernation" cargo xtask chart-check
}

# Lane "soak": 60 CRs, every fault kind, on a control plane of its own, because it
# restarts kube-apiserver (tests/soak/main.rs).
lane_soak() {
  unset COCOON_CLUSTER_ENV COCOON_STATE_DIR
  local t0=$SECONDS
  SOAK_CRS="${SOAK_CRS:-60}" cargo test --locked --test soak
  echo "short soak took $((SECONDS - t0))s"
}

# Lane "install": the image and the chart on a real node (`make install-test`).
lane_install() {
  bash hack/install-test.sh
}

LANE_NAMES=(tests soak install)
declare -A LANE_PID=() LANE_RC=()
# An interrupted or failed run stops every lane and every control plane the lanes start.
stop_lanes() {
  local name pid
  for name in "${!LANE_PID[@]}"; do
    pid="${LANE_PID[$name]}"
    pkill -TERM -P "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  stop_cluster
  bash hack/cluster-down.sh "$SOAK_STATE_DIR" >/dev/null 2>&1 || true
  bash hack/cluster-down.sh --node >/dev/null 2>&1 || true
}
trap stop_lanes EXIT

step "three lanes at once (logs in $LANES)"
t_lanes=$SECONDS
for name in "${LANE_NAMES[@]}"; do
  # Each lane in its own subshell; `set -e` inside stops the lane at its first failure.
  ( set -euo pipefail; "lane_$name" ) >"$LANES/$name.log" 2>&1 &
  LANE_PID[$name]=$!
  echo "lane $name started (pid ${LANE_PID[$name]}, log $LANES/$name.log)"
done
for _ in "${LANE_NAMES[@]}"; do
  set +e
  wait -n -p done_pid "${LANE_PID[@]}"
  rc=$?
  set -e
  for name in "${!LANE_PID[@]}"; do
    if [[ "${LANE_PID[$name]}" == "$done_pid" ]]; then
      LANE_RC[$name]=$rc
      unset "LANE_PID[$name]"
      if ((rc == 0)); then result=passed; else result="FAILED (exit $rc)"; fi
      echo "lane $name $result after $((SECONDS - t_lanes))s"
    fi
  done
done
trap - EXIT

failed_lanes=0
for name in "${LANE_NAMES[@]}"; do
  if [[ "${LANE_RC[$name]}" != 0 ]]; then
    failed_lanes=$((failed_lanes + 1))
    step "lane $name FAILED; its log ($LANES/$name.log)"
    cat "$LANES/$name.log"
  fi
done
# Summary lines worth reading even when all pass.
# (install-test.sh repeats the suite's own summary line; print each line once.)
grep -ahE '^(cargo test took|short soak took|soak: |install: |\[install-test\] install suite took)' \
  "$LANES"/*.log | awk '!seen[$0]++' || true

read -r passed failed < <(awk '/^test result:/ {p += $4; f += $6} END {print p + 0, f + 0}' "$LANES/tests.log")
# The soak and the install suite count one each: they are single harness-less tests.
for name in soak install; do
  if [[ "${LANE_RC[$name]}" == 0 ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
if ((failed_lanes > 0)); then
  # A tests lane that stopped before any test failed (say, at cluster-up) counts as one.
  [[ "${LANE_RC[tests]}" == 0 || "$failed" -gt 0 ]] || failed=$((failed + 1))
  step "checks FAILED in $failed_lanes lane(s)"
  echo "${passed} passed, ${failed} failed"
  exit 1
fi
step "all checks passed"
echo "${passed} passed, ${failed} failed"
