#!/usr/bin/env bash
# Tests hack/chart-version.py on temporary copies of the chart, the release record and
# CHANGELOG.md: each case changes one thing and expects pass or the failure it names.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { echo "[chart-version-test] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/chart-version-test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
N=0

# fresh: a copy of the repository's parts the check reads, in $WORK/$N.
fresh() {
  N=$((N + 1))
  R="$WORK/$N"
  mkdir -p "$R/charts" "$R/hack"
  cp -r "$ROOT/charts/cocoon-hibernation" "$R/charts/"
  cp "$ROOT/hack/chart-releases.txt" "$R/hack/"
  cp "$ROOT/CHANGELOG.md" "$R/"
}
set_version() { sed -i "s/^version: .*/version: $1/" "$R/charts/cocoon-hibernation/Chart.yaml"; }
check() { python3 "$ROOT/hack/chart-version.py" --root "$R" "$@" 2>&1; }
# expect pass|fail [TEXT] NAME: the check's outcome, and TEXT in its output on a failure.
expect() {
  local want="$1" text="${2:-}" name="$3" out rc=0
  out="$(check)" || rc=$?
  if [[ "$want" == pass ]]; then
    ((rc == 0)) || die "$name: want pass, got: $out"
  else
    ((rc != 0)) || die "$name: want a failure, the check passed: $out"
    [[ "$out" == *"$text"* ]] || die "$name: the failure does not say '$text': $out"
  fi
  log "ok: $name"
}

fresh
expect pass "" "the repository as it is"

fresh
set_version 0.4.0
echo "# a new comment" >>"$R/charts/cocoon-hibernation/templates/NOTES.txt"
expect fail "chart files changed since 0.4.0 was released: bump version in Chart.yaml" \
  "the released version with a changed file"

fresh
check --release >/dev/null
echo "# a new comment" >>"$R/charts/cocoon-hibernation/values.yaml"
expect fail "chart files changed since" "a file changed after --release recorded the version"

fresh
check --release >/dev/null
chart_tests=("$R/charts/cocoon-hibernation/tests"/*)
echo "tests: changed" >>"${chart_tests[0]}"
expect pass "" "a change under tests/ (not packaged) after --release"

fresh
set_version 0.3.9
printf '\n## [0.3.9]\n' >>"$R/CHANGELOG.md"
expect fail "not greater than the released 0.4.0" "a new version below the released one"

fresh
set_version 0.4.0-rc.1
printf '\n## [0.4.0-rc.1]\n' >>"$R/CHANGELOG.md"
expect fail "not greater than the released 0.4.0" "a pre-release of a released version"

fresh
set_version 0.9.0
expect fail "CHANGELOG.md has no section '## [0.9.0]'" "a new version without a CHANGELOG section"

fresh
set_version 0.9.0
printf '\n## [0.9.0] - unreleased\n' >>"$R/CHANGELOG.md"
expect pass "" "a new version with its CHANGELOG section"
echo "chart-version-test: PASS ($N cases)"
