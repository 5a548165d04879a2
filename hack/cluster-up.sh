#!/usr/bin/env bash
# `cargo xtask cluster-up` now; this shim goes once no script calls it.
exec cargo run --locked --quiet --manifest-path "$(dirname "$0")/../xtask/Cargo.toml" -- cluster-up "$@"
