#!/usr/bin/env bash
# Sets the machine up, builds and installs libhipobj into a prefix, then
# builds a C program against the installed header and library (through
# pkg-config) and runs it: it prints the version and what hipObjInit finds on
# this machine.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

prefix="${HIPOBJ_DEMO_PREFIX:-$PWD/target/demo-prefix}"
bash scripts/install.sh --prefix "$prefix"

out="${CARGO_TARGET_DIR:-target}/demo"
mkdir -p "$out"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046 # pkg-config prints several flags
cc -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$out/probe" examples/probe.c \
    $(pkg-config --cflags --libs hipobj) -Wl,-rpath,"$prefix/lib"

echo "== $prefix/lib/libhipobj.so exports"
nm -D --defined-only "$prefix/lib/libhipobj.so" | awk '{print "  " $3}'

for hint in "" "${HIPOBJ_DEMO_NIC:-rxe0}"; do
    echo "== probe ${hint:-(no NIC hint)}"
    set +e
    "$out/probe" ${hint:+"$hint"}
    status=$?
    set -e
    if ((status == 0)); then
        echo "   initialized: this machine has what libhipobj needs"
    else
        echo "   not initialized: the line starting 'hipobj:' above says why"
    fi
done
