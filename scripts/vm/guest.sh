#!/usr/bin/env bash
# Runs inside the VM: brings up Soft-RoCE (rxe0 over a dummy netdev with the
# documentation address 192.0.2.1; the VM has no NIC, so nothing leaves it),
# then runs the given command and reports its status.
set -euo pipefail
modprobe ib_uverbs
modprobe rdma_rxe
modprobe rdma_ucm
modprobe dummy numdummies=0
ip link set lo up
ip link add dummy0 type dummy
ip addr add 192.0.2.1/24 dev dummy0
ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0
for _ in $(seq 50); do
    [[ -e /dev/infiniband/uverbs0 ]] && grep -qs ':ffff:c000:0201' /sys/class/infiniband/rxe0/ports/1/gids/1 && break
    sleep 0.1
done
echo "guest: rxe0 on dummy0 (192.0.2.1): $(cat /sys/class/infiniband/rxe0/ports/1/state)"
status=0
"$@" || status=$?
echo "guest: exit status $status"
exit "$status"
