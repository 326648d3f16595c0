#!/usr/bin/env bash
# The fake library for applications' tests, as an application uses it:
# installs the release library and the fake one (scripts/install.sh --fake)
# into a prefix, then builds the example CMake project examples/ctest-fake
# against that prefix and runs its ctest tests (success, a declined token,
# an injected verbs failure, a timeout), and builds its test program once
# more with pkg-config's hipobj-fake. Fails if any step fails.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
work="$target/fake-example"
rm -rf "$work"
mkdir -p "$work"

bash scripts/install.sh --prefix "$work/prefix" --fake

echo "== examples/ctest-fake against $work/prefix"
cmake -S examples/ctest-fake -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/cmake.log" ||
    { cat "$work/cmake.log"; exit 1; }
cmake --build "$work/build"
# The test program loads the fake library, not the release one.
if ! ldd "$work/build/test_app" | grep -q "$work/prefix/lib/hipobj-fake/libhipobj.so.0"; then
    ldd "$work/build/test_app"
    echo "fake-example: test_app does not load the fake library" >&2
    exit 1
fi
ctest --test-dir "$work/build" --output-on-failure

echo "== the same test program with pkg-config's hipobj-fake"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -pedantic -Werror -o "$work/test_app_pc" \
    examples/ctest-fake/test_app.c examples/ctest-fake/app.c $(pkg-config --cflags --libs hipobj-fake)
HIPOBJ_COMPLETION_TIMEOUT_MS=300 "$work/test_app_pc" declined
echo "fake-example: ok"
