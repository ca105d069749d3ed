#!/usr/bin/env bash
# A real 3-node Garage (S3-compatible object store) cluster on 127.0.0.1, for tests of
# volumes on an object store.
#
#   scripts/garage.sh install            install garage 2.5.0 if missing (cargo install,
#                                        10-15 minutes; cached machine-wide, see below)
#   scripts/garage.sh start DIR          start three nodes under DIR/node{1,2,3}, set the
#                                        cluster up (layout over zones dc1 dc2 dc3, bucket
#                                        `anvil`, a read/write/owner key) and write DIR/env;
#                                        on a DIR that held a cluster, restart that cluster
#   scripts/garage.sh stop DIR           stop every node (SIGTERM, then SIGKILL after 10 s)
#   scripts/garage.sh stop-node DIR I    kill node I (SIGKILL: a node dying mid-workload)
#   scripts/garage.sh start-node DIR I   start node I again and wait for it to serve
#   scripts/garage.sh status DIR         `garage status` of the cluster
#
# DIR/env holds, as `export NAME=value` lines: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION (garage), AWS_ENDPOINT_URL (node 1's S3 API), AWS_ALLOW_HTTP=true and
# ANVIL_S3_BUCKET=anvil. `. DIR/env` and the anvil-s3 crate finds the store.
#
# Ports, from GARAGE_PORT_BASE (default 3900): node I serves S3 on BASE+10*I, RPC on
# BASE+10*I+1 and the admin API on BASE+10*I+3, all on 127.0.0.1. Metadata in sqlite,
# replication_factor 3, consistency_mode "consistent": reads and writes need 2 of 3 nodes,
# so the cluster keeps serving with one node down.
#
# The binary lives in ${ANVIL_TOOLS_CACHE:-/var/cache/anvil-tools}/garage-2.5.0/bin, outside
# the repository, so a fresh clone on the same machine does not build it again.
set -euo pipefail

GARAGE_VERSION=2.5.0
CACHE="${ANVIL_TOOLS_CACHE:-/var/cache/anvil-tools}"
GARAGE_ROOT="$CACHE/garage-$GARAGE_VERSION"
GARAGE="$GARAGE_ROOT/bin/garage"
NODES=(1 2 3)
REGION=garage
BUCKET=anvil
KEY_NAME=anvil-test

