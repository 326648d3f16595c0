#!/usr/bin/env bash
# Regenerates src/platform/verbs/sys.rs: the libibverbs ABI types hipobj
# uses, from rdma-core's <infiniband/verbs.h>. Types and constants only: the
# functions are resolved with dlopen (src/platform/verbs/loader.rs) and the
# header's static inline verbs are re-implemented in src/platform/verbs/inline.rs.
#
# Pinned input: rdma-core 44.0 (Debian bookworm's libibverbs-dev 44.0-2,
# pkg-config libibverbs 1.14.44.0). Needs: libibverbs-dev, libclang-dev and
# bindgen-cli 0.73.2 (cargo install bindgen-cli --version 0.73.2 --locked).
# tests/verbs_layout.rs checks the result against the installed header.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
script=$(basename "$0")
# shellcheck source=scripts/gen-sys-common.sh
source "$root/scripts/gen-sys-common.sh"
out="$root/src/platform/verbs/sys.rs"
header=/usr/include/infiniband/verbs.h
check_inputs "$header" libibverbs libibverbs-dev

types=(
    ibv_device ibv_context ibv_context_ops ibv_device_attr ibv_port_attr ibv_gid
    ibv_pd ibv_mr ibv_mw ibv_cq ibv_comp_channel ibv_qp ibv_qp_init_attr ibv_qp_cap
    ibv_qp_attr ibv_ah_attr ibv_global_route ibv_sge ibv_send_wr ibv_recv_wr
    ibv_mw_bind_info ibv_wc ibv_async_event
    ibv_qp_state ibv_mtu ibv_port_state ibv_qp_type ibv_wr_opcode ibv_send_flags
    ibv_wc_status ibv_wc_opcode ibv_wc_flags ibv_access_flags ibv_qp_attr_mask
    ibv_mw_type ibv_event_type ibv_device_cap_flags
)
# Reached only through pointers (or, for ibv_mw_bind, a type-1 bind this
# library never makes): kept as blobs of the right size and alignment, so
# nothing of them is generated or needs auditing.
opaque=(ibv_srq ibv_ah ibv_mw_bind ibv_wq)

args=(
    --no-layout-tests --no-doc-comments --no-prepend-enum-name
    --default-enum-style moduleconsts
    --rust-target 1.82 --rust-edition 2021
    --ctypes-prefix ::std::ffi
    --blocklist-function '.*'
    --allowlist-var 'IBV_LINK_LAYER_.*'
    --constified-enum 'IBV_LINK_LAYER_.*'
)
for t in "${types[@]}"; do args+=(--allowlist-type "$t"); done
for t in "${opaque[@]}"; do args+=(--opaque-type "$t"); done

write_sys "$out" "$header" "libibverbs ABI types" "tests/verbs_layout.rs" "${args[@]}"
