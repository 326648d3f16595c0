#!/usr/bin/env bash
# In the lane's VM: the library's rxe bench of two builds in turns, on the
# same boot, so that both see the same emulated CPUs and load:
#   ab-guest.sh OUT BENCH_A BENCH_B REPEATS VOLUME_MIB
# Each turn runs, for A then B: the reused 8-byte GET's latency, and 64 KiB
# GETs and PUTs with 1 and 16 streams. Figures go to OUT/ab.txt as
# `name_A|B_rN value unit`; a failed run is recorded in OUT/failed.txt and
# the turns go on.
set -euo pipefail
out=$1
a=$2
b=$3
repeats=${4:-3}
volume_mib=${5:-64}
mkdir -p "$out"
: >"$out/ab.txt"
: >"$out/failed.txt"
run() {
    local build=$1 bench=$2 rep=$3
    shift 3
    local status=0
    "$bench" "$@" --volume-mib "$volume_mib" >"$out/last.out" 2>>"$out/stderr.txt" || status=$?
    awk -v s="_${build}_r$rep" 'NF == 3 { print $1 s, $2, $3 }' "$out/last.out" >>"$out/ab.txt"
    if ((status != 0)); then
        echo "$build r$rep $* status $status" >>"$out/failed.txt"
    fi
}
for ((rep = 1; rep <= repeats; rep++)); do
    for build in A B; do
        bench=$a
        [[ $build == B ]] && bench=$b
        echo "ab-guest: turn $rep, build $build" >&2
        run "$build" "$bench" "$rep" latency
        for op in get put; do
            for qps in 1 16; do
                run "$build" "$bench" "$rep" throughput "$op" 65536 "$qps"
            done
        done
    done
done