die() {
    echo "garage.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

installed() {
    [[ -x "$GARAGE" ]] && "$GARAGE" --version 2>/dev/null | grep -q "cargo:$GARAGE_VERSION"
}

install_garage() {
    installed && return 0
    command -v cargo >/dev/null || die "garage $GARAGE_VERSION is not in $GARAGE_ROOT and cargo, to build it, is not installed"
    mkdir -p "$GARAGE_ROOT" || die "cannot create $GARAGE_ROOT (set ANVIL_TOOLS_CACHE to a writable directory)"
    # One build at a time, however many scripts ask for it.
    exec 9>"$GARAGE_ROOT.lock"
    flock 9
    if ! installed; then
        local log="$GARAGE_ROOT/install.log"
        echo "garage.sh: building garage $GARAGE_VERSION into $GARAGE_ROOT (10-15 minutes; log: $log)" >&2
        cargo install garage --version "$GARAGE_VERSION" --locked --no-default-features \
            --features sqlite,bundled-libs --root "$GARAGE_ROOT" >"$log" 2>&1 ||
            die "cargo install garage $GARAGE_VERSION failed: $(tail -n 1 "$log"); full log: $log"
        installed || die "cargo install garage $GARAGE_VERSION left no working $GARAGE; see $log"
    fi
    flock -u 9
    exec 9>&-
}

# The cluster's directory, absolute; it must exist unless $2 is "create".
cluster_dir() {
    local dir="${1:-}"
    [[ -n "$dir" ]] || usage
    if [[ "${2:-}" == create ]]; then
        mkdir -p "$dir" || die "cannot create $dir"
    fi
    [[ -d "$dir" ]] || die "$dir does not exist"
    (cd "$dir" && pwd)
}

node_arg() {
    local i="${1:-}"
    [[ "$i" =~ ^[123]$ ]] || die "the node number must be 1, 2 or 3, not '${i}'"
    echo "$i"
}

conf() { echo "$1/node$2/garage.toml"; }

# Run the garage CLI against node $2 of cluster $1.
cli() {
    local dir="$1" i="$2"
    shift 2
    "$GARAGE" -c "$(conf "$dir" "$i")" "$@"
}

port_base() { cat "$1/port_base"; }
s3_port() { echo $(($(port_base "$1") + 10 * $2)); }
rpc_port() { echo $(($(port_base "$1") + 10 * $2 + 1)); }
admin_port() { echo $(($(port_base "$1") + 10 * $2 + 3)); }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The pid of node $2 if it runs (a garage server started from its config), else nothing.
node_pid() {
    local pidfile="$1/node$2/pid" pid
    [[ -f "$pidfile" ]] || return 0
    pid="$(cat "$pidfile")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    if [[ -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$(conf "$1" "$2") server"; then
        echo "$pid"
    fi
}

write_config() {
    local dir="$1" i="$2" secret="$3" admin_token="$4" node="$1/node$2"
    mkdir -p "$node/meta" "$node/data"
    local tmp="$node/garage.toml.tmp"
    cat >"$tmp" <<EOF
# Written by scripts/garage.sh: node $i of a 3-node test cluster on 127.0.0.1.
metadata_dir = "$node/meta"
data_dir = "$node/data"
db_engine = "sqlite"
replication_factor = 3
consistency_mode = "consistent"
# anvil compresses what it writes: zstd again would only cost CPU.
compression_level = "none"

rpc_bind_addr = "127.0.0.1:$(rpc_port "$dir" "$i")"
rpc_public_addr = "127.0.0.1:$(rpc_port "$dir" "$i")"
rpc_secret = "$secret"
bootstrap_peers = []

[s3_api]
s3_region = "$REGION"
api_bind_addr = "127.0.0.1:$(s3_port "$dir" "$i")"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$(admin_port "$dir" "$i")"
admin_token = "$admin_token"
EOF
    chmod 600 "$tmp"
    mv "$tmp" "$(conf "$dir" "$i")"
}

# Start node $2 and wait until it answers RPC (its own `node id`).
start_one() {
    local dir="$1" i="$2" node="$1/node$2"
    [[ -f "$(conf "$dir" "$i")" ]] || die "$dir holds no node $i (run: scripts/garage.sh start $dir)"
    if [[ -n "$(node_pid "$dir" "$i")" ]]; then
        return 0
    fi
    local port
    for port in "$(s3_port "$dir" "$i")" "$(rpc_port "$dir" "$i")" "$(admin_port "$dir" "$i")"; do
        port_busy "$port" && die "port $port on 127.0.0.1 is in use, node $i cannot start (set GARAGE_PORT_BASE for a new cluster, or stop what holds it)"
    done
    RUST_LOG="${RUST_LOG:-garage=info}" setsid "$GARAGE" -c "$(conf "$dir" "$i")" server \
        </dev/null >>"$node/log" 2>&1 &
    local pid=$!
    echo "$pid" >"$node/pid"
    local t
    for t in $(seq 150); do
        kill -0 "$pid" 2>/dev/null ||
            die "node $i exited at start: $(grep -v '^\s*$' "$node/log" | tail -n 1 | sed 's/\x1b\[[0-9;]*m//g'); log: $node/log"
        cli "$dir" "$i" node id -q >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "node $i did not answer within 30 s; log: $node/log"
}

# Kill node $2 with signal $3, waiting for it to be gone.
stop_one() {
    local dir="$1" i="$2" sig="$3" pid t
    pid="$(node_pid "$dir" "$i")"
    if [[ -n "$pid" ]]; then
        kill "-$sig" "$pid" 2>/dev/null || true
        for t in $(seq 100); do
            [[ -n "$(node_pid "$dir" "$i")" ]] || break
            sleep 0.1
        done
        if [[ -n "$(node_pid "$dir" "$i")" ]]; then
            kill -KILL "$pid" 2>/dev/null || true
            for t in $(seq 50); do
                [[ -n "$(node_pid "$dir" "$i")" ]] || break
                sleep 0.1
            done
        fi
        [[ -z "$(node_pid "$dir" "$i")" ]] || die "node $i (pid $pid) did not stop"
    fi
    rm -f "$dir/node$i/pid"
}

# One signed S3 request (ListObjectsV2 of the bucket, one key) to node $2: 0 when it
# answers 200. curl signs with SigV4; without curl, `garage health` stands in.
s3_probe() {
    local dir="$1" i="$2"
    if ! command -v curl >/dev/null; then
        cli "$dir" 1 health -q >/dev/null 2>&1
        return
    fi
    local env="$dir/env" id secret code
    [[ -f "$env" ]] || env="$dir/env.tmp"
    id="$(sed -n 's/^export AWS_ACCESS_KEY_ID=//p' "$env")" || return 1
    secret="$(sed -n 's/^export AWS_SECRET_ACCESS_KEY=//p' "$env")" || return 1
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 \
        --aws-sigv4 "aws:amz:$REGION:s3" --user "$id:$secret" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
        "http://127.0.0.1:$(s3_port "$dir" "$i")/$BUCKET?list-type=2&max-keys=1" 2>/dev/null)" || true
    [[ "$code" == 200 ]]
}

