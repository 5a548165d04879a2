#!/usr/bin/env bash
# The randomized soak (`make soak`, issue 9): SOAK_CRS CRs (default 1000) flipped at random
# while registry, apiserver, process and simulator faults come and go, judged by an
# observer against the rules in docs/rules.md. It starts its OWN control plane
# (SOAK_STATE_DIR, default ~/.cache/cocoon-hibernation/cluster-soak) because it restarts
# kube-apiserver, and stops it at the end (SOAK_KEEP_CLUSTER=1 keeps it).
#
# Usage: SOAK_CRS=1000 SOAK_SEED=<n> SOAK_OUT=<dir> SOAK_CHAOS_S=<s> SOAK_VK_DROPS_TAG=<share> bash hack/soak.sh
# (SOAK_VK_DROPS_TAG, default 0.3: the share of wakes after which the simulated vk-cocoon
# deletes the tag itself; it also reports `hibernating` before `hibernated`.)
# Output: the report on stdout and in $SOAK_OUT (default <target>/soak/<seed>): report.txt,
# phases.svg, the replicas' logs. The last line is
# `soak: seed=<n> crs=<n> transitions=<n> faults=<n> invariants=<n> violations=<n> undecidable=<n>`
# (a run where more than 5% of the S1 checks, and more than 3, are undecidable fails).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/cocoon-hibernation/target}"
export SOAK_CRS="${SOAK_CRS:-1000}"
# The soak never uses the shared cluster of the other tests.
unset COCOON_CLUSTER_ENV COCOON_STATE_DIR
exec cargo test --locked --test soak
