#!/usr/bin/env bash
# The model streamer's S3 backend (streamers3/, libstreamers3.so) under the
# streamer's own published outer library: installs runai-model-streamer and
# runai-model-streamer-s3 0.17.1 from PyPI (no torch: --no-deps, into
# target/streamer-test/site, kept between runs), safetensors, NumPy and
# pytest into a venv beside it, builds our library (release) and the
# gateway (hipobj-s3-server, the suite's debug feature set), and runs
# streamers3/tests/test_streamer.py with LD_LIBRARY_PATH naming our
# library's directory, as a user installs it: plain HTTP, there being no
# RDMA device here. Then the RDMA path on hipobj's fake RDMA world: a test
# build of the library (feature fake-world, the suite's debug build of the
# workspace: target/debug/) under the same outer, its S3 side an in-process look-alike
# (streamers3/tests/test_streamer_rdma.py, with awscrt for the CRC64/NVME
# the gateway sends). Real RDMA runs in the VM lane.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
source scripts/features.sh
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
work="$target/streamer-test"
venv="$work/venv"
site="$work/site"
python=${PYTHON:-python3}
mkdir -p "$work"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet safetensors numpy pytest awscrt
# Both wheels in one command: they write into the same package directory,
# and a second --target install into it would not merge.
if [[ ! -f "$site/runai_model_streamer/libstreamer/lib/libstreamers3.so" ]]; then
    rm -rf "$site"
    "$venv/bin/python" -m pip install --quiet --no-deps --target "$site" \
        runai-model-streamer==0.17.1 runai-model-streamer-s3==0.17.1
fi
cargo build --locked --release -p hipobj-streamers3
build_test_server
# The test build with the suite's features, for the whole workspace, with
# its test targets (so that the dependencies' features are the suite's:
# nothing compiled again).
cargo build --locked --workspace --features "$workspace_features" --lib --tests
library="$target/release/libstreamers3.so"
# The file exports the twelve functions and nothing else, under its SONAME.
exports=$(nm -D --defined-only "$library" | awk '{print $3}' | sort | tr '\n' ' ')
expected="obj_cancel_all_reads obj_close_backend obj_create_client obj_free_file_list obj_get_backend_config obj_get_backend_shutdown_policy obj_list_files obj_open_backend obj_remove_all_clients obj_remove_client obj_request_read obj_wait_for_completions "
if [[ "$exports" != "$expected" ]]; then
    echo "libstreamers3.so exports: $exports" >&2
    echo "expected:                 $expected" >&2
    exit 1
fi
if ! readelf -d "$library" | grep -q 'SONAME.*\[libstreamers3.so\]'; then
    echo "libstreamers3.so has no SONAME libstreamers3.so" >&2
    exit 1
fi
# Our library alone in the directory LD_LIBRARY_PATH names.
lib_dir="$work/lib"
rm -rf "$lib_dir"
mkdir -p "$lib_dir"
cp "$library" "$lib_dir/libstreamers3.so"
fake_dir="$work/fake-lib"
rm -rf "$fake_dir"
mkdir -p "$fake_dir"
cp "$target/debug/libstreamers3.so" "$fake_dir/libstreamers3.so"
cd "$work"
rm -f stats.json stats-fake.json
env LD_LIBRARY_PATH="$lib_dir" \
    STREAMERS3_SITE="$site" \
    STREAMERS3_LIBRARY="$lib_dir/libstreamers3.so" \
    HIPOBJ_S3_SERVER="$target/debug/hipobj-s3-server" \
    HIPOBJ_STREAMER_STATS="$work/stats.json" \
    RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0 \
    RUNAI_STREAMER_CHUNK_BYTESIZE=$((5 << 20)) \
    AWS_EC2_METADATA_DISABLED=true \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/streamers3/tests/test_streamer.py" "$@"
env LD_LIBRARY_PATH="$fake_dir" \
    HIPOBJ_TEST_WORLD=1 \
    STREAMERS3_SITE="$site" \
    STREAMERS3_LIBRARY="$fake_dir/libstreamers3.so" \
    HIPOBJ_S3_SERVER="$target/debug/hipobj-s3-server" \
    HIPOBJ_STREAMER_STATS="$work/stats-fake.json" \
    RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0 \
    RUNAI_STREAMER_CHUNK_BYTESIZE=$((5 << 20)) \
    AWS_EC2_METADATA_DISABLED=true \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/streamers3/tests/test_streamer_rdma.py" "$@"
