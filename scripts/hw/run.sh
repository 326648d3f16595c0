#!/usr/bin/env bash
# The hardware lane's runner: on a host with its own RDMA device (no VM),
# from a bundle that `bash scripts/hw/lane.sh build` made (target/hw, which
# holds this script; no Rust toolchain needed where it runs). It first
# reports what the host has, then runs, against one named device with both
# ends on this host (the client and the server side loop back through the
# device):
#
#   contract   the real-verbs contract checks and the library on real verbs,
#              hostile servers included (tests/rxe.rs)
#   e2e        the S3 server, the command and the C examples end to end
#              (tests/e2e.rs; one test needs haproxy on the PATH)
#   across     where the host has a second usable device (two ports or two
#              NICs): tests/e2e.rs again with the S3 servers on the second
#              and the clients on the first, so the traffic crosses between
#              them
#   bench      the library's figures (benches/rxe.rs) and, where perftest
#              is installed, perftest's on the same device
#   gpu        where an NVIDIA GPU and the bundle's tests/cuda-tests are
#              present: the GPU contract and transfers of device memory
#              (tests/cuda.rs)
#
# Usage: run.sh [--device NAME] [--ip ADDR] [--server-device NAME]
#               [--server-ip ADDR] [--e2e-args ARGS] [--across-args ARGS]
#               [--out DIR] [--steps LIST] [--bench none|quick|full]
#               [--report-only]
#
#   --device   the RDMA device (default: the first whose port 1 is ACTIVE
#              with an IPv4 RoCE GID, as `hipobj doctor` chooses)
#   --ip       its IPv4 address (default: from its GID table)
#   --server-device, --server-ip
#              the servers' device for the step across (default: the first
#              other usable device, if any)
#   --e2e-args, --across-args
#              the test binary's arguments for the step e2e or across
#              (test name filters, --skip NAME): all of tests/e2e.rs by
#              default
#   --out      where the report and the logs go (default: ./hipobj-hw-out)
#   --steps    a comma-separated subset of contract,e2e,across,bench,gpu
#   --bench    quick: a few seconds a figure; full (default): 64 MiB a
#              figure at 64 KiB, 1 MiB and 16 MiB, 1 and 16 streams
#
# Exit status: 0 every step passed; 1 a step failed (the summary names it
# and its log); 2 bad usage; 3 refused: no usable RDMA device here (the
# report says what the host has and what to do; nothing on RDMA was run,
# only the gpu step where there is a GPU: it needs no NIC).
set -uo pipefail
bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
device=""
ip=""
out="$PWD/hipobj-hw-out"
steps="contract,e2e,across,bench,gpu"
server_device=""
server_ip=""
e2e_args=""
across_args=""
bench="full"
report_only=0
usage() { sed -n '2,49s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
while (($#)); do
    case $1 in
        --device) device=${2:?--device needs a name}; shift 2 ;;
        --ip) ip=${2:?--ip needs an address}; shift 2 ;;
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        --steps) steps=${2:?--steps needs a list}; shift 2 ;;
        --server-device) server_device=${2:?--server-device needs a name}; shift 2 ;;
        --server-ip) server_ip=${2:?--server-ip needs an address}; shift 2 ;;
        --e2e-args) e2e_args=${2?--e2e-args needs a list}; shift 2 ;;
        --across-args) across_args=${2?--across-args needs a list}; shift 2 ;;
        --bench) bench=${2:?--bench needs none, quick or full}; shift 2 ;;
        --report-only) report_only=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "hw/run: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
case $bench in none | quick | full) ;; *) echo "hw/run: --bench is none, quick or full" >&2; exit 2 ;; esac
for step in ${steps//,/ }; do
    case $step in contract | e2e | across | bench | gpu) ;; *) echo "hw/run: unknown step $step (contract, e2e, across, bench, gpu)" >&2; exit 2 ;; esac
