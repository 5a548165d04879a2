#!/usr/bin/env bash
# The system benchmark (`make bench`, issue 8): the release build against the local control
# plane (hack/cluster-up.sh, a fresh one of its own, stopped again at the end). Not part of
# `make test`.
#
# Usage: hack/bench.sh [--n 1000] [--scale-n 10000] [--quiet-s 60] [--parts roundtrip,quiet,admission,scale,schedule]
#                      [--filler-pods 0] [--keep-scale]
#                      [--update-baseline] [--fail-on-regression]
#        hack/bench.sh --parts capacity [--capacity-crs 1000,10000,50000] [--capacity-bursts 100,1000,5000]
#   Every flag also reads BENCH_<NAME> from the environment (e.g. BENCH_N=100).
# Output: $CARGO_TARGET_DIR/bench/system-latest.json, roundtrip-phases.svg, reaction-latency.svg
# (capacity: capacity.json, capacity.svg and one "capacity: ..." line per step).
# The last line printed is the one-line summary ("bench: writes_per_round=...").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
export BENCH_OUT="${BENCH_OUT:-$CARGO_TARGET_DIR/bench}"

echo "=== build: the benchmark, then the product with \`cargo build --release\`" >&2
# The bench build links the binary with dev-dependency features (tokio test-util, ...):
# building the product last leaves target/release/cocoon-hibernation as \`cargo build
# --release\` makes it, and the benchmark is run directly, not through \`cargo bench\`
# (which would relink the binary its way).
BENCH_EXE="$(cargo bench --locked --bench system --no-run --message-format=json-render-diagnostics |
  sed -n 's/.*"executable":"\([^"]*\/system-[^"]*\)".*/\1/p' | tail -n 1)"
[[ -x "$BENCH_EXE" ]] || { echo "bench executable not found" >&2; exit 1; }
cargo build --locked --release --bin cocoon-hibernation >&2

# A control plane of its own, fresh and stopped at the end: the scale part leaves 10k pods
# behind, which would cost a core and gigabytes, and would skew the next run.
# BENCH_KEEP_CLUSTER=1 keeps it (then: bash hack/cluster-down.sh "$BENCH_STATE_DIR").
BENCH_STATE_DIR="${BENCH_STATE_DIR:-$HOME/.cache/cocoon-hibernation/bench-cluster}"
stop_cluster() {
  if [[ "${BENCH_KEEP_CLUSTER:-}" == 1 ]]; then
    echo "=== control plane kept running (BENCH_KEEP_CLUSTER=1); stop it with: bash hack/cluster-down.sh $BENCH_STATE_DIR" >&2
  else
    bash hack/cluster-down.sh "$BENCH_STATE_DIR" >/dev/null 2>&1 || echo "hack/cluster-down.sh $BENCH_STATE_DIR failed" >&2
  fi
}
echo "=== local control plane ($BENCH_STATE_DIR, fresh)" >&2
bash hack/cluster-down.sh "$BENCH_STATE_DIR" >/dev/null 2>&1 || true
trap stop_cluster EXIT
ENV_FILE="$(bash hack/cluster-up.sh "$BENCH_STATE_DIR" | tail -n 1)"
export COCOON_CLUSTER_ENV="$ENV_FILE"

echo "=== system benchmark: $BENCH_EXE (output in $BENCH_OUT)" >&2
"$BENCH_EXE" "$@"
