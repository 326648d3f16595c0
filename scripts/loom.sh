#!/usr/bin/env bash
# Runs the loom models of src/core/loom_models.rs (docs/reliability.md):
# the library built with `--cfg loom`, whose shared locks (src/core/sync.rs)
# are then loom's, in a target directory of its own. Every interleaving of
# each model's threads is tried (LOOM_MAX_PREEMPTIONS, if set, bounds the
# preemptions per interleaving; unset, the search is exhaustive); a
# deadlock, a lost wake-up, a panic or a failed assertion fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test --locked --release --lib loom_models -- --test-threads=1
