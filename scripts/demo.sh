#!/usr/bin/env bash
# The demo: sets the machine up (packages, then the Soft-RoCE VM: QEMU, a
# kernel, virtme-ng), builds libhipobj.so, installs it into a prefix, builds
# the C examples against it, the hipobj command and the RDMA-enabled S3
# server, then boots the VM and runs real PUTs and GETs over the kernel's
# rdma_rxe through the library (scripts/vm/demo-guest.sh): the command
# first, then the C examples, then the server as a gateway in front of a
# three-node Garage cluster (Garage built once per machine by
# scripts/garage.sh: about ten minutes the first time). Each transfer
# prints its bytes, its time and whether RDMA or the HTTP fallback carried
# it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/vm/setup.sh

echo "== building the RDMA S3 server and the hipobj command"
cargo build --locked --release --features s3-server,cli --bin hipobj-s3-server --bin hipobj
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
server="$target/release/hipobj-s3-server"
command="$target/release/hipobj"

echo "== installing libhipobj.so and building the C examples against it"
bash scripts/build-examples.sh

echo "== Garage, the distributed S3 store the gateway part of the demo fronts"
garage=$(bash scripts/garage.sh)

echo "== booting the VM (Soft-RoCE; software emulation, about 15 s)"
bash scripts/vm/run.sh bash scripts/vm/demo-guest.sh "$server" "$target/examples" "$command" "$garage"
