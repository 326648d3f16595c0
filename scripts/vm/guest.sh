#!/usr/bin/env bash
# Runs inside the VM: brings up Soft-RoCE (rxe0 over a dummy netdev with the
# documentation address 192.0.2.1; the VM has no NIC, so nothing leaves it),
# then runs the given command and reports its status.
#
#   guest.sh [--mtu BYTES] [--veth] COMMAND...
#
# --mtu: the netdev's MTU (default 1500, so rxe's path MTU is 1024; 9000
# gives 4096, a RoCE fabric's). rxe takes the largest IB MTU that fits in
# the netdev's MTU less its 80 bytes of headers; the command finds that
# path MTU in HIPOBJ_LANE_PATH_MTU, and the lane's tests check that the
# device and their transfers run at it.
#
# --veth: a fabric that packets really cross, for the fault soak. rxe on one
# address sends to another of its host's addresses by a shortcut that skips
# the netdev (so netem and link state would not touch it), and rxe in this
# kernel serves the initial network namespace only. So both ends live there:
# rxe0 on veth0 (192.0.2.1, the client's) and rxe1 on veth1 (192.0.2.2, the
# server's), each veth's peer a port of the bridge br0 (the switch between
# them), with policy routing that sends each one's packets to the other out
# of its own veth (the local table is looked up for packets that arrive on a
# veth, and for the CM's check of a request's addresses, which names the
# receiving device). `tc netem` on either veth then acts on the RDMA traffic
# and on the HTTP between the two addresses alike, and `ip link set veth1
# down` takes the server's link down without the client's port noticing.
set -euo pipefail
netdev_mtu=1500
veth=0
while [[ ${1:-} == --* ]]; do
    case $1 in
        --mtu)
            netdev_mtu=$2
            shift 2
            ;;
        --veth)
            veth=1
            shift
            ;;
        *) break ;;
    esac
done
path_mtu=256
for m in 4096 2048 1024 512 256; do
    if ((netdev_mtu - 80 >= m)); then
        path_mtu=$m
        break
    fi
done
export HIPOBJ_LANE_PATH_MTU=$path_mtu
modprobe ib_uverbs
modprobe rdma_rxe
modprobe rdma_ucm
ip link set lo up
if ((veth)); then
    modprobe veth
    modprobe bridge
    ip link add br0 type bridge
    ip link set br0 mtu "$netdev_mtu"
    ip link set br0 up
    for end in 0 1; do
        ip link add "veth$end" type veth peer name "port$end"
        ip link set "port$end" mtu "$netdev_mtu"
        ip link set "port$end" master br0
        ip link set "port$end" up
        ip link set "veth$end" mtu "$netdev_mtu"
        ip addr add "192.0.2.$((end + 1))/32" dev "veth$end"
        ip link set "veth$end" up
    done
    for conf in all default veth0 veth1; do
        # Packets from the host's own addresses arrive on the veths.
        sysctl -qw "net.ipv4.conf.$conf.rp_filter=0" "net.ipv4.conf.$conf.accept_local=1"
    done
    ip rule add pref 1 iif veth0 lookup local
    ip rule add pref 1 iif veth1 lookup local
    ip rule add pref 2 oif veth0 to 192.0.2.1 lookup local
    ip rule add pref 2 oif veth1 to 192.0.2.2 lookup local
    ip route add 192.0.2.2 dev veth0 src 192.0.2.1 table 10
    ip route add 192.0.2.1 dev veth1 src 192.0.2.2 table 11
    ip rule add pref 10 to 192.0.2.2 lookup 10
    ip rule add pref 10 to 192.0.2.1 lookup 11
    ip rule add pref 100 lookup local
    ip rule del pref 0 lookup local
    # No ARP across the pair (each end's address is local to the other).
    ip neigh replace 192.0.2.2 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
    ip neigh replace 192.0.2.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
    rdma link add rxe0 type rxe netdev veth0
    rdma link add rxe1 type rxe netdev veth1
    devices="rxe0:0201 rxe1:0202"
else
    modprobe dummy numdummies=0
    ip link add dummy0 type dummy
    ip link set dummy0 mtu "$netdev_mtu"
    ip addr add 192.0.2.1/24 dev dummy0
    ip link set dummy0 up
    rdma link add rxe0 type rxe netdev dummy0
    devices="rxe0:0201"
fi
for device in $devices; do
    name=${device%:*}
    for _ in $(seq 50); do
        [[ -e /dev/infiniband/uverbs0 ]] && grep -qs ":ffff:c000:${device#*:}" "/sys/class/infiniband/$name/ports/1/gids/1" && break
        sleep 0.1
    done
    echo "guest: $name on $(rdma link show "$name/1" | awk '{ print $NF }') (MTU $netdev_mtu): $(cat "/sys/class/infiniband/$name/ports/1/state"), active MTU $(ibv_devinfo -d "$name" 2>/dev/null | awk '/active_mtu:/ { print $2; exit }'), expected $path_mtu"
done
status=0
"$@" || status=$?
echo "guest: exit status $status"
exit "$status"
