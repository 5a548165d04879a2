#!/usr/bin/env bash
# Coverage-guided fuzzing (issue 9) with cargo-fuzz on the nightly toolchain.
#
#   bash hack/fuzz.sh            run every target for FUZZ_SECONDS (default 60) each
#   bash hack/fuzz.sh cmin       minimize the corpus kept in fuzz/corpus/ (after a run): the
#                                smallest set with the same edge coverage, at most
#                                FUZZ_CORPUS_KEEP (default 100) inputs per target
#
# FUZZ_TARGETS picks targets (space separated). New inputs a run finds go to a work
# corpus under the cache, seeded from fuzz/corpus/<target>; `cmin` folds them back into
# the repo's corpus, minimized. A crash leaves its input in fuzz/artifacts/<target>/
# (git-ignored) and makes the script fail; keep it as a regression test.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"admission_review plan pod_view docker_config registry_answers"}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-hibernation
# Its own target dir: the fuzz build is instrumented and must not churn the main one.
target_dir=${FUZZ_TARGET_DIR:-$cache/fuzz-target}
work=${FUZZ_WORK_DIR:-$cache/fuzz-corpus}
# The product forbids unsafe code, so AddressSanitizer adds little but halves the speed;
# overflow checks and debug assertions stay on.
sanitizer=${FUZZ_SANITIZER:-none}

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: the nightly toolchain is missing (rustup toolchain install nightly)" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz into ~/.cargo/bin" >&2
  cargo install cargo-fuzz --locked
fi

fuzz() { cargo +nightly fuzz "$@"; }
opts=(--sanitizer "$sanitizer" --debug-assertions --target-dir "$target_dir")

if [[ "${1:-run}" == cmin ]]; then
  # Inputs kept per target: the repo's corpus stays a few hundred files (issue 22).
  keep=${FUZZ_CORPUS_KEEP:-100}
  for t in $targets; do
    mkdir -p "fuzz/corpus/$t" "$work/$t"
    # Merge the repo corpus and the work corpus into the smallest set with the same edge
    # coverage (libFuzzer -set_cover_merge into an empty directory; hit counts are not
    # told apart, or every loop count would keep an input), then cap it at the $keep
    # inputs that cover the most (hack/fuzz-keep.py), then put it in the repo.
    merged=$(mktemp -d)
    control=$(mktemp)
    max_len=()
    [[ "$t" == plan ]] && max_len=(-max_len=160)
    fuzz run "${opts[@]}" "$t" "$merged" "fuzz/corpus/$t" "$work/$t" -- -set_cover_merge=1 \
      -use_counters=0 -merge_control_file="$control" "${max_len[@]}" 2>&1 |
      grep -E 'MERGE-OUTER: [0-9]+ new files' >&2 || true
    echo "fuzz: corpus $t: $(python3 hack/fuzz-keep.py "$control" "$keep" "$merged")" >&2
    rm -f "$control"
    rm -rf "fuzz/corpus/$t"
    mv "$merged" "fuzz/corpus/$t"
    echo "fuzz: corpus $t: $(find "fuzz/corpus/$t" -type f | wc -l) files, $(du -sh "fuzz/corpus/$t" | cut -f1)" >&2
  done
  exit 0
fi

summary=()
status=0
for t in $targets; do
  mkdir -p "fuzz/corpus/$t" "$work/$t" "fuzz/artifacts/$t"
  log=$(mktemp)
  dict=()
  [[ -f "fuzz/dicts/$t.dict" ]] && dict=(-dict="fuzz/dicts/$t.dict")
  # plan's inputs decode into CRs: small ones reach every rule and run 2-3x faster.
  [[ "$t" == plan ]] && dict+=(-max_len=160)
  echo "fuzz: $t for ${seconds}s" >&2
  if fuzz run "${opts[@]}" "$t" "$work/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -print_final_stats=1 "${dict[@]}" 2>&1 | tee "$log" |
    grep -E '^(#[0-9]+[[:space:]]+(DONE|INITED)|==[0-9]+==|thread .* panicked|SUMMARY|Test unit written)' >&2; then
    :
  fi
  # libFuzzer's own figures (-print_final_stats); absent when the run crashed early.
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n1 || true)
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n1 || true)
  if grep -qE 'panicked|deadly signal|ERROR: libFuzzer|Test unit written' "$log"; then
    summary+=("fuzz: target=$t execs=${execs:-?} exec/s=${rate:-?} result=CRASH (see fuzz/artifacts/$t/)")
    status=1
  else
    summary+=("fuzz: target=$t execs=${execs:-?} exec/s=${rate:-?} result=ok")
  fi
  rm -f "$log"
done
printf '%s\n' "${summary[@]}"
exit "$status"