done
for need in bin/hipobj bin/hipobj-s3-server lib/libhipobj.so.0 tests/rxe-tests tests/e2e-tests bench/rxe-bench; do
    [[ -e $bundle/$need ]] || {
        echo "hw/run: $bundle/$need is missing: make the bundle with 'bash scripts/hw/lane.sh build' and carry all of target/hw" >&2
        exit 2
    }
done
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HIPOBJ_LANE_BIN="$bundle/bin" HIPOBJ_LANE_EXAMPLES="$bundle/examples"
report="$out/report.txt"

# ------------------------------------------------------------ the report
{
    echo "# hipobj hardware lane, $(date -u +%FT%TZ)"
    echo "host: $(uname -n), kernel $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
    echo "bundle: $bundle ($(cat "$bundle/VERSION" 2>/dev/null || echo "no VERSION"))"
    echo
    echo "## RDMA devices (/sys/class/infiniband)"
    found=0
    for dev in /sys/class/infiniband/*; do
        [[ -d $dev ]] || continue
        found=1
        name=${dev##*/}
        echo "$name: $(cat "$dev/node_type" 2>/dev/null), hca $(cat "$dev/hca_type" 2>/dev/null || echo '?'), firmware $(cat "$dev/fw_ver" 2>/dev/null || echo '?'), board $(cat "$dev/board_id" 2>/dev/null || echo '?'), PCI $(basename "$(readlink -f "$dev/device" 2>/dev/null)" 2>/dev/null), NUMA $(cat "$dev/device/numa_node" 2>/dev/null || echo '?')"
        for port in "$dev"/ports/*; do
            [[ -d $port ]] || continue
            echo "  port ${port##*/}: $(cat "$port/state" 2>/dev/null), $(cat "$port/phys_state" 2>/dev/null), $(cat "$port/link_layer" 2>/dev/null), $(cat "$port/rate" 2>/dev/null)"
            # A port has hundreds of GID entries, nearly all empty: read
            # each with the shell's own read, not a process apiece (under
            # the VM lane's emulated CPUs, 1024 of them took 90 s).
            for gid in "$port"/gids/*; do
                read -r value <"$gid" 2>/dev/null || continue
                [[ $value == 0000:0000:0000:0000:0000:0000:0000:0000 ]] && continue
                i=${gid##*/}
                type="" ndev=""
                read -r type <"$port/gid_attrs/types/$i" 2>/dev/null || true
                read -r ndev <"$port/gid_attrs/ndevs/$i" 2>/dev/null || true
                echo "    GID $i $value $type $ndev"
            done
        done
    done
    ((found)) || echo "none"
    if command -v ibv_devinfo >/dev/null; then
        echo
        echo "## ibv_devinfo"
        ibv_devinfo 2>&1
    fi
    echo
    echo "## GPUs"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv 2>&1
        echo
        nvidia-smi topo -m 2>&1
    elif command -v rocm-smi >/dev/null; then
        rocm-smi --showbus --showproductname 2>&1
    else
        echo "no nvidia-smi or rocm-smi"
    fi
    echo
    echo "## hipobj doctor"
    "$bundle/bin/hipobj" doctor 2>&1
    echo "(exit status $?)"
} >"$report" 2>&1
"$bundle/bin/hipobj" doctor --json >"$out/doctor.json" 2>>"$out/doctor.stderr"
cat "$report"

