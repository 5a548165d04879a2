#!/usr/bin/env bash
# The README's test command (`make test`): quality gates, a local control plane, every
# test (unit, in-process, real-registry, end-to-end) and the chart checks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "toolchain"
cargo --version
go version || { echo "Go >= 1.24 is required to build kube-apiserver and etcd" >&2; exit 1; }

step "cargo fmt --check"
cargo fmt --all -- --check
# The fuzz crate is outside the workspace (it needs nightly to build, not to format).
(cd fuzz && cargo fmt -- --check)
step "rule IDs cited by tests are defined in docs/rules.md"
python3 hack/rule-index.py
step "every link in README and docs resolves inside the repository"
python3 hack/check-links.py
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings
step "cargo build"
cargo build --locked --all-targets

step "certs/ tooling"
bash certs/test.sh

step "local control plane"
t0=$SECONDS
# CI starts from an empty control plane: objects left by an earlier run would change what
# the tests see (cluster-up.sh otherwise reuses a running one, for quick local reruns).
[[ "${CI:-}" == true ]] && bash hack/cluster-down.sh
ENV_FILE="$(bash hack/cluster-up.sh | tail -n 1)"
# make test stops what it started, also when a step fails. COCOON_KEEP_CLUSTER=1 keeps the
# control plane for a quick rerun of single tests (see hack/README.md).
stop_cluster() {
  if [[ "${COCOON_KEEP_CLUSTER:-}" == 1 ]]; then
    echo "control plane kept running (COCOON_KEEP_CLUSTER=1); stop it with: bash hack/cluster-down.sh"
  else
    bash hack/cluster-down.sh >/dev/null 2>&1 || echo "hack/cluster-down.sh failed" >&2
  fi
}
trap stop_cluster EXIT
echo "control plane ready in $((SECONDS - t0))s"
set -a
# shellcheck disable=SC1090
source "$ENV_FILE"
set +a
export COCOON_CLUSTER_ENV="$ENV_FILE"
echo "kube-apiserver version: $COCOON_K8S_VERSION"

step "cargo test"
t0=$SECONDS
log="$(mktemp)"
cargo test --locked --lib --bins --tests -- --test-threads="${COCOON_TEST_THREADS:-4}" 2>&1 | tee "$log"
echo "cargo test took $((SECONDS - t0))s"
read -r passed failed < <(awk '/^test result:/ {p += $4; f += $6} END {print p + 0, f + 0}' "$log")
rm -f "$log"

step "short soak (60 CRs, every fault kind, its own control plane)"
t0=$SECONDS
# Not the shared cluster: the soak restarts kube-apiserver (tests/soak/main.rs).
( unset COCOON_CLUSTER_ENV COCOON_STATE_DIR
  SOAK_CRS="${SOAK_CRS:-60}" cargo test --locked --test soak )
echo "short soak took $((SECONDS - t0))s"
passed=$((passed + 1))

step "chart checks"
COCOON_BIN="$CARGO_TARGET_DIR/debug/cocoon-hibernation" bash hack/check-chart.sh

# The shared control plane is done; the install suite brings up a node cluster of its own.
trap - EXIT
stop_cluster

step "install suite: the image and the chart on a real node (make install-test)"
t0=$SECONDS
bash hack/install-test.sh
echo "install suite took $((SECONDS - t0))s"
passed=$((passed + 1))
step "all checks passed"
echo "${passed} passed, ${failed} failed"
