#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, docs/reliability.md): libFuzzer with
# coverage instrumentation, on the stable toolchain (no sanitizer: the
# targets are safe Rust, and their assertions and overflow checks are on).
#
#   bash scripts/fuzz.sh [RUNS [TARGET...]]
#   bash scripts/fuzz.sh --install    cargo-fuzz only (CI fetches it early)
#
# RUNS: executions per target (default 10000000, the recorded runs; CI runs
# a short form). Each target starts from its committed seeds (fuzz/seeds/T)
# and its regressions (fuzz/regressions/T), keeps what it finds in
# target/fuzz/corpus/T, and stops at RUNS or after HIPOBJ_FUZZ_SECONDS
# (default 1800); the targets run as many at a time as the machine has CPUs
# (libFuzzer runs on one). A crash, a failed assertion or a timeout is left in
# target/fuzz/artifacts/T and fails the script; make it a regression test
# (fuzz/regressions/T and a unit test). Prints a table of the runs, also
# written to target/fuzz/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cargo_fuzz_version=0.13.2

if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $cargo_fuzz_version" ]]; then
    echo "fuzz: installing cargo-fuzz $cargo_fuzz_version"
    # Its own target directory, removed after: the project's is not
    # involved (and may be in use).
    scratch=$(mktemp -d)
    cargo install --locked --quiet cargo-fuzz --version "$cargo_fuzz_version" --target-dir "$scratch"
    rm -rf "$scratch"
fi
[[ ${1:-} == --install ]] && exit 0
runs=${1:-10000000}
shift || true
seconds=${HIPOBJ_FUZZ_SECONDS:-1800}
# cargo-fuzz has no --locked: check the lock file first, so that the build
# cannot change it.
cargo fetch --locked --quiet --manifest-path fuzz/Cargo.toml
(cd fuzz && cargo fuzz build --sanitizer none --debug-assertions)
bins="$root/fuzz/target/x86_64-unknown-linux-gnu/release"

targets=("$@")
if ((${#targets[@]} == 0)); then
    mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi

out="$root/target/fuzz"
mkdir -p "$out"
summary="$out/summary.md"
{
    echo "Fuzzing, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, cargo-fuzz $cargo_fuzz_version, $(rustc --version)"
    echo
    echo "| target | executions | seconds | executions/s | edges (cov) | features (ft) | corpus (inputs/bytes) | result |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$summary"
# One target's run; its row of the table in $out/$t.row.
fuzz_one() {
    local t=$1
    local corpus="$out/corpus/$t" artifacts="$out/artifacts/$t" log="$out/$t.log"
    mkdir -p "$corpus" "$artifacts"
    local inputs=("$corpus" "fuzz/seeds/$t")
    [[ -d "fuzz/regressions/$t" ]] && inputs+=("fuzz/regressions/$t")
    local start end result=ok
    start=$(date +%s.%N)
    "$bins/$t" -runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "${inputs[@]}" >"$log" 2>&1 || result="FAILED (see $log)"
    end=$(date +%s.%N)
    local executed done_line cov ft corp elapsed rate
    executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
    [[ -n $done_line ]] || done_line=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$done_line")
    elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    rate=$(awk -v n="${executed:-0}" -v s="$elapsed" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
    echo "| $t | ${executed:-?} | $elapsed | $rate | ${cov:-?} | ${ft:-?} | ${corp:-?} | $result |" >"$out/$t.row"
    echo "fuzz: $t: ${executed:-?} executions in $elapsed s, cov ${cov:-?}, ft ${ft:-?}: $result"
    [[ $result == ok ]]
}
failed=0
at_once=$(nproc)
running=0
for t in "${targets[@]}"; do
    if ((running >= at_once)); then
        wait -n || failed=1
        running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
done
while ((running > 0)); do
    wait -n || failed=1
    running=$((running - 1))
done
for t in "${targets[@]}"; do
    cat "$out/$t.row" >>"$summary" 2>/dev/null || { echo "| $t | ? | ? | ? | ? | ? | ? | no result |" >>"$summary"; failed=1; }
done
echo
cat "$summary"
exit "$failed"
