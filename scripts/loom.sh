#!/usr/bin/env bash
# Runs the loom models of src/core/loom_models.rs (docs/reliability.md):
# the library's unit tests built with `--cfg loom` given to this crate
# alone (`cargo rustc --profile test`), whose shared locks
# (src/core/sync.rs) are then loom's, every dependency the suite's own
# build (the same profile and features: nothing else is compiled). Every
# interleaving of each model's threads is tried (LOOM_MAX_PREEMPTIONS, if
# set, bounds the preemptions per interleaving; unset, the search is
# exhaustive); a deadlock, a lost wake-up, a panic or a failed assertion
# fails the run.
#
#   loom.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/features.sh
features=$test_features
binary=$(
    cargo rustc --locked --lib --profile test --features "$features" \
        --message-format=json-render-diagnostics -- --cfg loom |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])'
)
[[ -x "$binary" ]] || { echo "loom: no test binary was built" >&2; exit 1; }
"$binary" loom_models --test-threads=1