# ------------------------------------------------------------ the steps
status=0
summary="$out/summary.txt"
: >"$summary"
step() {
    local name=$1
    shift
    echo "== $name: $*"
    local rc=0
    timeout -k 10 3600 "$@" >"$out/$name.log" 2>&1 || rc=$?
    if ((rc == 0)); then
        tail -n 3 "$out/$name.log"
        echo "PASS $name" | tee -a "$summary"
    else
        tail -n 150 "$out/$name.log"
        echo "FAIL $name (status $rc): $out/$name.log" | tee -a "$summary"
        status=1
    fi
}
wants() { [[ ",$steps," == *",$1,"* ]]; }
gpu_step() {
    if [[ -x $bundle/tests/cuda-tests ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        step gpu "$bundle/tests/cuda-tests" --test-threads=1
    else
        echo "gpu: skipped: $([[ -x $bundle/tests/cuda-tests ]] || echo 'the bundle has no tests/cuda-tests (lane.sh build --gpu); ')$(command -v nvidia-smi >/dev/null || echo 'no NVIDIA GPU here')" | tee -a "$summary"
    fi
}

# ------------------------------------------------------------ the device
# The device, its address and path MTU, from doctor's JSON (its own choice
# of GID: a RoCE v2 entry with an IPv4 address, on an ACTIVE port).
choice=$(python3 - "$out/doctor.json" "$device" "$ip" "$server_device" "$server_ip" <<'PY' 2>&1
import ipaddress, json, sys
path, want, want_ip, want_server, want_server_ip = sys.argv[1:6]
try:
    report = json.load(open(path))
except Exception as e:
    print(f"refused: hipobj doctor --json gave nothing readable ({e}); see doctor.stderr")
    sys.exit()
devices = report.get("rdma", {}).get("devices", [])
if not devices:
    lib = report.get("rdma", {}).get("libibverbs", {})
    print("refused: this host has no RDMA device (libibverbs: "
          f"{lib.get('detail', '?')}). The hardware lane needs a NIC with RDMA "
          "(RoCE or InfiniBand) and its driver loaded; /sys/class/infiniband is empty. "
          "Nothing on RDMA was run (the gpu step still runs where there is a GPU); "
          "the report above is what the host has.")
    sys.exit()
names = [d["name"] for d in devices]
for w in (want, want_server):
    if w and w not in names:
        print(f"refused: no RDMA device {w} here (devices: {', '.join(names)})")
        sys.exit()


def usable(name, ip, why):
    """(device, IPv4, path MTU) of the first usable port, or None."""
    for d in devices:
        if name and d["name"] != name:
            continue
        if not d.get("open", {}).get("ok"):
            why.append(f"{d['name']}: cannot be opened ({d.get('open', {}).get('detail', '')})")
            continue
        for p in d.get("ports", []):
            if not p.get("active"):
                why.append(f"{d['name']} port {p.get('num')}: not ACTIVE")
                continue
            for g in p.get("gids", []):
                try:
                    v4 = ipaddress.IPv6Address(g["gid"]).ipv4_mapped
                except Exception:
                    v4 = None
                if v4 is None or (ip and str(v4) != ip):
                    continue
                if g["index"] != p.get("chosen_gid") and not ip:
                    continue
                return d["name"], str(v4), str(p.get("mtu") or "")
            why.append(f"{d['name']} port {p.get('num')}: no IPv4 RoCE GID" + (f" {ip}" if ip else ""))
    return None


why = []
client = usable(want, want_ip, why)
if client is None:
    print("refused: no usable port: " + "; ".join(why) +
          ". The library's transfers need RoCE (an IPv4 address on the NIC's netdev) on an ACTIVE port; "
          "name a device and address with --device and --ip.")
    sys.exit()
print("ok", *client)
# The servers' device for the step across: the one named, else the first
# other usable device.
server = None
if want_server:
    server = usable(want_server, want_server_ip, why)
    if server is None:
        print(f"server-refused {want_server}: " + "; ".join(why))
        sys.exit()
else:
    for d in devices:
        if d["name"] != client[0]:
            server = usable(d["name"], "", [])
            if server:
                break
print("server", *(server[:2] if server else ("none",)))
PY
)
if [[ $choice != ok\ * ]]; then
    echo
    echo "hardware lane: $choice" | tee -a "$report"
    # The GPU's own tests need no RDMA device (the fake fabric, the real
    # GPU driver): they still run where they can.
    if ((!report_only)) && wants gpu && [[ -x $bundle/tests/cuda-tests ]] && command -v nvidia-smi >/dev/null; then
        gpu_step
        ((status == 0)) || exit 1
    fi
    exit 3
fi
if [[ $choice == *server-refused* ]]; then
    echo
    echo "hardware lane: refused: --server-device ${choice#*server-refused }" | tee -a "$report"
    exit 3
fi
read -r _ device ip mtu <<<"$(head -n 1 <<<"$choice")"
read -r _ server_device server_ip <<<"$(sed -n 2p <<<"$choice")"
echo
echo "hardware lane: device $device, address $ip, path MTU ${mtu:-?}; the servers across: ${server_device/none/no second device}${server_ip:+ at $server_ip}; logs in $out" | tee -a "$report"
((report_only)) && exit 0
export HIPOBJ_LANE_DEVICE="$device" HIPOBJ_LANE_IP="$ip"
[[ -n $mtu ]] && export HIPOBJ_LANE_PATH_MTU="$mtu"
# The servers the tests start keep their objects under TMPDIR (/tmp unless
# set: objects of 3 and 5 GiB; in the VM a tmpfs, not the shared tree).

wants contract && step contract "$bundle/tests/rxe-tests" --test-threads=1
# shellcheck disable=SC2086 # --e2e-args is a list of words
wants e2e && step e2e "$bundle/tests/e2e-tests" --test-threads=1 $e2e_args
if wants across; then
    if [[ $server_device != none ]]; then
        # shellcheck disable=SC2086 # --across-args is a list of words
        HIPOBJ_LANE_SERVER_DEVICE="$server_device" HIPOBJ_LANE_SERVER_IP="$server_ip" \
            step across "$bundle/tests/e2e-tests" --test-threads=1 $across_args
    else
        echo "across: skipped: one usable device (name a second with --server-device)" | tee -a "$summary"
    fi
fi
if wants bench && [[ $bench != none ]]; then
    if [[ $bench == quick ]]; then
        step bench-library "$bundle/bench/rxe-bench" latency --latency-iters 200 --handshake-iters 5
        step bench-throughput "$bundle/bench/rxe-bench" throughput get 1048576 4 --volume-mib 16
    else
        step bench-library "$bundle/bench/rxe-bench" --volume-mib 64
    fi
    if command -v ib_write_bw >/dev/null && command -v ib_read_bw >/dev/null; then
        gid_index=$(python3 -c '
import json, sys
for d in json.load(open(sys.argv[1]))["rdma"]["devices"]:
    if d["name"] == sys.argv[2]:
        for p in d["ports"]:
            if p.get("active") and p.get("chosen_gid") is not None:
                print(p["chosen_gid"]); sys.exit()' "$out/doctor.json" "$device")
        sizes="65536 1048576 16777216"
        qps_list="1 16"
        [[ $bench == quick ]] && sizes="1048576" qps_list="1"
        # perftest is the reference, not the thing tested: a run of it that
        # does not finish (ib_read_bw with 16 queue pairs does not on rxe)
        # is recorded, bounded at 120 s, and fails nothing.
        for tool in ib_write_bw ib_read_bw; do
            for size in $sizes; do
                for qps in $qps_list; do
                    name="perftest-$tool-$size-q$qps"
                    args=(-d "$device" -x "$gid_index" -F -s "$size" -q "$qps" -n 200 -p 18515)
                    timeout -k 5 120 "$tool" "${args[@]}" >"$out/$name.server" 2>&1 &
                    server=$!
                    sleep 1
                    echo "== $name: $tool ${args[*]} $ip"
                    if timeout -k 5 120 "$tool" "${args[@]}" "$ip" >"$out/$name.log" 2>&1; then
                        grep -A1 "#bytes" "$out/$name.log" | tail -n 1
                        echo "ran $name" | tee -a "$summary"
                    else
                        echo "perftest did not finish: $name (no reference): $out/$name.log" | tee -a "$summary"
                    fi
                    wait "$server" 2>/dev/null
                done
            done
        done
    else
        echo "perftest: not installed (ib_write_bw, ib_read_bw): the library's figures alone" | tee -a "$summary"
    fi
fi
wants gpu && gpu_step
echo
echo "hardware lane on $device: $( ((status == 0)) && echo 'every step passed' || echo 'a step failed')"
cat "$summary"
exit "$status"
