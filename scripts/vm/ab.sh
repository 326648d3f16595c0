#!/usr/bin/env bash
# Compares two builds of the library's rxe bench (`benches/rxe.rs`) on
# Soft-RoCE in one boot of the lane's VM, in turns (`ab-guest.sh`): the
# before and after of a change on the transfer path.
#   bash scripts/vm/ab.sh BENCH_A BENCH_B [REPEATS] [VOLUME_MIB]
# BENCH_A and BENCH_B are bench executables under the project tree (the VM
# sees only the tree), such as `cargo bench --no-run --features vm-lane
# --bench rxe` builds of two commits. Prints each figure's median per
# build and the ratio B / A; leaves everything in target/vm/out/ab.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
(($# >= 2)) || { echo "usage: vm/ab.sh BENCH_A BENCH_B [REPEATS] [VOLUME_MIB]" >&2; exit 2; }
a=$(realpath "$1")
b=$(realpath "$2")
for bin in "$a" "$b"; do
    [[ -x $bin && $bin == "$root"/* ]] || { echo "vm/ab: $bin is not an executable under $root" >&2; exit 2; }
done
repeats=${3:-3}
volume_mib=${4:-64}
bash scripts/vm/setup.sh
out="$root/target/vm/out/ab"
rm -rf "$out"
mkdir -p "$out"
flock /tmp/hipobj-vm.lock timeout -k 30 1800 \
    bash scripts/vm/run.sh --mtu 9000 bash scripts/vm/ab-guest.sh "$out" "$a" "$b" "$repeats" "$volume_mib" 2>&1 |
    tee "$out/console.log" >/dev/null
python3 - "$out/ab.txt" <<'PY'
import collections, statistics, sys
figures = collections.defaultdict(lambda: collections.defaultdict(list))
units = {}
for line in open(sys.argv[1]):
    name, value, unit = line.split()
    base, build, _rep = name.rsplit("_", 2)
    figures[base][build].append(float(value))
    units[base] = unit
print("| figure | unit | A (median) | B (median) | B / A | runs A, B |")
print("|---|---|---|---|---|---|")
for base in sorted(figures):
    a, b = figures[base].get("A", []), figures[base].get("B", [])
    ma = statistics.median(a) if a else None
    mb = statistics.median(b) if b else None
    ratio = f"{mb / ma:.3f}" if ma and mb else "—"
    show = lambda m: f"{m:.1f}" if m is not None else "failed"
    print(f"| {base} | {units[base]} | {show(ma)} | {show(mb)} | {ratio} | {len(a)}, {len(b)} |")
PY
if [[ -s $out/failed.txt ]]; then
    echo "vm/ab: runs that failed:" >&2
    cat "$out/failed.txt" >&2
fi
