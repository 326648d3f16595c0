#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, docs/reliability.md): libFuzzer with
# coverage instrumentation, on the stable toolchain (no sanitizer: the
# targets are safe Rust, and their assertions and overflow checks are on).
#
#   bash scripts/fuzz.sh [RUNS [TARGET...]]
#
# RUNS: executions per target (default 10000000, the recorded runs; CI runs
# a short form). Each target starts from its committed seeds (fuzz/seeds/T)
# and its regressions (fuzz/regressions/T), keeps what it finds in
# target/fuzz/corpus/T, and stops at RUNS or after HIPOBJ_FUZZ_SECONDS
# (default 1800). A crash, a failed assertion or a timeout is left in
# target/fuzz/artifacts/T and fails the script; make it a regression test
# (fuzz/regressions/T and a unit test). Prints a table of the runs, also
# written to target/fuzz/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
runs=${1:-10000000}
shift || true
seconds=${HIPOBJ_FUZZ_SECONDS:-1800}
cargo_fuzz_version=0.13.2

if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $cargo_fuzz_version" ]]; then
    echo "fuzz: installing cargo-fuzz $cargo_fuzz_version"
    cargo install --locked --quiet cargo-fuzz --version "$cargo_fuzz_version"
fi
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
failed=0
for t in "${targets[@]}"; do
    corpus="$out/corpus/$t"
    artifacts="$out/artifacts/$t"
    log="$out/$t.log"
    mkdir -p "$corpus" "$artifacts"
    inputs=("$corpus" "fuzz/seeds/$t")
    [[ -d "fuzz/regressions/$t" ]] && inputs+=("fuzz/regressions/$t")
    start=$(date +%s.%N)
    result=ok
    "$bins/$t" -runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "${inputs[@]}" >"$log" 2>&1 || result="FAILED (see $log)"
    end=$(date +%s.%N)
    [[ $result == ok ]] || failed=1
    executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
    [[ -n $done_line ]] || done_line=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$done_line")
    elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    rate=$(awk -v n="${executed:-0}" -v s="$elapsed" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
    echo "| $t | ${executed:-?} | $elapsed | $rate | ${cov:-?} | ${ft:-?} | ${corp:-?} | $result |" >>"$summary"
    echo "fuzz: $t: ${executed:-?} executions in $elapsed s, cov ${cov:-?}, ft ${ft:-?}: $result"
done
echo
cat "$summary"
exit "$failed"
