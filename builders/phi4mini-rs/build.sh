#!/bin/sh
# Builds the Rust example builder into $1 (default phi4mini.wasm here) with Debian's rustc and its
# wasm32 standard library (packages rustc and libstd-rust-dev-wasm32: docs/builders.md).
set -eu
here=$(dirname "$0")
out=${1:-"$here/phi4mini.wasm"}
rustc=${RUSTC:-/usr/bin/rustc}
exec "$rustc" --edition 2021 --target wasm32-wasi -C opt-level=2 -C strip=symbols -o "$out" "$here/phi4mini.rs"