# Wait (30 s at most) until the cluster is healthy and node $2 serves S3 requests.
wait_serving() {
    local dir="$1" i="$2" t
    for t in $(seq 150); do
        if cli "$dir" "$i" health -q >/dev/null 2>&1 && s3_probe "$dir" "$i"; then
            return 0
        fi
        sleep 0.2
    done
    die "the cluster in $dir did not become healthy within 30 s: $(cli "$dir" "$i" health 2>&1 | grep -i 'health' | head -n 1)"
}

# Connect the nodes, lay them out over three zones, create the bucket and a key, and write
# DIR/env.tmp.
setup_cluster() {
    local dir="$1" i ids=() id
    for i in "${NODES[@]}"; do
        id="$(cli "$dir" "$i" node id -q 2>/dev/null)" || die "cannot read node $i's id"
        ids+=("$id")
    done
    for i in 2 3; do
        cli "$dir" 1 node connect "${ids[$((i - 1))]}" >/dev/null ||
            die "node 1 cannot connect to node $i (${ids[$((i - 1))]})"
    done
    # Every node knows every other from its config from now on, so that a restarted node
    # reconnects at once (its saved peer list may not hold them yet; the others would only
    # retry after a backoff of up to a minute).
    local peers
    peers="$(printf '"%s", ' "${ids[@]}")"
    peers="[${peers%, }]"
    for i in "${NODES[@]}"; do
        sed -i "s/^bootstrap_peers = .*/bootstrap_peers = $peers/" "$(conf "$dir" "$i")"
    done
    for i in "${NODES[@]}"; do
        id="${ids[$((i - 1))]}"
        cli "$dir" 1 layout assign -z "dc$i" -c 1G "${id%%@*}" >/dev/null ||
            die "cannot assign node $i a role in the layout"
    done
    cli "$dir" 1 layout apply --version 1 >/dev/null || die "cannot apply the cluster layout"
    local t
    for t in $(seq 150); do
        cli "$dir" 1 health -q >/dev/null 2>&1 && break
        sleep 0.2
    done
    cli "$dir" 1 bucket create "$BUCKET" >/dev/null || die "cannot create bucket $BUCKET"
    cli "$dir" 1 key create "$KEY_NAME" >/dev/null || die "cannot create an access key"
    cli "$dir" 1 bucket allow --read --write --owner "$BUCKET" --key "$KEY_NAME" >/dev/null ||
        die "cannot give the key access to bucket $BUCKET"
    local key_id secret
    key_id="$(cli "$dir" 1 key info --key-id "$KEY_NAME")" || die "cannot read the access key's id"
    secret="$(cli "$dir" 1 key info --secret-key "$KEY_NAME")" || die "cannot read the access key's secret"
    (
        umask 077
        cat >"$dir/env.tmp" <<EOF
export AWS_ACCESS_KEY_ID=$key_id
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=$REGION
export AWS_ENDPOINT_URL=http://127.0.0.1:$(s3_port "$dir" 1)
export AWS_ALLOW_HTTP=true
export ANVIL_S3_BUCKET=$BUCKET
EOF
    )
}

