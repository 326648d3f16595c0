#!/usr/bin/env bash
# Builds the C examples (get-object, put-object, token-get), and the fault
# soak's client (tests/soak/soak.c), against an
# installed libhipobj, as an application would: through pkg-config (hipobj,
# libcurl).
#
# Usage: scripts/build-examples.sh [--prefix DIR] [--out DIR] [--lib PATH | --no-build]
#
#   --prefix DIR  where scripts/install.sh installs the library first
#                 (default ${CARGO_TARGET_DIR:-target}/demo-prefix)
#   --out DIR     where the programs go (default ${CARGO_TARGET_DIR:-target}/examples)
#   --lib PATH    install this built libhipobj.so (passed to install.sh)
#   --no-build    install the release library already built (same)
#
# The programs are linked with an rpath to the prefix's lib. They are
# compiled as C11 with -Wall -Wextra -Wpedantic -Werror;
# HIPOBJ_EXAMPLES_CFLAGS adds flags (for example
# "-fsanitize=address,undefined -fno-omit-frame-pointer"), CC picks the
# compiler (default cc). Needs libcurl's development files
# (libcurl4-openssl-dev, installed by scripts/setup.sh).
set -euo pipefail

die() {
    printf 'build-examples.sh: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,22s/^# \{0,1\}//p' "$0"
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in
    /*) ;;
    *) target_dir="$root/$target_dir" ;;
esac

prefix="$target_dir/demo-prefix"
out="$target_dir/examples"
install_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--prefix needs a directory"
            prefix="$2"
            shift 2
            ;;
        --prefix=*)
            prefix="${1#--prefix=}"
            [ -n "$prefix" ] || die "--prefix needs a directory"
            shift
            ;;
        --out)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--out needs a directory"
            out="$2"
            shift 2
            ;;
        --out=*)
            out="${1#--out=}"
            [ -n "$out" ] || die "--out needs a directory"
            shift
            ;;
        --lib)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--lib needs the path of a built libhipobj.so"
            install_args+=(--lib "$2")
            shift 2
            ;;
        --lib=*)
            install_args+=(--lib "${1#--lib=}")
            shift
            ;;
        --no-build)
            install_args+=(--no-build)
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            usage >&2
            die "unknown argument: $1"
            ;;
    esac
done
case "$prefix" in
    /*) ;;
    *) prefix="$PWD/$prefix" ;;
esac

bash "$root/scripts/install.sh" --prefix "$prefix" ${install_args[@]+"${install_args[@]}"}

command -v pkg-config >/dev/null 2>&1 || die "pkg-config not found (run scripts/setup.sh)"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pkg-config --exists hipobj || die "pkg-config finds no hipobj in $prefix/lib/pkgconfig"
pkg-config --exists libcurl ||
    die "pkg-config finds no libcurl: install libcurl4-openssl-dev (scripts/setup.sh does)"
read -r -a pkg_cflags <<<"$(pkg-config --cflags hipobj libcurl)"
read -r -a pkg_libs <<<"$(pkg-config --libs hipobj libcurl)"
extra=()
if [ -n "${HIPOBJ_EXAMPLES_CFLAGS:-}" ]; then
    read -r -a extra <<<"$HIPOBJ_EXAMPLES_CFLAGS"
fi
read -r -a cc <<<"${CC:-cc}"
[ ${#cc[@]} -gt 0 ] || cc=(cc)

mkdir -p "$out"
flags=(-std=c11 -Wall -Wextra -Wpedantic -Werror -O2 -g ${extra[@]+"${extra[@]}"})
src="$root/examples"

"${cc[@]}" "${flags[@]}" ${pkg_cflags[@]+"${pkg_cflags[@]}"} -c "$src/s3common.c" \
    -o "$out/s3common.o" || die "compiling examples/s3common.c failed"
for prog in get-object put-object token-get; do
    "${cc[@]}" "${flags[@]}" ${pkg_cflags[@]+"${pkg_cflags[@]}"} -I"$src" \
        -o "$out/$prog" "$src/$prog.c" "$out/s3common.o" \
        ${pkg_libs[@]+"${pkg_libs[@]}"} -pthread -ldl -Wl,-rpath,"$prefix/lib" ||
        die "compiling examples/$prog.c failed"
done
# The fault soak's client (scripts/vm/soak.sh), an application of the same
# kind: built the same way, beside them.
"${cc[@]}" "${flags[@]}" ${pkg_cflags[@]+"${pkg_cflags[@]}"} -I"$src" \
    -o "$out/soak" "$root/tests/soak/soak.c" "$out/s3common.o" \
    ${pkg_libs[@]+"${pkg_libs[@]}"} -pthread -ldl -Wl,-rpath,"$prefix/lib" ||
    die "compiling tests/soak/soak.c failed"
rm -f "$out/s3common.o"
printf 'Built get-object, put-object, token-get and soak in %s (libhipobj from %s)\n' "$out" "$prefix"
