#!/usr/bin/env bash
# Builds Garage (the S3 engine of the lane's three-node cluster,
# scripts/vm/garage-guest.sh) from the crate registry, once per machine,
# into a cache that outlives the work tree, and prints the binary's path.
#
#   garage.sh            build if needed, print the path
#
# The cache is ${HIPOBJ_CACHE:-$HOME/.cache/hipobj}/garage-VERSION-oLEVEL; a
# binary there that answers `--version` with VERSION is kept.
#
# Optimization level: HIPOBJ_GARAGE_OPT_LEVEL, 1 by default, without
# thin-local LTO: on two cores the build takes 264 s instead of about 700
# at Garage's release settings (opt-level 3), and its PUTs through the
# gateway run about a fifth slower (3 GiB: 35.3 s against 28.7 s), its GETs
# as fast (10.1 s against 9.9 s), 2026-12-04; the lanes test behaviour,
# and compare the gateway with the same Garage. For Garage's own figures
# (docs/performance.md), HIPOBJ_GARAGE_OPT_LEVEL=3. Features: the LMDB
# metadata engine (heed builds LMDB from the C source its crate ships) and
# bundled-libs (Garage refuses to build without it or system-libs: libsodium
# and zstd from the sources their crates ship, so no system library and no
# download beyond the crate registry); no SQLite, K2V, metrics or telemetry,
# which the lane never uses. `--locked`: the crate's own lock file, so the
# build is the one Garage's authors released.
set -euo pipefail
version=2.5.0
opt_level=${HIPOBJ_GARAGE_OPT_LEVEL:-1}
[[ $opt_level =~ ^[0-3]$ ]] || { echo "garage: HIPOBJ_GARAGE_OPT_LEVEL is 0 to 3, not $opt_level" >&2; exit 2; }
cache="${HIPOBJ_CACHE:-$HOME/.cache/hipobj}/garage-$version-o$opt_level"
garage="$cache/bin/garage"

answers() {
    [[ -x "$garage" ]] && "$garage" --version 2>/dev/null | grep -qwF "$version"
}

if ! answers; then
    command -v cargo >/dev/null || { echo "garage: cargo not found: install Rust (rustup, stable)" >&2; exit 1; }
    command -v cc >/dev/null || { echo "garage: no C compiler (LMDB and libsodium are built from source): run scripts/setup.sh" >&2; exit 1; }
    echo "garage: building Garage $version at opt-level $opt_level into $cache (minutes on two cores)" >&2
    mkdir -p "$cache"
    # A private target directory beside the cache, removed once the binary is
    # in place (its 1 GB of objects are not worth keeping for one binary),
    # kept after a failure so that a second attempt resumes.
    build="$cache/build"
    start=$SECONDS
    CARGO_PROFILE_RELEASE_OPT_LEVEL=$opt_level CARGO_PROFILE_RELEASE_LTO=off \
        cargo install garage --version "$version" --locked --no-default-features --features bundled-libs,lmdb \
        --root "$cache" --target-dir "$build" --quiet
    rm -rf "$build"
    answers || { echo "garage: $garage was built but does not answer --version with v$version" >&2; exit 1; }
    echo "garage: built in $((SECONDS - start)) s, $(du -h "$garage" | cut -f1)" >&2
fi
echo "$garage"
