#!/usr/bin/env bash
# Runs inside the lane's VM (scripts/vm/bench.sh boots it): perftest on rxe0,
# server and client both in the VM over 192.0.2.1, and the library's
# benchmark (benches/rxe.rs), each bandwidth configuration right after
# perftest's, so that both see the same load on the emulated machine; the
# whole sequence REPEATS times. Figures go to OUT as `name value unit`
# lines: perftest.txt and library.txt, the bandwidth names ending in _rN
# (the repetition); each tool's own output under OUT/raw.
#
# Usage: bench-guest.sh BENCH_BINARY OUT [VOLUME_MIB [REPEATS [SECTIONS
#        [SERVER COMMAND]]]]
# VOLUME_MIB (default 64) is what each bandwidth figure moves at least,
# eight times that for the many-processes splits (a split of 16 processes
# takes a while to get going, and perftest's -q 16 varies by a sixth from
# one run to the next at 64 MiB); perftest's minimum of 5 iterations per QP
# makes its 16-QP 16 MiB runs move 1280 MiB whatever the volume. REPEATS
# defaults to 1. SECTIONS: all (default), processes (only the splits), cpu
# (what a MiB costs the emulated CPUs, perftest against the library), or
# inflight (16 transfers in flight through the Rust API, as 16 threads and
# as one thread's tickets, after perftest -q 16 at 64 KiB and 1 MiB), or
# http (the S3 request's own share: SERVER, a hipobj-s3-server, on rxe0,
# and COMMAND, the hipobj command, both release builds; below), or cost
# (what the protocol's fixed cost at 64 KiB with 16 in flight is made
# of: below).
#
# A perftest run that fails or outlives its time limit is recorded in
# OUT/failed.txt and the others go on: ib_read_bw with 16 QPs and 16 MiB
# messages stalls on rxe (retransmissions: raw/*.counters has the device's
# counters for each perftest run), and a stalled run can leave its QPs and
# pinned memory behind (rxe_destroy_qp times out), so it runs once, last.
set -euo pipefail
bench=$1
out=$2
volume_mib=${3:-64}
repeats=${4:-1}
sections=${5:-all}
server_bin=${6:-}
command_bin=${7:-}
raw="$out/raw"
rm -rf "$raw"
mkdir -p "$raw"
: >"$out/perftest.txt"
: >"$out/library.txt"
: >"$out/failed.txt"
counters=/sys/class/infiniband/rxe0/ports/1/hw_counters

# RoCE v2 over the dummy netdev: GID index 1 is ::ffff:192.0.2.1 (guest.sh
# waits for it). -F: the VM has no cpufreq to warn about.
common=(-d rxe0 -x 1 -F)
port=18600
# Seconds a perftest run may take (then TERM, and KILL 10 s later).
limit=300

{
    echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kernel $(uname -r)"
    echo "cpus $(nproc)"
    echo "cpu $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "memory_mib $(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)"
    echo "perftest $(dpkg-query -W -f '${Version}' perftest 2>/dev/null || echo unknown)"
    echo "rxe0_mtu $(ibv_devinfo -d rxe0 | awk '/active_mtu:/ { print $2; exit }')"
    echo "repeats $repeats"
    echo "sections $sections"
    echo "processes_volume_mib $((volume_mib * 8))"
} >"$out/machine.txt"

# Waits until a TCP listener is on port $1 (perftest's server exchanges the
# QP attributes over TCP), for up to 30 s.
wait_listen() {
    local _
    for _ in $(seq 300); do
        ss -Hltn "sport = :$1" | grep -q . && return 0
        sleep 0.1
    done
    return 1
}

# The device's counters, `name value` lines.
snapshot() {
    local f
    for f in "$counters"/*; do echo "${f##*/} $(cat "$f")"; done
}

