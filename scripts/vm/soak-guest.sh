#!/usr/bin/env bash
# Runs inside the VM (scripts/vm/soak.sh boots it with guest.sh --veth): the
# fault soak. Starts the RDMA S3 server on rxe1 (192.0.2.2) and the soak's
# client (tests/soak/soak.c) on rxe0 (192.0.2.1), waits until the client's
# threads run, then for FAULT_SECONDS injects one fault after another, each
# undone before the next, with a few healthy seconds between:
#
#   kill     SIGKILL the server, start it again 1-3 s later
#   stop     SIGSTOP it for 25 s (past the client's 10 s HTTP stall limit and
#            5 s completion wait, and the server's own 10 s transfer
#            deadline), then SIGCONT
#   link     veth1 (the server's) down for 4-8 s, then up
#
# After any fault that left rxe1's GSI QP in ERR (below), the server is
# killed, rxe1 re-created and the server started again, counted.
#   loss     netem on the bridge's two ports (both directions): 2% loss
#            and 1 ms delay, 15-25 s
#   delay    netem there: 20 ms delay with 5 ms jitter, 15-25 s
#   reorder  netem there: 1% duplicates and 10% reordered (2 ms delay for
#            the rest), 15-25 s
#
# Every kind is injected once at least, past FAULT_SECONDS if need be; in
# a short form (FAULT_SECONDS under 300, the lane's) the network's faults
# last 8-12 s.
#
# Then it tells the client that the faults are over (the client goes on for
# CALM_SECONDS and must end every thread on good transfers), stops the
# server, and checks that the kernel's RDMA resources (`rdma resource show`)
# are back where they were before either started. Prints the faults it
# injected and the client's tally; exits 0 when the client passed and the
# resources came back.
#
# Usage: soak-guest.sh SERVER SOAK OUT FAULT_SECONDS CALM_SECONDS
set -euo pipefail
server_bin=$1
soak_bin=$2
out=$3
fault_seconds=$4
calm_seconds=$5
mkdir -p "$out"
root=$(mktemp -d /tmp/soak-root.XXXXXX)
ready=$out/ready
calm=$out/calm
rm -f "$ready" "$calm" "$out"/server.log "$out"/faults.log "$out"/client.out "$out"/client.err
port=9000
key=soak-access
secret=soak-secret-key-0123456789

# Per device; without its index, which a re-created rxe1 changes.
resources() { rdma resource show | sed 's/^[0-9]*: //; s/  */ /g'; }
baseline=$(resources)

server_pid=
start_server() {
    "$server_bin" --root "$root" --listen "192.0.2.2:$port" --access-key "$key" \
        --secret-key "$secret" --bucket soak --device rxe1 >>"$out/server.log" 2>&1 &
    server_pid=$!
    local _
    for _ in $(seq 300); do
        ss -Hltn "sport = :$port" | grep -q . && return 0
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "soak-guest: the server did not listen on 192.0.2.2:$port" >&2
    tail -20 "$out/server.log" >&2
    return 1
}

# The seconds since the faults began, for the log.
t0=$SECONDS
note() { echo "soak-guest: +$((SECONDS - t0))s $*" | tee -a "$out/faults.log" >&2; }

# netem sits on the bridge's ports, the switch between the hosts (port0
# sends to the client, port1 to the server), never on rxe's own netdevs:
# rxe takes a packet that its netdev's qdisc drops, or a qdisc being
# replaced, as a failed send and moves the QP to ERR, even its GSI QP (the
# CM's), which the kernel never brings back. What the switch drops the
# sender never hears of: that is the loss wanted. Its queue is deep enough
# not to overflow under the delays.
netem_all() {
    local port
    for port in port0 port1; do tc qdisc replace dev "$port" root netem limit 100000 "$@"; done
}
netem_off() {
    local port
    for port in port0 port1; do tc qdisc del dev "$port" root 2>/dev/null || true; done
}
link_up() {
    ip link set veth1 up
    # Taking a link down drops the routes and neighbours through it:
    # guest.sh's.
    ip route replace 192.0.2.1 dev veth1 src 192.0.2.2 table 11
    ip neigh replace 192.0.2.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
    local _
    # The ports come back with their GIDs (the RoCE v2 address is index 1).
    for _ in $(seq 100); do
        grep -qs ':ffff:c000:0202' /sys/class/infiniband/rxe1/ports/1/gids/1 &&
            grep -qs ':ffff:c000:0201' /sys/class/infiniband/rxe0/ports/1/gids/1 && return 0
        sleep 0.1
    done
    note "the GIDs did not come back after the link came up"
    return 1
}
hold() { sleep "$(($1 + RANDOM % ($2 - $1 + 1)))"; }

# Whether DEVICE's GSI QP (QP1, which carries the CM's messages) is in ERR.
gsi_dead() { rdma resource show qp link "$1/1" 2>/dev/null | grep -q 'type GSI state ERR'; }

# rxe moves even its GSI QP to ERR when a send fails on a port that is down
# (a CM message in flight when the link went), and the kernel's MAD layer
# never brings QP1 back: no connection is made on that device again. The
# server's operator would restart it on a reset NIC; so does this, counted.
revive_server_device() {
    gsi_dead rxe1 || return 0
    note "$1: rxe1's GSI QP is in ERR: the server restarts on a new rxe1"
    injected[gsi-$1]=$((${injected[gsi-$1]:-0} + 1))
    kill -KILL "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    rdma link delete rxe1
    rdma link add rxe1 type rxe netdev veth1
    local _
    for _ in $(seq 100); do
        grep -qs ':ffff:c000:0202' /sys/class/infiniband/rxe1/ports/1/gids/1 && break
        sleep 0.1
    done
    start_server
    note "$1: server restarted on the new rxe1, pid $server_pid"
}

