#!/usr/bin/env bash
# The Soft-RoCE benchmark in one command on the host: prepares the lane,
# builds benches/rxe.rs (bench profile), boots the VM once to run
# scripts/vm/bench-guest.sh (perftest on rxe0 and the library's bench,
# alternating), and prints one table: the library's figures against
# perftest's on the same device, with each goal met or missed. Takes
# /tmp/hipobj-vm.lock itself (do not wrap it in flock); run as root.
#
# Usage: bash scripts/vm/bench.sh [VOLUME_MIB [REPEATS [NETDEV_MTU
# [SECTIONS]]]] (defaults 64, 1, 9000 and all: 13 to 16 minutes in all;
# each more repetition adds 8 to 12; see bench-guest.sh). NETDEV_MTU 9000
# runs rxe at path MTU 4096, as RoCE fabrics run; 1500 at 1024, as the lane
# did before. SECTIONS `processes`: only the many-processes table (about
# 4 minutes a repetition); `cpu`: only what a MiB of 1 MiB transfers on 16
# streams costs the emulated CPUs, perftest against the library (about
# 4 minutes a repetition); `inflight`: one thread with 16 tickets in flight
# against 16 threads with one transfer each, and both against perftest
# -q 16, at 64 KiB and 1 MiB; `http`: 64 KiB with 16 in flight through
# the S3 server (the hipobj command's bench against a release
# hipobj-s3-server, both built into target/bench-release), against
# perftest -q 16 and the bound the same server's plain-HTTP answers to
# 1-byte requests leave (under 2 minutes a repetition, after the
# builds: 10 minutes for the release ones on two cores); `cost`: what a
# 64 KiB GET with 16 in flight is made of (the message rate of small
# SENDs; context switches and system calls a transfer of perftest and of
# the library's bench; about 2 minutes a repetition at 32 MiB).
# Outputs under target/vm/out/bench: machine.txt, perftest.txt, library.txt
# (`name value unit` lines), failed.txt (perftest and library runs that
# failed, and why),
# host-load.txt, table.md, console.log, raw/ (each tool's output and the
# device's counters).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
volume_mib=${1:-64}
repeats=${2:-1}
netdev_mtu=${3:-9000}
sections=${4:-all}
[[ $sections == all || $sections == processes || $sections == cpu || $sections == inflight || $sections == http ||
    $sections == cost ]] ||
    { echo "vm/bench: SECTIONS is all, processes, cpu, inflight, http or cost" >&2; exit 2; }
for n in "$volume_mib" "$repeats" "$netdev_mtu"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "vm/bench: VOLUME_MIB, REPEATS and NETDEV_MTU are positive integers" >&2; exit 2; }
done