# Runs one perftest server and its client: pair NAME TOOL ARGS... Leaves
# the device's counters that moved in raw/NAME.counters. A failure is
# recorded in failed.txt and returns 1.
# client_wrap: a command the client runs under (perf stat), if any.
client_wrap=()
pair() {
    local name=$1 tool=$2
    shift 2
    port=$((port + 1))
    snapshot >"$raw/$name.before"
    timeout -k 10 "$limit" "$tool" "${common[@]}" "$@" -p "$port" >"$raw/$name.server" 2>&1 &
    local server=$!
    local status=0
    if wait_listen "$port"; then
        "${client_wrap[@]}" timeout -k 10 "$limit" "$tool" "${common[@]}" "$@" -p "$port" 192.0.2.1 \
            >"$raw/$name.client" 2>&1 || status=$?
    else
        echo "bench-guest: $name: the $tool server did not listen" >&2
        status=1
    fi
    local server_status=0
    wait "$server" || server_status=$?
    ((status != 0)) || status=$server_status
    snapshot | awk 'NR == FNR { was[$1] = $2; next } $2 != was[$1] { print $1, $2 - was[$1] }' \
        "$raw/$name.before" - >"$raw/$name.counters"
    rm -f "$raw/$name.before"
    if ((status != 0)); then
        echo "bench-guest: $name: $tool failed or timed out (status $status)" >&2
        echo "$name $tool status $status after at most ${limit} s" >>"$out/failed.txt"
        return 1
    fi
}

# The size as the figures' names spell it.
size_name() {
    if (($1 >= 1048576)); then echo "$(($1 / 1048576))MiB"; else echo "$(($1 / 1024))KiB"; fi
}

# perftest's BW average (MiB/s) for SIZE in its client's output FILE:
# perftest_avg FILE SIZE. Prints nothing if it printed no result.
perftest_avg() { awk -v size="$2" '$1 == size && NF >= 5 { print $4 }' "$1"; }

