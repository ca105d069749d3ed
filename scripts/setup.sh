#!/usr/bin/env bash
# Prepare a Debian 12 machine for anvil's build and its mount-level tests.
#
#   scripts/setup.sh            install what is missing, then build anvil (release)
#   SKIP_BUILD=1 scripts/setup.sh   only install the tools
#
# Idempotent: Debian packages are installed only when missing, and the
# cargo-installed test tools (pjdfstest, fsx) only when the machine's tool cache,
# ${ANVIL_TOOLS_CACHE:-/var/cache/anvil-tools}/<crate>-<version> (as for Garage), does not
# already hold the pinned version; <repo>/.tools/bin links to them there, so a fresh clone
# on the same machine does not build them again. Where the cache is not writable (not
# root), they are built into <repo>/.tools.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
CACHE="${ANVIL_TOOLS_CACHE:-/var/cache/anvil-tools}"

# Debian packages: FUSE runtime and headers, ACL/xattr tools (pjdfstest needs
# libacl1-dev to build), peer filesystems for comparisons (zfs-fuse included),
# load generators, and what `anvil bench` needs: gcc and make for the nightly
# build (and for jemalloc, which the anvil binary's build compiles from its C
# sources), rsync for backups, a font for PNG charts; sqlite3 and git for the
# real-client mount tests; ssh and a private sshd for the two-host mirroring run.
APT_PACKAGES=(
    fuse3 libfuse3-dev pkg-config libacl1-dev acl attr
    e2fsprogs xfsprogs btrfs-progs zfs-fuse fio stress-ng rsync
    gcc make fonts-dejavu-core sqlite3 git openssh-client openssh-server
)

# Test tools from crates.io, pinned: "crate version binary".
CARGO_TOOLS=(
    "pjdfstest 0.2.2 pjdfstest"
    "fsx 0.3.2 fsx"
)

log() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

is_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

install_apt_packages() {
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        is_installed "$pkg" || missing+=("$pkg")
    done
    if ((${#missing[@]} == 0)); then
        log "Debian packages: all present (${APT_PACKAGES[*]})"
        return
    fi
    if ((EUID != 0)); then
        die "missing Debian packages: ${missing[*]}; run this script as root to install them"
    fi
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

install_cargo_tools() {
    local entry crate version bin root
    mkdir -p "$TOOLS/bin"
    for entry in "${CARGO_TOOLS[@]}"; do
        read -r crate version bin <<<"$entry"
        root="$CACHE/$crate-$version"
        if ! mkdir -p "$root" 2>/dev/null || [[ ! -w "$root" ]]; then
            root="$TOOLS/$crate-$version"
        fi
        if [[ -x "$root/bin/$bin" && "$("$root/bin/$bin" --version 2>/dev/null)" == "$bin $version" ]]; then
            log "$crate $version: present ($root/bin/$bin)"
        else
            log "$crate $version: cargo install into $root (takes a few minutes)"
            cargo install --locked --root "$root" --version "$version" "$crate"
        fi
        ln -sfn "$root/bin/$bin" "$TOOLS/bin/$bin"
    done
}

build_anvil() {
    if [[ "${SKIP_BUILD:-0}" == 1 ]]; then
        log "SKIP_BUILD=1: not building anvil"
        return
    fi
    log "building anvil (cargo build --release -p anvil-cli)"
    (cd "$ROOT" && cargo build --release -p anvil-cli)
    log "anvil binary: $ROOT/target/release/anvil"
    install_anvil
}

# `anvil` on the PATH, and mount(8)'s helper for `mount -t fuse.anvil` and fstab lines of
# type fuse.anvil (the binary acts as the helper when called mount.fuse.anvil).
install_anvil() {
    if ((EUID != 0)); then
        log "not root: anvil not installed into /usr/local/bin, no mount.fuse.anvil helper"
        return
    fi
    install -m 0755 "$ROOT/target/release/anvil" /usr/local/bin/anvil
    ln -sf /usr/local/bin/anvil /sbin/mount.fuse.anvil
    log "installed /usr/local/bin/anvil and /sbin/mount.fuse.anvil (mount -t fuse.anvil)"
}

# FUSE over io_uring (Linux 6.14+) is off by default; anvil mount uses it when it is on.
enable_fuse_uring() {
    local param=/sys/module/fuse/parameters/enable_uring
    if [[ ! -e "$param" ]]; then
        log "FUSE over io_uring: not in this kernel; anvil mount uses the classic transport"
    elif [[ "$(cat "$param")" == Y ]]; then
        log "FUSE over io_uring: on"
    elif ((EUID == 0)) && echo Y > "$param" 2>/dev/null; then
        log "FUSE over io_uring: turned on ($param)"
    else
        log "FUSE over io_uring: off and cannot be turned on here (needs root); classic transport"
    fi
}

command -v cargo >/dev/null || die "cargo not found in PATH"
install_apt_packages
enable_fuse_uring
install_cargo_tools
# Garage, the object store the s3:// tests run against (cached machine-wide; 10-15 minutes
# to build the first time).
"$ROOT/scripts/garage.sh" install
build_anvil
log "done"
