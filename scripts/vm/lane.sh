#!/usr/bin/env bash
# The Soft-RoCE lane: builds the tests that need real RDMA (tests/rxe.rs,
# feature vm-lane) on the host, boots the VM and runs them there against the
# kernel's rdma_rxe.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
bash scripts/vm/setup.sh
binary=$(cargo test --locked --features vm-lane --test rxe --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "rxe" and m.get("executable"):
        print(m["executable"])')
[[ -x "$binary" ]] || { echo "vm/lane: the rxe test binary was not built" >&2; exit 1; }
echo "== Soft-RoCE lane: $binary"
bash scripts/vm/run.sh "$binary" --test-threads=1
