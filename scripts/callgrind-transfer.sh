#!/usr/bin/env bash
# Instructions per reused 8-byte GET on the fake fabric, counted by
# callgrind: deterministic, whatever else the machine does. Runs the
# transfer benchmark's counting mode (benches/transfer.rs) twice, with few
# and with many transfers, under `valgrind --tool=callgrind`, and prints the
# difference per transfer: the client library's instructions, the
# connection driver's, the in-process test server's and the fake fabric's,
# every thread together.
#
# The world is the one where no thread polls (a software NIC): a thread that
# polls runs instructions for as long as it waits, which under valgrind's
# serialised threads says nothing about the work. Needs valgrind.
#
# Usage: bash scripts/callgrind-transfer.sh [FEW MANY]   (default 100 1100)
set -euo pipefail
cd "$(dirname "$0")/.."
few=${1:-100}
many=${2:-1100}
command -v valgrind >/dev/null || { echo "callgrind-transfer: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
bench=$(cargo bench --locked --bench transfer --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "transfer" and m.get("executable"):
        print(m["executable"])')
[ -x "$bench" ] || { echo "callgrind-transfer: the benchmark did not build" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() {
  HIPOBJ_BENCH_TRANSFERS=$1 HIPOBJ_BENCH_WORLD=${HIPOBJ_BENCH_WORLD:-sleeping} \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1" "$bench" >/dev/null 2>"$out/log.$1"
  callgrind_annotate --threshold=100 "$out/cg.$1" >"$out/fn.$1"
}
count "$few"
count "$many"
# Each function's own instructions (exclusive), by where it lives: the
# library's code, the protocol's server side and the in-process test
# server, the fake fabric, and what all of them call (std, alloc, libc,
# parking_lot, hashbrown: not told apart).
python3 - "$out/fn.$few" "$out/fn.$many" "$few" "$many" <<'PY'
import re, sys
def areas(path):
    total, by = 0, {"library": 0, "server": 0, "fake fabric": 0, "shared (std, libc, ...)": 0}
    for line in open(path):
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        n, name = int(m.group(1).replace(",", "")), m.group(2)
        if "PROGRAM TOTALS" in name:
            total = n
            continue
        fn = name.split(":", 1)[1] if ":" in name else name
        if "hipobj_testing::world" in fn or "hipobj::server" in fn:
            by["server"] += n
        elif "hipobj_testing::" in fn:
            by["fake fabric"] += n
        elif "hipobj::" in fn:
            by["library"] += n
        else:
            by["shared (std, libc, ...)"] += n
    return total, by
(ta, a), (tb, b) = areas(sys.argv[1]), areas(sys.argv[2])
n = int(sys.argv[4]) - int(sys.argv[3])
print(f"instructions per reused 8-byte GET (callgrind, {n} transfers): {(tb - ta) / n:.0f}")
for k in a:
    print(f"  {k:<26} {(b[k] - a[k]) / n:.0f}")
PY