# Bandwidth: bw REP TOOL SIZE QPS [EXTRA...]. Iterations per QP: enough for
# the volume, at least perftest's 5. Records BW average (MiB/s: perftest's
# MB/sec are 2^20 bytes).
bw() {
    local rep=$1 tool=$2 size=$3 qps=$4
    shift 4
    local iters=$(((volume_mib * 1048576 + size * qps - 1) / (size * qps)))
    ((iters >= 5)) || iters=5
    local name="perftest_${tool#ib_}_$(size_name "$size")_x$qps"
    if (($# > 0)); then name="${name}_depth1"; fi
    name="${name}_r$rep"
    echo "bench-guest: $name ($iters iterations per QP)" >&2
    pair "$name" "$tool" -s "$size" -q "$qps" -n "$iters" "$@" || return 0
    local avg
    avg=$(perftest_avg "$raw/$name.client" "$size")
    if [[ -z "$avg" ]]; then
        echo "bench-guest: $name: no result in its output" >&2
        echo "$name $tool printed no result" >>"$out/failed.txt"
        return 0
    fi
    echo "$name $avg MiB/s" >>"$out/perftest.txt"
}

# The library's bench: library SUFFIX ARGS... Its figures go to
# library.txt, their names ending in SUFFIX. A run that fails keeps the
# figures it printed, is recorded in failed.txt (library_ARGS_SUFFIX, its
# status and its last words) and the others go on: the table shows what
# is missing as failed.
library() {
    local suffix=$1
    shift
    echo "bench-guest: the library: $* $suffix" >&2
    local status=0 err="$raw/library.stderr.last"
    "$bench" "$@" --volume-mib "$volume_mib" >"$raw/library.out" 2>"$err" || status=$?
    cat "$err" >>"$raw/library.stderr"
    awk -v suffix="$suffix" 'NF == 3 { print $1 suffix, $2, $3 }' "$raw/library.out" >>"$out/library.txt"
    if ((status != 0)); then
        local name why
        name="library_$(IFS=_; echo "$*")$suffix"
        why=$(grep -m1 'bench: FAILED' "$err" || tail -1 "$err")
        echo "bench-guest: $name failed (status $status): $why" >&2
        echo "$name status $status: ${why:-no message}" >>"$out/failed.txt"
    fi
    return 0
}

# The emulated CPUs' time by kind (`/proc/stat`'s cpu line: user, nice,
# system, idle, iowait, irq, softirq, steal, in clock ticks).
cpu_line() { awk '$1 == "cpu" { print $2, $3, $4, $5, $6, $7, $8, $9 }' /proc/stat; }

# SECTIONS cpu: what a MiB costs the emulated CPUs, perftest against the
# library, 1 MiB with 16 streams. perftest runs for 16 s (-D) and the CPUs
# are sampled from its 8th to its 14th second (its setup, which fills the
# buffers with rand(), left out); the library reports its own CPU figures
# over its timed transfers (processes mode, 16 x 1 and 1 x 16, 2560 MiB).
if [[ $sections == cpu ]]; then
    cpus=$(nproc)
    for op in get put; do
        tool=ib_write_bw
        [[ $op == get ]] || tool=ib_read_bw
        for rep in $(seq "$repeats"); do
            name="perftest_${tool#ib_}_1MiB_x16_steady_r$rep"
            (sleep 8; cpu_line >"$raw/$name.cpu"; sleep 6; cpu_line >>"$raw/$name.cpu") &
            sampler=$!
            echo "bench-guest: $name" >&2
            if pair "$name" "$tool" -s 1048576 -q 16 -D 16; then
                wait "$sampler" || true
                avg=$(perftest_avg "$raw/$name.client" 1048576)
                echo "$name ${avg:-0} MiB/s" >>"$out/perftest.txt"
                awk -v name="$name" -v cpus="$cpus" 'NR == 1 { for (i = 1; i <= 8; i++) a[i] = $i; next }
                    { for (i = 1; i <= 8; i++) d[i] = $i - a[i]; all = 0
                      for (i = 1; i <= 8; i++) all += d[i]
                      if (all > 0) print name "_cpus_busy", (all - d[4]) / all * cpus, "cpus" }' \
                    "$raw/$name.cpu" >>"$out/perftest.txt"
            else
                wait "$sampler" || true
            fi
            # 2560 MiB in all, over the split's processes: about 25 s.
            saved=$volume_mib
            volume_mib=2560
            library "_r$rep" processes "$op" 1048576 16 1
            library "_r$rep" processes "$op" 1048576 1 16
            volume_mib=$saved
        done
    done
    exit 0
fi

# SECTIONS inflight: one thread with 16 tickets against 16 threads with one
# transfer each (the library's `inflight` mode alternates them twice in
# one process), each size and direction right after perftest's -q 16.
if [[ $sections == inflight ]]; then
    for rep in $(seq "$repeats"); do
        for size in 65536 1048576; do
            for op in get put; do
                tool=ib_write_bw
                [[ $op == get ]] || tool=ib_read_bw
                bw "$rep" "$tool" "$size" 16
                library "_r$rep" inflight "$op" "$size" 16
            done
        done
    done
    exit 0
fi

# SECTIONS cost: what a 64 KiB GET with 16 in flight is made of, against
# perftest. In each turn: the message rate of 52-byte SENDs (a PROOF's
# size) on 16 QPs (ib_send_bw -q 16); then perftest -q 16 at 64 KiB
# (ib_write_bw) and the library's bench (GET 64 KiB, 16 in flight), each
# at VOLUME_MIB and at three times it, under `perf stat -a` (the context
# switches and system calls of the whole guest, both ends included). The
# difference between a tool's two runs, over the transfers between them,
# is what a transfer costs, set-up apart. Figures in cost.txt:
# send_52B_x16_mpps_rN, cost_<tool>_<mib>_{transfers,switches,syscalls,
# mib_per_s}_rN (tool: perftest, library; MiB/s: the tool's own figure).
if [[ $sections == cost ]]; then
    : >"$out/cost.txt"
    events=context-switches,raw_syscalls:sys_enter
    # counts NAME KEY REP TRANSFERS: the switches and system calls perf stat
    # wrote to raw/NAME.perf, and the transfers, to cost.txt as KEY_..._rREP.
    counts() {
        local name=$1 key=$2 rep=$3 transfers=$4
        awk -F, -v n="$key" -v r="_r$rep" '
            $3 == "context-switches" { print n "_switches" r, $1, "count" }
            $3 == "raw_syscalls:sys_enter" { print n "_syscalls" r, $1, "count" }' \
            "$raw/$name.perf" >>"$out/cost.txt"
        echo "${key}_transfers_r$rep $transfers count" >>"$out/cost.txt"
    }
    for rep in $(seq "$repeats"); do
        name="send_52B_x16_r$rep"
        echo "bench-guest: $name" >&2
        if pair "$name" ib_send_bw -s 52 -q 16 -n 4000; then
            awk '$1 == 52 && NF >= 5 { print "send_52B_x16_mpps_r'"$rep"'", $5, "Mpps" }' \
                "$raw/$name.client" >>"$out/cost.txt"
        fi
        for mib in "$volume_mib" $((volume_mib * 3)); do
            transfers=$((mib * 16))
            echo "bench-guest: cost, perftest and the library at $mib MiB (turn $rep)" >&2
            name="cost_perftest_${mib}_r$rep"
            client_wrap=(perf stat -a -x, -o "$raw/$name.perf" -e "$events" --)
            if pair "$name" ib_write_bw -s 65536 -q 16 -n "$mib"; then
                counts "$name" "cost_perftest_$mib" "$rep" "$transfers"
                avg=$(perftest_avg "$raw/$name.client" 65536)
                [[ -z $avg ]] || echo "cost_perftest_${mib}_mib_per_s_r$rep $avg MiB/s" >>"$out/cost.txt"
            fi
            client_wrap=()
            name="cost_library_${mib}_r$rep"
            status=0
            perf stat -a -x, -o "$raw/$name.perf" -e "$events" -- timeout -k 10 "$limit" \
                "$bench" throughput get 65536 16 --volume-mib "$mib" >"$raw/$name.out" 2>&1 || status=$?
            if ((status != 0)); then
                echo "$name status $status: $(tail -1 "$raw/$name.out")" >>"$out/failed.txt"
                continue
            fi
            counts "$name" "cost_library_$mib" "$rep" "$transfers"
            awk -v m="$mib" -v n="cost_library_${mib}_mib_per_s_r$rep" \
                '$1 == "get_64KiB_x16_seconds" && $2 > 0 { print n, m / $2, "MiB/s" }' \
                "$raw/$name.out" >>"$out/cost.txt"
        done
    done
    exit 0
fi

# SECTIONS http: what a 64 KiB transfer with 16 in flight costs through
# the S3 server, against what no RDMA protocol can remove. In each turn,
# for GET (PUT): perftest -q 16 (ib_write_bw, ib_read_bw); the library's
# bench as the other sections run it (its requests are function calls, no
# HTTP); then, through SERVER on rxe0, the hipobj command's `bench` by RDMA
# (an S3 request each, SigV4, the server's handler, the token, the
# transfer, the answer); the same server's plain-HTTP answers to 1-byte
# requests on 16 streams (the request alone: its time per request is the
# S3 request's share); and 64 KiB over plain HTTP, for scale. Figures in
# library.txt: command_<via>_<op>_<size>_x16_rN (MiB/s) and
# command_<via>_<op>_<size>_x16_per_transfer_rN (µs: the cell's time over
# its transfers, 16 in flight).
if [[ $sections == http ]]; then
    [[ -x $server_bin && -x $command_bin ]] ||
        { echo "bench-guest: the http section needs SERVER and COMMAND (release builds)" >&2; exit 2; }
    s3root=$(mktemp -d)
    mkdir "$s3root/bench"
    s3port=19400
    # The server's log (a line per RDMA request) in the guest's own
    # memory, copied out at the end: written to OUT, on the host's share,
    # each line would cost the emulated CPUs a round trip to the host that
    # a server's log does not cost where it runs.
    s3log=$(mktemp)
    HIPOBJ_SECRET_KEY=bench-secret "$server_bin" --access-key bench --root "$s3root" \
        --listen "192.0.2.1:$s3port" --bucket bench --device rxe0 \
        >"$raw/server.out" 2>"$s3log" &
    s3server=$!
    trap 'kill "$s3server" 2>/dev/null || true; cp "$s3log" "$raw/server.err"' EXIT
    wait_listen "$s3port" || { echo "bench-guest: the S3 server did not listen" >&2; cat "$s3log" >&2; exit 1; }
    # Each cell moves VOLUME_MIB at 64 KiB: VOLUME_MIB transfers a stream.
    # cell VIA OP SIZE REP [ARGS...]: one cell of `hipobj bench`, its
    # figures to library.txt; a failure is recorded and the others go on.
    cell() {
        local via=$1 op=$2 size=$3 rep=$4
        shift 4
        local name="command_${via}_${op}_${size}_x16"
        echo "bench-guest: $name (turn $rep)" >&2
        local json="$raw/$name.r$rep.json" status=0
        HOME=$s3root AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret \
            AWS_ENDPOINT_URL="http://192.0.2.1:$s3port" HIPOBJ_NIC_HINT=rxe0 \
            timeout -k 10 "$limit" "$command_bin" bench s3://bench/b --sizes "$size" --streams-list 16 \
            --count "$volume_mib" --ops "$op" --no-verify --json "$@" \
            >"$json" 2>>"$raw/command.stderr" || status=$?
        if ((status != 0)); then
            echo "$name status $status (turn $rep): $(tail -1 "$raw/command.stderr")" >>"$out/failed.txt"
            return 0
        fi
        python3 - "$json" "$name" "_r$rep" "$via" >>"$out/library.txt" 2>>"$out/failed.txt" <<'PY' || true
import json, sys
run = json.load(open(sys.argv[1]))
name, suffix, via = sys.argv[2:5]
cell = run["cells"][0]
if via == "rdma" and cell["rdma"] != cell["transfers"]:
    sys.exit(f"{name}: {cell['fallback']} of {cell['transfers']} transfers fell back to HTTP")
print(f"{name}{suffix} {cell['mib_per_s']:.3f} MiB/s")
print(f"{name}_per_transfer{suffix} {cell['seconds'] / cell['transfers'] * 1e6:.1f} us")
PY
    }
    for rep in $(seq "$repeats"); do
        for op in get put; do
            tool=ib_write_bw
            [[ $op == get ]] || tool=ib_read_bw
            bw "$rep" "$tool" 65536 16
            library "_r$rep" throughput "$op" 65536 16
            cell rdma "$op" 64KiB "$rep"
            cell http "$op" 1B "$rep" --http
            cell http "$op" 64KiB "$rep" --http
        done
    done
    exit 0
fi

base_volume_mib=$volume_mib
for rep in $(seq "$repeats"); do
    volume_mib=$base_volume_mib
    for size in 65536 1048576 16777216; do
        [[ $sections == all ]] || break
        for qps in 1 16; do
            for op in get put; do
                tool=ib_write_bw
                [[ $op == get ]] || tool=ib_read_bw
                if ((size != 16777216 || qps != 16)) || [[ $op == get ]]; then
                    bw "$rep" "$tool" "$size" "$qps"
                fi
                if ((qps == 1)); then
                    # One operation in flight at a time, as a stream of
                    # whole transfers has: what the one-at-a-time costs on
                    # this device by itself.
                    if [[ $op == get ]]; then
                        bw "$rep" "$tool" "$size" 1 -t 1
                    else
                        bw "$rep" "$tool" "$size" 1 -t 1 -o 1
                    fi
                fi
                library "_r$rep" throughput "$op" "$size" "$qps"
            done
        done
    done
    # Many processes on one host: 16 streams as 1 process of 16 threads, 4
    # of 4 and 16 of 1, each split right after perftest's 16 QPs (one
    # process), whose figures are named _rpN_<split>. ib_read_bw -q 16 at 16 MiB
    # stalls on rxe (below): that split has no reference.
    volume_mib=$((base_volume_mib * 8))
    for size in 1048576 16777216; do
        for op in get put; do
            tool=ib_write_bw
            [[ $op == get ]] || tool=ib_read_bw
            for split in 1x16 4x4 16x1; do
                if ((size != 16777216)) || [[ $op == get ]]; then
                    bw "p${rep}_$split" "$tool" "$size" 16
                fi
                library "_rp$rep" processes "$op" "$size" "${split%x*}" "${split#*x}"
            done
        done
    done
done
volume_mib=$base_volume_mib
[[ $sections == all ]] || exit 0

echo "bench-guest: perftest_write_lat_8B" >&2
pair perftest_write_lat_8B ib_write_lat -s 8 -n 5000 || true
# #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
awk '$1 == 8 && NF >= 9 {
    print "perftest_write_lat_8B_typical " $5 " us"
    print "perftest_write_lat_8B_avg " $6 " us"
    print "perftest_write_lat_8B_min " $3 " us"
    print "perftest_write_lat_8B_p99 " $8 " us"
}' "$raw/perftest_write_lat_8B.client" >>"$out/perftest.txt" || true
library "" latency

# 1280 MiB: about 40 s if it does not stall.
limit=90
bw 1 ib_read_bw 16777216 16
