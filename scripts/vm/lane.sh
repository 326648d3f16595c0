#!/usr/bin/env bash
# The Soft-RoCE lane: builds the tests that need real RDMA on the host
# (tests/rxe.rs: verbs, CM and the library on rxe0; tests/e2e.rs: the S3
# server and the C examples end to end), builds the examples against the
# installed library, boots the VM once and runs every test binary there
# against the kernel's rdma_rxe. Fails if any test fails or the VM cannot
# start.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
bash scripts/vm/setup.sh
bash scripts/build-examples.sh
mapfile -t binaries < <(
    cargo test --locked --features vm-lane,s3-server --test rxe --test e2e --no-run \
        --message-format=json |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])'
)
if ((${#binaries[@]} != 2)); then
    # Show the compiler's messages, which the JSON stream above swallowed.
    cargo test --locked --features vm-lane,s3-server --test rxe --test e2e --no-run || true
    echo "vm/lane: expected the rxe and e2e test binaries, built: ${binaries[*]}" >&2
    exit 1
fi
echo "== Soft-RoCE lane: ${binaries[*]}"
# One boot runs them all; the lane fails if any fails.
# One line: run.sh passes it through printf %q, whose $'...' form of a
# newline the guest's shell does not read.
bash scripts/vm/run.sh bash -c 'status=0; for test in "$@"; do echo "== $test"; "$test" --test-threads=1 || status=1; done; exit $status' lane "${binaries[@]}"
