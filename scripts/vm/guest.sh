#!/usr/bin/env bash
# Runs inside the VM: brings up Soft-RoCE (rxe0 over a dummy netdev with the
# documentation address 192.0.2.1; the VM has no NIC, so nothing leaves it),
# then runs the given command and reports its status.
#
#   guest.sh [--mtu BYTES] COMMAND...
#
# --mtu: the netdev's MTU (default 1500, so rxe's path MTU is 1024; 9000
# gives 4096, a RoCE fabric's). rxe takes the largest IB MTU that fits in
# the netdev's MTU less its 80 bytes of headers; the command finds that
# path MTU in HIPOBJ_LANE_PATH_MTU, and the lane's tests check that the
# device and their transfers run at it.
set -euo pipefail
netdev_mtu=1500
if [[ ${1:-} == --mtu ]]; then
    netdev_mtu=$2
    shift 2
fi
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
modprobe dummy numdummies=0
ip link set lo up
ip link add dummy0 type dummy
ip link set dummy0 mtu "$netdev_mtu"
ip addr add 192.0.2.1/24 dev dummy0
ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0
for _ in $(seq 50); do
    [[ -e /dev/infiniband/uverbs0 ]] && grep -qs ':ffff:c000:0201' /sys/class/infiniband/rxe0/ports/1/gids/1 && break
    sleep 0.1
done
echo "guest: rxe0 on dummy0 (192.0.2.1, MTU $netdev_mtu): $(cat /sys/class/infiniband/rxe0/ports/1/state), active MTU $(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu:/ { print $2; exit }'), expected $path_mtu"
status=0
"$@" || status=$?
echo "guest: exit status $status"
exit "$status"