start_server
echo "soak-guest: server pid $server_pid on rxe1, $(head -1 "$out/server.log")"
"$soak_bin" --endpoint "http://192.0.2.2:$port" --access-key "$key" --secret-key "$secret" \
    --nic rxe0 --threads "${HIPOBJ_SOAK_THREADS:-16}" --ready-file "$ready" --calm-file "$calm" \
    --calm-seconds "$calm_seconds" --max-seconds "$((fault_seconds + 600))" soak \
    >"$out/client.out" 2>"$out/client.err" &
client=$!
for _ in $(seq 600); do
    [[ -e $ready ]] && break
    kill -0 "$client" 2>/dev/null || break
    sleep 0.1
done
[[ -e $ready ]] || { echo "soak-guest: the client did not start" >&2; cat "$out/client.err" >&2; exit 1; }

declare -A injected=()
# HIPOBJ_SOAK_FAULTS (space-separated) picks some, for a closer look at one.
read -r -a faults <<<"${HIPOBJ_SOAK_FAULTS:-kill stop link loss delay reorder}"
i=0
t0=$SECONDS
# Every kind once at least, however short FAULT_SECONDS; a short form
# (under 300 s: the lane's) holds the network's faults 8-12 s, not 15-25.
if ((fault_seconds < 300)); then netem_hold=(8 12); else netem_hold=(15 25); fi
while { ((SECONDS - t0 < fault_seconds)) || ((i < ${#faults[@]})); } && kill -0 "$client" 2>/dev/null; do
    hold 4 10
    fault=${faults[i % ${#faults[@]}]}
    i=$((i + 1))
    injected[$fault]=$((${injected[$fault]:-0} + 1))
    case $fault in
        kill)
            note "kill: SIGKILL server $server_pid"
            kill -KILL "$server_pid"
            wait "$server_pid" 2>/dev/null || true
            hold 1 3
            start_server
            note "kill: restarted, pid $server_pid"
            ;;
        stop)
            note "stop: SIGSTOP server $server_pid for 25 s"
            kill -STOP "$server_pid"
            sleep 25
            kill -CONT "$server_pid"
            note "stop: SIGCONT"
            ;;
        link)
            note "link: veth1 down"
            ip link set veth1 down
            hold 4 8
            link_up
            note "link: veth1 up"
            ;;
        loss)
            note "loss: netem loss 2% delay 1ms"
            netem_all loss 2% delay 1ms
            hold "${netem_hold[@]}"
            netem_off
            note "loss: off"
            ;;
        delay)
            note "delay: netem delay 20ms 5ms"
            netem_all delay 20ms 5ms
            hold "${netem_hold[@]}"
            netem_off
            note "delay: off"
            ;;
        reorder)
            note "reorder: netem delay 2ms reorder 10% duplicate 1%"
            netem_all delay 2ms reorder 10% duplicate 1%
            hold "${netem_hold[@]}"
            netem_off
            note "reorder: off"
            ;;
    esac
    revive_server_device "$fault"
    if gsi_dead rxe0; then
        # The client's port never goes down (the bridge keeps its carrier):
        # this would be new.
        note "after $fault: rxe0's GSI QP is in ERR: the client can make no connection again; no more faults"
        injected[client-gsi]=$((${injected[client-gsi]:-0} + 1))
        break
    fi
done
netem_off
touch "$calm"
note "calm: ${#faults[@]} kinds, $i faults"
# What the client holds half way through the calm period, for the record.
sleep "$((calm_seconds / 2))"
{
    rdma resource show cm_id
    rdma resource show qp
} >"$out/calm-resources.txt" 2>&1 || true
status=0
wait "$client" || status=$?
kill -TERM "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
# The last server's memory budget, when it stopped: nothing may be held but
# the buffers it said it leaked (the NIC might still have used them).
budget=$(awk '/listening on/ { leaked = 0 }
    / byte buffer is leaked/ { for (i = 1; i <= NF; i++) if ($i == "byte") leaked += $(i - 1) }
    /stopped; .* bytes of the RDMA memory budget still held/ { for (i = 1; i <= NF; i++) if ($i == "bytes") held = $(i - 1) }
    END { print (held == "" ? "none" : held), leaked + 0 }' "$out/server.log")

echo "== faults injected in $fault_seconds s:"
for fault in "${faults[@]}"; do echo "soak: fault $fault ${injected[$fault]:-0}"; done
for fault in "${faults[@]}"; do
    echo "soak: fault $fault, then rxe1 re-created (its GSI QP left in ERR) ${injected[gsi-$fault]:-0}"
done
echo "soak: rxe0's GSI QP found in ERR ${injected[client-gsi]:-0}"
echo "== the client (exit status $status):"
cat "$out/client.out"
grep -v '^$' "$out/client.err" | tail -40 >&2 || true
# The kernel reclaims a killed process's resources by itself, a moment later.
now=
for _ in $(seq 60); do
    now=$(resources)
    [[ $now == "$baseline" ]] && break
    sleep 0.5
done
echo "== the kernel's RDMA resources, before: $(echo "$baseline" | tr '\n' ';')"
echo "== and after: $(echo "$now" | tr '\n' ';')"
echo "soak: the last server's RDMA memory budget when it stopped: ${budget% *} bytes held, ${budget#* } of them buffers it leaked"
if [[ ${budget% *} != "${budget#* }" ]]; then
    echo "soak-guest: the server's memory budget was not given back" >&2
    status=1
fi
if [[ $now != "$baseline" ]]; then
    echo "soak-guest: the kernel's RDMA resources did not come back" >&2
    status=1
fi
rm -rf "$root"
exit "$status"
