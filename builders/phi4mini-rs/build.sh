#!/bin/sh
# Builds the Rust example builder into $1 (default phi4mini.wasm here) with Debian's rustc and its
# wasm32 standard library (packages rustc and libstd-rust-dev-wasm32: docs/builders.md).
set -eu
here=$(dirname "$0")
out=${1:-"$here/phi4mini.wasm"}
rustc=${RUSTC:-/usr/bin/rustc}
# A reactor (podium_run; docs/builders.md): its runtime starts once per module, not in every call.
# rustc 1.63 makes no _initialize for a cdylib: wasi-libc's crt1-reactor.o, shipped with the
# target's standard library, is the one clang links.
reactor="$("$rustc" --print sysroot)/lib/rustlib/wasm32-wasi/lib/self-contained/crt1-reactor.o"
if [ ! -f "$reactor" ]; then
  echo "$reactor is missing: install Debian's libstd-rust-dev-wasm32 (make clickhouse does)" >&2
  exit 1
fi
exec "$rustc" --edition 2021 --target wasm32-wasi --crate-type cdylib -C opt-level=2 -C strip=symbols \
  -C link-arg="$reactor" -o "$out" "$here/phi4mini.rs"
