#!/usr/bin/env bash
# Installs what building and testing hipobj needs on a Debian or Ubuntu
# machine with a Rust toolchain: a C/C++ compiler, CMake and pkg-config for
# the consumer tests, libibverbs so that init can look for RDMA devices, and
# tmux for the terminal test of the command's progress bar.
# Packages already present are not reinstalled; run as root (or with sudo).
set -euo pipefail

packages=(gcc g++ make cmake pkg-config libc6-dev libcurl4-openssl-dev curl libibverbs1 libibverbs-dev librdmacm1 librdmacm-dev ibverbs-providers libamdhip64-5 libamdhip64-dev libhsa-runtime64-1 libhsa-runtime-dev tmux)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

for tool in cargo rustfmt cargo-clippy; do
    command -v "$tool" >/dev/null || { echo "setup: $tool not found: install Rust (rustup, stable, with rustfmt and clippy)" >&2; exit 1; }
done
echo "setup: ready"
