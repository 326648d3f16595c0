#!/usr/bin/env bash
# Installs libhipobj into a prefix.
#
# Usage: scripts/install.sh --prefix DIR [--no-build] [--lib PATH] [--fake]
#                           [--fake-lib PATH]
#
#   --prefix DIR    where to install (required; a relative DIR is taken from
#                   the current directory)
#   --no-build      do not run cargo; install the libraries already built
#   --lib PATH      install this built libhipobj.so instead of the release
#                   build (implies --no-build)
#   --fake          also install the fake library, for applications' tests
#   --fake-lib PATH install this built fake library (implies --fake)
#
# By default it runs `cargo build --release --locked` and installs
# ${CARGO_TARGET_DIR:-target}/release/libhipobj.so. It installs:
#
#   DIR/lib/libhipobj.so.M.m.p                (M.m.p: Cargo.toml's version)
#   DIR/lib/libhipobj.so.M -> libhipobj.so.M.m.p
#   DIR/lib/libhipobj.so   -> libhipobj.so.M
#   DIR/include/hipobj/hipobj.h               (#include <hipobj.h>)
#   DIR/lib/cmake/hipobj/hipobjConfig.cmake   (find_package(hipobj CONFIG))
#   DIR/lib/cmake/hipobj/hipobjConfigVersion.cmake
#   DIR/lib/pkgconfig/hipobj.pc
#
# and with --fake the fake library (cargo build --profile fake -p
# hipobj-fake: target/fake/libhipobj_fake.so), the same ABI on a fake RDMA world
# with the controls of include/hipobj_fake.h, for applications' own tests:
#
#   DIR/lib/hipobj-fake/libhipobj.so.M.m.p, .so.M, .so
#   DIR/include/hipobj/hipobj_fake.h
#   DIR/lib/pkgconfig/hipobj-fake.pc          (hipobjConfig.cmake: hipobj::fake)
#
# Re-running over the same prefix overwrites the previous installation. When
# DESTDIR is set, files go to $DESTDIR/DIR while hipobj.pc still names DIR
# (staged installs for packaging). The CMake package finds everything relative
# to its own location, so the installed prefix can be moved.
set -euo pipefail

die() {
    printf 'install.sh: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '2,14s/^# \{0,1\}//p' "$0"
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

prefix=""
build=1
lib=""
fake=0
fake_lib=""
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
        --lib)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--lib needs the path of a built libhipobj.so"
            lib="$2"
            build=0
            shift 2
            ;;
        --lib=*)
            lib="${1#--lib=}"
            [ -n "$lib" ] || die "--lib needs the path of a built libhipobj.so"
            build=0
            shift
            ;;
        --no-build)
            build=0
            shift
            ;;
        --fake)
            fake=1
            shift
            ;;
        --fake-lib)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--fake-lib needs the path of a built fake libhipobj.so"
            fake_lib="$2"
            fake=1
            shift 2
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
[ -n "$prefix" ] || { usage >&2; die "missing --prefix DIR"; }