# Seconds since $1 (date +%s%N), as "1.2 s".
elapsed() {
    local ms=$((($(date +%s%N) - $1) / 1000000))
    printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100))
}

cmd_start() {
    local dir i started
    dir="$(cluster_dir "${1:-}" create)"
    install_garage
    started=$(date +%s%N)
    local fresh=0
    if [[ ! -f "$dir/env" ]]; then
        # A new cluster (or one whose setup did not finish: start it over).
        fresh=1
        for i in "${NODES[@]}"; do
            [[ -z "$(node_pid "$dir" "$i")" ]] || die "node $i of $dir runs but the cluster has no env file: run scripts/garage.sh stop $dir first"
        done
        rm -rf "$dir"/node1 "$dir"/node2 "$dir"/node3 "$dir/env.tmp"
        local base="${GARAGE_PORT_BASE:-3900}"
        [[ "$base" =~ ^[0-9]+$ ]] && ((base >= 1024 && base + 33 <= 65535)) ||
            die "GARAGE_PORT_BASE must be a port number from 1024 to 65502, not '$base'"
        echo "$base" >"$dir/port_base"
        local secret admin_token
        secret="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
        admin_token="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
        for i in "${NODES[@]}"; do
            write_config "$dir" "$i" "$secret" "$admin_token"
        done
    fi
    for i in "${NODES[@]}"; do
        start_one "$dir" "$i"
    done
    if ((fresh)); then
        setup_cluster "$dir"
        wait_serving "$dir" 1
        mv "$dir/env.tmp" "$dir/env"
    else
        wait_serving "$dir" 1
    fi
    echo "garage.sh: 3 nodes serving S3 at http://127.0.0.1:$(s3_port "$dir" 1) (and :$(s3_port "$dir" 2), :$(s3_port "$dir" 3)), bucket $BUCKET, in $(elapsed "$started"); env: $dir/env"
}

cmd_stop() {
    local dir i
    dir="$(cluster_dir "${1:-}")"
    for i in "${NODES[@]}"; do
        stop_one "$dir" "$i" TERM
    done
}

cmd_stop_node() {
    local dir i
    dir="$(cluster_dir "${1:-}")"
    i="$(node_arg "${2:-}")"
    stop_one "$dir" "$i" KILL
}

cmd_start_node() {
    local dir i
    dir="$(cluster_dir "${1:-}")"
    i="$(node_arg "${2:-}")"
    [[ -f "$dir/env" ]] || die "$dir holds no set-up cluster (run: scripts/garage.sh start $dir)"
    installed || die "garage $GARAGE_VERSION is not installed in $GARAGE_ROOT (run: scripts/garage.sh install)"
    start_one "$dir" "$i"
    wait_serving "$dir" "$i"
}

cmd_status() {
    local dir i
    dir="$(cluster_dir "${1:-}")"
    for i in "${NODES[@]}"; do
        if [[ -n "$(node_pid "$dir" "$i")" ]]; then
            cli "$dir" "$i" status
            return
        fi
    done
    die "no node of $dir is running"
}

case "${1:-}" in
install) install_garage ;;
start) cmd_start "${2:-}" ;;
stop) cmd_stop "${2:-}" ;;
stop-node) cmd_stop_node "${2:-}" "${3:-}" ;;
start-node) cmd_start_node "${2:-}" "${3:-}" ;;
status) cmd_status "${2:-}" ;;
*) usage ;;
esac
