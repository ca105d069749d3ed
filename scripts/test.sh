#!/usr/bin/env bash
# The whole test suite: lint, unit/property/crash/model tests, then the real-mount suites
# (POSIX differential against tmpfs, pjdfstest, fsx). CI runs exactly this.
#
#   scripts/test.sh            everything (needs root and /dev/fuse; installs what is missing)
#   QUICK=1 scripts/test.sh    skip pjdfstest and fsx
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
step() { printf '\n== %s ==\n' "$*"; }

step "setup (packages, test tools, release build)"
scripts/setup.sh

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo tests (engine, crash simulation, model tests, mount tests)"
# Mount tests must not skip in CI: without root or FUSE they fail loudly.
ANVIL_REQUIRE_FUSE=1 cargo test --workspace --locked

if [[ "${QUICK:-0}" != 1 ]]; then
    step "pjdfstest against a real mount"
    scripts/run-pjdfstest.sh target/release/anvil
    step "fsx: 100,000 operations against a real mount"
    scripts/run-fsx.sh target/release/anvil 100000
fi
step "all tests passed"