# Absolute prefix without trailing slashes: it is written into hipobj.pc.
case "$prefix" in
    /*) ;;
    *) prefix="$PWD/$prefix" ;;
esac
while [ "${#prefix}" -gt 1 ] && [ "${prefix%/}" != "$prefix" ]; do
    prefix="${prefix%/}"
done
dest="${DESTDIR:-}${prefix}"
[ "$dest" != "/" ] || dest=""

# The version comes from the [package] table of Cargo.toml.
manifest="$root/Cargo.toml"
[ -f "$manifest" ] || die "$manifest not found"
version="$(awk '
    /^[[:space:]]*\[/ { in_package = ($0 ~ /^[[:space:]]*\[package\][[:space:]]*(#.*)?$/); next }
    in_package && /^[[:space:]]*version[[:space:]]*=/ {
        sub(/^[^=]*=[[:space:]]*"/, ""); sub(/".*$/, ""); print; exit
    }' "$manifest")"
[[ "$version" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] ||
    die "cannot read a M.m.p version from the [package] table of $manifest (got '$version')"
major="${BASH_REMATCH[1]}"
minor="${BASH_REMATCH[2]}"
patch="${BASH_REMATCH[3]}"

header="$root/include/hipobj.h"
cmake_dir="$root/cmake"
for f in "$header" "$cmake_dir/hipobjConfig.cmake.in" \
    "$cmake_dir/hipobjConfigVersion.cmake.in" "$cmake_dir/hipobj.pc.in"; do
    [ -f "$f" ] || die "$f not found"
done

target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in
    /*) ;;
    *) target_dir="$root/$target_dir" ;;
esac
if [ -z "$lib" ]; then
    lib="$target_dir/release/libhipobj.so"
    if [ "$build" -eq 1 ]; then
        command -v cargo >/dev/null 2>&1 || die "cargo not found in PATH (or pass --no-build / --lib PATH)"
        (cd "$root" && cargo build --release --locked) || die "cargo build --release --locked failed"
    fi
fi
[ -f "$lib" ] || die "library $lib not found (build it with cargo build --release, or pass --lib PATH)"

if [ "$fake" -eq 1 ] && [ -z "$fake_lib" ]; then
    fake_lib="$target_dir/fake/libhipobj_fake.so"
    if [ "$build" -eq 1 ]; then
        (cd "$root" && cargo build --locked --profile fake -p hipobj-fake) ||
            die "cargo build --profile fake -p hipobj-fake failed"
    fi
fi
if [ "$fake" -eq 1 ]; then
    [ -f "$fake_lib" ] || die "fake library $fake_lib not found (build it with cargo build --profile fake -p hipobj-fake, or pass --fake-lib PATH)"
    [ -f "$root/include/hipobj_fake.h" ] || die "$root/include/hipobj_fake.h not found"
fi

soname="libhipobj.so.$major"
real="libhipobj.so.$version"

# Catch a library built with another version or without the SONAME, when
# readelf is available to tell.
if command -v readelf >/dev/null 2>&1; then
    found_soname="$(LC_ALL=C readelf -d "$lib" 2>/dev/null |
        sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')"
    [ "$found_soname" = "$soname" ] ||
        die "$lib has SONAME '${found_soname:-none}', expected '$soname'"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Escapes a string for the replacement side of a sed s|||.
sed_escape() {
    printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'
}

render() {
    sed -e "s|@HIPOBJ_VERSION@|$version|g" \
        -e "s|@HIPOBJ_VERSION_MAJOR@|$major|g" \
        -e "s|@HIPOBJ_VERSION_MINOR@|$minor|g" \
        -e "s|@HIPOBJ_VERSION_PATCH@|$patch|g" \
        -e "s|@PREFIX@|$(sed_escape "$prefix")|g" \
        "$1" >"$2"
    if grep -q '@[A-Z_]*@' "$2"; then
        die "unsubstituted placeholder left in $2 (from $1)"
    fi
}

render "$cmake_dir/hipobjConfig.cmake.in" "$tmp/hipobjConfig.cmake"
render "$cmake_dir/hipobjConfigVersion.cmake.in" "$tmp/hipobjConfigVersion.cmake"
render "$cmake_dir/hipobj.pc.in" "$tmp/hipobj.pc"

install -d -m 0755 "$dest/lib" "$dest/include/hipobj" "$dest/lib/cmake/hipobj" "$dest/lib/pkgconfig"
install -m 0755 "$lib" "$dest/lib/$real"
ln -sfn "$real" "$dest/lib/$soname"
ln -sfn "$soname" "$dest/lib/libhipobj.so"
install -m 0644 "$header" "$dest/include/hipobj/hipobj.h"
install -m 0644 "$tmp/hipobjConfig.cmake" "$tmp/hipobjConfigVersion.cmake" "$dest/lib/cmake/hipobj/"
install -m 0644 "$tmp/hipobj.pc" "$dest/lib/pkgconfig/hipobj.pc"

if [ "$fake" -eq 1 ]; then
    render "$cmake_dir/hipobj-fake.pc.in" "$tmp/hipobj-fake.pc"
    install -d -m 0755 "$dest/lib/hipobj-fake"
    install -m 0755 "$fake_lib" "$dest/lib/hipobj-fake/$real"
    ln -sfn "$real" "$dest/lib/hipobj-fake/$soname"
    ln -sfn "$soname" "$dest/lib/hipobj-fake/libhipobj.so"
    install -m 0644 "$root/include/hipobj_fake.h" "$dest/include/hipobj/hipobj_fake.h"
    install -m 0644 "$tmp/hipobj-fake.pc" "$dest/lib/pkgconfig/hipobj-fake.pc"
    printf 'Installed the fake libhipobj %s into %s/lib/hipobj-fake\n' "$version" "${dest:-/}"
fi
printf 'Installed libhipobj %s into %s\n' "$version" "${dest:-/}"
