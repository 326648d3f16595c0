#!/usr/bin/env bash
# On the host, before the lane's VM boots (it has no network): what the
# model streamer's lane step needs (scripts/vm/streamer-guest.sh).
#
#   1. the Run:ai model streamer's two 0.17.1 wheels, in one pip command
#      (both write into the same runai_model_streamer/ directory; a second
#      --target install would not merge), without their dependencies (torch
#      is not needed to drive libstreamer.so), into target/streamer-site;
#   2. safetensors into the Python package's venv (target/pyvenv, which
#      scripts/python-test.sh makes), to write the model;
#   3. our libstreamers3.so (crate streamers3/, release), copied alone into
#      target/streamer-ours, the directory the lane puts on LD_LIBRARY_PATH.
#
# Idempotent. Prints the two directories' paths on its last line:
#   SITE OURS_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
venv="$target/pyvenv"
[[ -x "$venv/bin/python" ]] || { echo "streamer-prepare: $venv is missing: run scripts/python-test.sh first" >&2; exit 1; }
version=0.17.1
site="$target/streamer-site"
if ! grep -qs "^Version: $version\$" "$site"/runai_model_streamer_s3-"$version".dist-info/METADATA ||
    [[ ! -f "$site/runai_model_streamer/libstreamer/lib/libstreamers3.so" ]]; then
    rm -rf "$site"
    "$venv/bin/python" -m pip install --quiet --no-deps --target "$site" \
        "runai-model-streamer==$version" "runai-model-streamer-s3==$version" >&2
fi
"$venv/bin/python" -m pip install --quiet "safetensors==0.8.0" >&2
cargo build --locked --release -p hipobj-streamers3 >&2
ours="$target/streamer-ours"
mkdir -p "$ours"
cp "$target/release/libstreamers3.so" "$ours/libstreamers3.so.new"
mv "$ours/libstreamers3.so.new" "$ours/libstreamers3.so"
echo "$site $ours"
