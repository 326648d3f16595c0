# Shared by scripts/gen-verbs-sys.sh and scripts/gen-cm-sys.sh (sourced, not
# run): runs bindgen and writes a sys.rs with the command it came from.

# The pinned inputs: rdma-core 44.0's headers, bindgen-cli 0.73.2.
want_rdma_core=44.0
want_bindgen="bindgen 0.73.2"

# check_inputs HEADER PKG_CONFIG_NAME DEV_PACKAGE: fails unless the header is
# installed from the pinned rdma-core and the pinned bindgen is on PATH.
check_inputs() {
    local header=$1 lib=$2 dev=$3 have
    [[ -f $header ]] || { echo "$script: $header not found: install $dev" >&2; exit 1; }
    have=$(pkg-config --modversion "$lib")
    [[ $have == *".$want_rdma_core" ]] || { echo "$script: $lib $have installed, rdma-core $want_rdma_core pinned" >&2; exit 1; }
    [[ $(bindgen --version) == "$want_bindgen" ]] || { echo "$script: $want_bindgen needed, found $(bindgen --version)" >&2; exit 1; }
}

# write_sys OUT HEADER DESCRIPTION LAYOUT_TEST BINDGEN_ARGS...
# DESCRIPTION is the first doc line's subject ("libibverbs ABI types");
# $script must be set.
write_sys() {
    local out=$1 header=$2 what=$3 test=$4
    shift 4
    local args=("$@")
    local body
    body=$(bindgen "${args[@]}" "$header" -- -I/usr/include)
    local pkg
    pkg=$(dpkg-query -S "$header" | cut -d: -f1)
    {
        cat <<HEADER
//! $what, generated from rdma-core $want_rdma_core's
//! \`<${header#/usr/include/}>\` (Debian $pkg 44.0-2) by
//! \`scripts/$script\` with $want_bindgen:
//!
//! \`\`\`text
//! bindgen \\
HEADER
        # One option per line, with its value.
        local i line
        for ((i = 0; i < ${#args[@]}; i++)); do
            line=${args[i]}
            if ((i + 1 < ${#args[@]})) && [[ ${args[i + 1]} != --* ]]; then
                ((i += 1))
                line+=" '${args[i]}'"
            fi
            printf '//!   %s \\\n' "$line"
        done
        cat <<HEADER
//!   $header -- -I/usr/include
//! \`\`\`
//!
//! Do not edit: rerun the script. \`$test\` compares sizes,
//! offsets and constants with the installed header.

// Generated code keeps C's names, and holds items this crate does not use.
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all,
    clippy::pedantic
)]

HEADER
        printf '%s\n' "$body"
    } > "$out"
    rustfmt --edition 2021 "$out"
    echo "$script: wrote $out"
}
