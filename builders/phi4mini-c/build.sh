#!/bin/sh
# Builds the C example builder into $1 (default phi4mini.wasm here) with Debian's clang and
# wasi-libc (packages clang, lld, wasi-libc, libclang-rt-14-dev-wasm32): the one rule, which
# `make builders` and the tests (internal/testenv.BuildC) both run.
set -eu
here=$(dirname "$0")
out=${1:-"$here/phi4mini.wasm"}
if ! command -v clang >/dev/null 2>&1; then
  echo "clang is missing: install Debian's clang lld wasi-libc libclang-rt-14-dev-wasm32 (make clickhouse does)" >&2
  exit 1
fi
# A reactor (podium_run; docs/builders.md): its runtime starts once per module, not in every call.
exec clang --target=wasm32-wasi --sysroot=/usr -O2 -mexec-model=reactor -Wall -Wextra -Werror -o "$out" "$here/phi4mini.c"