bash scripts/vm/setup.sh
binary=$(cargo bench --locked --no-run --features vm-lane --bench rxe --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and t.get("name") == "rxe" and "bench" in t.get("kind", []) and m.get("executable"):
        print(m["executable"])')
[[ -x "$binary" ]] || { echo "vm/bench: the rxe bench was not built" >&2; exit 1; }
# The http section's S3 server and command: release builds, in a target
# directory of their own (the release library in target/release keeps its
# features).
s3_programs=()
if [[ $sections == http ]]; then
    CARGO_TARGET_DIR="$root/target/bench-release" cargo build --locked --release \
        --features s3-server,cli --bin hipobj-s3-server --bin hipobj
    s3_programs=("$root/target/bench-release/release/hipobj-s3-server" "$root/target/bench-release/release/hipobj")
fi

out="$root/target/vm/out/bench"
rm -rf "$out"
mkdir -p "$out"
echo "== Soft-RoCE benchmark: $binary (at least $volume_mib MiB per bandwidth figure, $repeats times)"
# The emulated VM shares the host's cores: their load is part of the figures.
echo "before $(cat /proc/loadavg)" >"$out/host-load.txt"
status=0
# timeout kills its whole process group, QEMU included, if the device hangs.
flock /tmp/hipobj-vm.lock timeout -k 30 1800 \
    bash scripts/vm/run.sh --mtu "$netdev_mtu" bash scripts/vm/bench-guest.sh "$binary" "$out" "$volume_mib" "$repeats" "$sections" ${s3_programs[@]+"${s3_programs[@]}"} 2>&1 |
    tee "$out/console.log" || status=$?
echo "after $(cat /proc/loadavg)" >>"$out/host-load.txt"
if ((status != 0)) || { [[ ! -s "$out/library.txt" ]] && [[ ! -s "$out/cost.txt" ]]; }; then
    echo "vm/bench: the run failed (status $status); see $out/console.log and $out/raw" >&2
    exit 1
fi

python3 - "$out" <<'EOF' | tee "$out/table.md"
import sys

out = sys.argv[1]


def figures(name):
    values = {}
    with open(f"{out}/{name}") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                values[parts[0]] = float(parts[1])
    return values


lib = figures("library.txt")
perf = figures("perftest.txt")
machine = dict(
    line.rstrip("\n").split(" ", 1) for line in open(f"{out}/machine.txt") if " " in line
)
load = open(f"{out}/host-load.txt").read().split("\n")
failed = [line.split()[0] for line in open(f"{out}/failed.txt") if line.strip()]
repeats = int(machine.get("repeats", "1"))
everything = machine.get("sections", "all") == "all"


def verdict(met):
    return "met" if met else "**missed**"


def median(values):
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def spread(values, digits):
    """The median, and the range when there are several values."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def runs(table, name):
    return [table[f"{name}_r{r}"] for r in range(1, repeats + 1) if f"{name}_r{r}" in table]


print(f"Soft-RoCE benchmark, {machine.get('date', '?')}: {machine.get('cpus', '?')} vCPUs "
      f"({machine.get('cpu', '?')}), {machine.get('memory_mib', '?')} MiB, kernel "
      f"{machine.get('kernel', '?')}, perftest {machine.get('perftest', '?')}, rxe0 MTU "
      f"{machine.get('rxe0_mtu', '?')}; host load average {' / '.join(l for l in load if l)}")
print(f"Bandwidths: median of {repeats} runs (lowest–highest); each ratio is taken within a "
      f"run, between the library and the perftest run just before it.")
if failed:
    print(f"runs that failed or timed out: {', '.join(failed)}")
    for line in open(f"{out}/failed.txt"):
        if line.startswith("library_"):
            print(f"- {line.strip()}")
print()
if machine.get("sections") == "cpu":
    cpus = float(machine.get("cpus", "2"))
    print("What a MiB costs the emulated CPUs at 1 MiB on 16 streams: perftest sampled in "
          "the steady state of a 16 s run, the library over its timed transfers (2560 MiB). "
          "CPU ms per MiB = CPUs busy × 1000 / MiB/s.")
    print()
    print("| transfer | who | MiB/s | CPUs busy (of "
          f"{cpus:.0f}) | CPU ms per MiB | ratio of MiB/s to perftest's | of which in the client "
          "processes, ms per MiB | in the server process, ms per MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for op, tool in (("get", "write_bw"), ("put", "read_bw")):
        for r in range(1, repeats + 1):
            ref = f"perftest_{tool}_1MiB_x16_steady_r{r}"
            bw, busy = perf.get(ref), perf.get(f"{ref}_cpus_busy")
            if bw and busy is not None:
                print(f"| {op.upper()} 1MiB, pass {r} | ib_{tool} -q 16 | {bw:.1f} | {busy:.2f} | "
                      f"{busy * 1000 / bw:.1f} | 1 | | |")
            for procs, threads in ((16, 1), (1, 16)):
                k = f"{op}_1MiB_p{procs}x{threads}"
                mine = lib.get(f"{k}_throughput_r{r}")
                ticks = {kind: lib.get(f"{k}_cpu_{kind}_r{r}", 0.0) for kind in
                         ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")}
                seconds = lib.get(f"{k}_seconds_r{r}")
                if not mine or not seconds:
                    continue
                all_ms = sum(ticks.values())
                lib_busy = (all_ms - ticks["idle"]) / all_ms * cpus if all_ms else 0.0
                mib = mine * seconds
                clients = lib.get(f"{k}_client_processes_cpu_r{r}", 0.0) / mib
                server = lib.get(f"{k}_server_process_cpu_r{r}", 0.0) / mib
                ratio = f"{mine / bw:.3f}" if bw else "—"
                print(f"| {op.upper()} 1MiB, pass {r} | library {procs} × {threads} | {mine:.1f} | "
                      f"{lib_busy:.2f} | {lib_busy * 1000 / mine:.1f} | {ratio} | {clients:.2f} | "
                      f"{server:.2f} |")
    sys.exit(0)
if machine.get("sections") == "http":
    # Per transfer with 16 in flight, µs: perftest's (64 KiB over its rate)
    # and the S3 request's (the server's plain-HTTP answers to 1-byte
    # requests, the cell's time over its requests). No RDMA protocol
    # removes the request: through the server a transfer takes at least
    # both, so perftest's share of their sum bounds the ratio.
    print("64 KiB with 16 in flight: perftest -q 16; the library's bench (function calls, "
          "no HTTP); the hipobj command through hipobj-s3-server by RDMA (an S3 request "
          "each); the same server's plain-HTTP answers to 1-byte requests (the request "
          "alone) and to 64 KiB. Bound: perftest's time per transfer over its sum with the "
          "request's. Medians of the turns.")
    print()
    print("| op | perftest MiB/s | library (no HTTP) MiB/s, ratio | through the server by RDMA "
          "MiB/s, ratio | HTTP 1 B, µs a request | bound | ratio / bound | goal | HTTP 64 KiB "
          "MiB/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op, tool in (("get", "write_bw"), ("put", "read_bw")):
        refs = runs(perf, f"perftest_{tool}_64KiB_x16")
        inproc = runs(lib, f"{op}_64KiB_x16_throughput")
        rdma = runs(lib, f"command_rdma_{op}_64KiB_x16")
        req = runs(lib, f"command_http_{op}_1B_x16_per_transfer")
        plain = runs(lib, f"command_http_{op}_64KiB_x16")
        if not (refs and rdma and req):
            print(f"| {op.upper()} | did not finish | | | | | | | |")
            continue
        t_perf = 65536 / (median(refs) * 1048576) * 1e6
        bound = t_perf / (t_perf + median(req))
        ratio = median(rdma) / median(refs)
        inr = f"{spread(inproc, 1)}, {median(inproc) / median(refs):.3f}" if inproc else "—"
        met = ratio >= 0.75 or ratio >= 0.9 * bound
        print(f"| {op.upper()} | {spread(refs, 1)} | {inr} | {spread(rdma, 1)}, {ratio:.3f} | "
              f"{spread(req, 0)} | {bound:.3f} | {ratio / bound:.3f} | ≥ 0.75 or ≥ 0.9 of the "
              f"bound: {verdict(met)} | {spread(plain, 1) if plain else '—'} |")
    sys.exit(0)
if machine.get("sections") == "cost":
    cost = figures("cost.txt")
    print("What a GET of 64 KiB with 16 in flight is made of (the whole guest under perf stat -a; "
          "per transfer: the difference between each tool's runs at VOLUME_MIB and three times "
          "it, over the transfers between them). Medians of the turns.")
    print()
    mpps = runs(cost, "send_52B_x16_mpps")
    if mpps:
        print(f"- 52-byte SENDs on 16 QPs (a PROOF's size): {spread(mpps, 4)} million a second: "
              f"{1 / median(mpps):.1f} µs of the guest's time a message with its acknowledgement")
    print()
    print("| per transfer | perftest -q 16 (ib_write_bw) | the library's bench (client and server) |")
    print("|---|---|---|")
    rows = {}
    for tool in ("perftest", "library"):
        names = sorted({k.split("_")[2] for k in cost if k.startswith(f"cost_{tool}_")}, key=int)
        for what in ("switches", "syscalls"):
            per = []
            for r in range(1, repeats + 1):
                if len(names) != 2:
                    break
                small, large = (f"cost_{tool}_{m}" for m in names)
                keys = [f"{small}_{what}_r{r}", f"{large}_{what}_r{r}",
                        f"{small}_transfers_r{r}", f"{large}_transfers_r{r}"]
                if all(k in cost for k in keys):
                    a, b, ta, tb = (cost[k] for k in keys)
                    per.append((b - a) / (tb - ta))
            rows.setdefault(what, {})[tool] = spread(per, 2) if per else "did not finish"
        times = [65536 / (v * 1048576) * 1e6 for m in names[-1:] for v in runs(cost, f"cost_{tool}_{m}_mib_per_s")]
        rows.setdefault("time", {})[tool] = spread(times, 0) if times else "did not finish"
    print(f"| context switches, the whole guest | {rows['switches']['perftest']} | {rows['switches']['library']} |")
    print(f"| system calls, the whole guest | {rows['syscalls']['perftest']} | {rows['syscalls']['library']} |")
    print(f"| time, µs (the tool's own MiB/s, the larger run) | {rows['time']['perftest']} | {rows['time']['library']} |")
    sys.exit(0)
if machine.get("sections") == "inflight":
    print("16 transfers in flight through the Rust API: 16 threads with one each (`Client::get`/"
          "`put`) against one thread with 16 tickets (`submit_tagged`, resubmitted as each "
          "ends), alternating twice in one process (medians of all rounds), right after "
          "perftest -q 16.")
    print()
    print("| transfer | threads MiB/s | tickets MiB/s | tickets / threads | goal | perftest -q 16 "
          "MiB/s | tickets / perftest | process CPU per ticket (µs) |")
    print("|---|---|---|---|---|---|---|---|")
    for op, tool in (("get", "write_bw"), ("put", "read_bw")):
        for size in ("64KiB", "1MiB"):
            k = f"inflight_{op}_{size}_x16"
            rounds = [(r, n) for r in range(1, repeats + 1) for n in (1, 2)]
            th = [lib[f"{k}_threads_throughput_round{n}_r{r}"] for r, n in rounds
                  if f"{k}_threads_throughput_round{n}_r{r}" in lib]
            tk = [lib[f"{k}_tickets_throughput_round{n}_r{r}"] for r, n in rounds
                  if f"{k}_tickets_throughput_round{n}_r{r}" in lib]
            ratio = [lib[f"{k}_tickets_over_threads_round{n}_r{r}"] for r, n in rounds
                     if f"{k}_tickets_over_threads_round{n}_r{r}" in lib]
            cpu = [lib[f"{k}_tickets_process_cpu_per_transfer_round{n}_r{r}"] for r, n in rounds
                   if f"{k}_tickets_process_cpu_per_transfer_round{n}_r{r}" in lib]
            refs = runs(perf, f"perftest_{tool}_{size}_x16")
            if not th or not tk:
                print(f"| {op.upper()} {size} | did not finish | | | | | | |")
                continue
            vs = f"{median(tk) / median(refs):.3f}" if refs else "—"
            print(f"| {op.upper()} {size} | {spread(th, 1)} | {spread(tk, 1)} | "
                  f"{spread(ratio, 3)} | ≥ 0.95: {verdict(median(ratio) >= 0.95)} | "
                  f"{spread(refs, 1) if refs else 'did not finish'} | {vs} | "
                  f"{spread(cpu, 0)} |")
    sys.exit(0)
print("| transfer | streams | library MiB/s | perftest MiB/s (GET: ib_write_bw, PUT: "
      "ib_read_bw; -q streams) | ratio | goal | ratio to perftest with 1 in flight |")
print("|---|---|---|---|---|---|---|")
for op, tool in (("get", "write_bw"), ("put", "read_bw")) if everything else ():
    for size in ("64KiB", "1MiB", "16MiB"):
        for n in (1, 16):
            name = f"{op}_{size}_x{n}_throughput"
            mine = runs(lib, name)
            refs = runs(perf, f"perftest_{tool}_{size}_x{n}")
            ratios = [lib[f"{name}_r{r}"] / perf[f"perftest_{tool}_{size}_x{n}_r{r}"]
                      for r in range(1, repeats + 1)
                      if f"{name}_r{r}" in lib and f"perftest_{tool}_{size}_x{n}_r{r}" in perf]
            want = None if size == "64KiB" else (0.95 if n == 1 else 0.90)
            if ratios:
                goal = "none" if want is None else f"≥ {want:.2f}: {verdict(median(ratios) >= want)}"
                shown, ratio = spread(refs, 1), spread(ratios, 3)
            else:
                goal = "none" if want is None else f"≥ {want:.2f}: no reference"
                shown, ratio = "did not finish", "—"
            d1 = [lib[f"{name}_r{r}"] / perf[f"perftest_{tool}_{size}_x1_depth1_r{r}"]
                  for r in range(1, repeats + 1)
                  if n == 1 and f"{name}_r{r}" in lib
                  and f"perftest_{tool}_{size}_x1_depth1_r{r}" in perf]
            print(f"| {op.upper()} {size} | {n} | {spread(mine, 1) if mine else 'failed'} | {shown} | "
                  f"{ratio} | {goal} | {spread(d1, 2) if d1 else ''} |")

print()
print("Many processes on one host: 16 streams split over processes (processes × threads) "
      "served by one server process, each split right after `-q 16` of perftest (one "
      f"process), at least {machine.get('processes_volume_mib', '?')} MiB each.")
print()
print("| transfer | processes × threads | library MiB/s | perftest MiB/s (-q 16) | ratio | goal |")
print("|---|---|---|---|---|---|")
for op, tool in (("get", "write_bw"), ("put", "read_bw")):
    for size in ("1MiB", "16MiB"):
        for procs, threads in ((1, 16), (4, 4), (16, 1)):
            name = f"{op}_{size}_p{procs}x{threads}_throughput"
            mine = [lib[f"{name}_rp{r}"] for r in range(1, repeats + 1) if f"{name}_rp{r}" in lib]
            ratios, refs = [], []
            for r in range(1, repeats + 1):
                ref = f"perftest_{tool}_{size}_x16_rp{r}_{procs}x{threads}"
                if ref in perf:
                    refs.append(perf[ref])
                    if f"{name}_rp{r}" in lib:
                        ratios.append(lib[f"{name}_rp{r}"] / perf[ref])
            if ratios:
                goal = f"≥ 0.90: {verdict(median(ratios) >= 0.90)}"
                print(f"| {op.upper()} {size} | {procs} × {threads} | {spread(mine, 1)} | "
                      f"{spread(refs, 1)} | {spread(ratios, 3)} | {goal} |")
            else:
                print(f"| {op.upper()} {size} | {procs} × {threads} | "
                      f"{spread(mine, 1) if mine else 'failed'} | did not finish | — | "
                      f"≥ 0.90: no reference |")

print()
print("| mean per transfer, µs, averaged over the processes (median of the runs) | whole call | "
      "server process (the socket's round trip included) | library's own | calling threads on a CPU | "
      "calling threads waiting for a CPU |")
print("|---|---|---|---|---|---|")
for op in ("get", "put"):
    for size in ("1MiB", "16MiB"):
        for procs, threads in ((1, 16), (4, 4), (16, 1)):
            k = f"{op}_{size}_p{procs}x{threads}"
            cells = []
            for part in ("transfer_mean", "server_side_mean", "library_mean", "on_cpu_mean",
                         "runqueue_wait_mean"):
                v = [lib[f"{k}_{part}_rp{r}"] for r in range(1, repeats + 1)
                     if f"{k}_{part}_rp{r}" in lib]
                cells.append(f"{median(v):.0f}" if v else "—")
            print(f"| {op.upper()} {size} {procs} × {threads} | " + " | ".join(cells) + " |")

if not everything:
    sys.exit(0)
print()
if "latency_get_8B_median" not in lib:
    print("| 8-byte GET, reused connection; fresh handshake; verbs | failed (failed.txt) |")
else:
    total = lib["latency_get_8B_median"]
    callbacks = lib["latency_get_8B_callbacks_median"]
    own = lib["latency_get_8B_library_median"]
    wlat = perf.get("perftest_write_lat_8B_typical")
    print("| 8-byte GET, reused connection | µs |")
    print("|---|---|")
    print(f"| library, whole call (median; p99 {lib['latency_get_8B_p99']:.0f}) | {total:.1f} |")
    print(f"| of which in the callbacks (the server side's WRITE and final SEND) | {callbacks:.1f} |")
    print(f"| library's own: call minus callbacks (median) | {own:.1f} |")
    print(f"| of which before `sendRequest` (median) | {lib['latency_get_8B_library_before_median']:.1f} |")
    print(f"| of which after `recvReply` (median) | {lib['latency_get_8B_library_after_median']:.1f} |")
    if wlat is None:
        print("| ib_write_lat | did not finish |")
    else:
        print(f"| ib_write_lat, typical (p99 {perf['perftest_write_lat_8B_p99']:.0f}) | {wlat:.1f} |")
        print(f"| goal: call ≤ 2 × ib_write_lat + callbacks, i.e. own ≤ 2 × ib_write_lat = "
              f"{2 * wlat:.1f} | {verdict(own <= 2 * wlat)} (own / ib_write_lat = {own / wlat:.2f}) |")
    print()
    print("| fresh handshake (8-byte GET) | µs |")
    print("|---|---|")
    print(f"| whole call (median) | {lib['handshake_get_8B_median']:.1f} |")
    print(f"| of which the server side's connect (median) | {lib['handshake_get_8B_connect_median']:.1f} |")
    print(f"| more than on a reused connection | {lib['handshake_get_8B_extra_median']:.1f} |")
    print(f"| disconnect and the library's reset before it (median, not in the call) | "
          f"{lib['handshake_get_8B_teardown_median']:.1f} |")
    print()
    print("| verbs of the reused path, on the server side's QP (median) | µs |")
    print("|---|---|")
    print(f"| RTS->RTS modify of the access flags | {lib['verbs_modify_access_median']:.1f} |")
    for what in ("bind", "invalidate"):
        for how, text in (("library", "waited for as the library waits"),
                          ("channel", "on the completion channel alone"),
                          ("spin", "CQ polled until it completes")):
            print(f"| window {what}, {text} | {lib[f'verbs_{what}_{how}_median']:.1f} |")
print()
print("| mean per transfer, µs (median of the runs) | whole call | server side | library's own | "
      "before `sendRequest` | after `recvReply` | calling threads on a CPU | "
      "calling threads waiting for a CPU |")
print("|---|---|---|---|---|---|---|---|")
for op in ("get", "put"):
    for size in ("64KiB", "1MiB", "16MiB"):
        for n in (1, 16):
            k = f"{op}_{size}_x{n}"
            if not runs(lib, k + "_transfer_mean"):
                print(f"| {op.upper()} {size} x{n} | failed | | | | | | |")
                continue
            print(f"| {op.upper()} {size} x{n} | {median(runs(lib, k + '_transfer_mean')):.0f} | "
                  f"{median(runs(lib, k + '_server_side_mean')):.0f} | "
                  f"{median(runs(lib, k + '_library_mean')):.0f} | "
                  f"{median(runs(lib, k + '_library_before_mean')):.0f} | "
                  f"{median(runs(lib, k + '_library_after_mean')):.0f} | "
                  f"{median(runs(lib, k + '_on_cpu_mean')):.0f} | "
                  f"{median(runs(lib, k + '_runqueue_wait_mean')):.0f} |")
EOF
