#!/usr/bin/env bash
# Fuzzing that counts: runs every cargo-fuzz target (or the named ones) for SECONDS each and
# reports executions, exec/s and crashes/timeouts/OOMs per target.
#
#   scripts/fuzz-count.sh SECONDS [TARGET...]
#
# Installs what it needs (nightly toolchain, cargo-fuzz) if missing, writes the seed corpus
# into fuzz/corpus/<target>/ (kept between runs: each run starts from what the last found),
# builds the targets without a sanitizer (see docs/fuzzing.md for why), and runs each one in
# libFuzzer's fork mode across FUZZ_JOBS processes (default: every core) with crashes,
# timeouts and OOMs counted rather than fatal. Crashers land in fuzz/artifacts/<target>/;
# each is minimised next to itself (minimized-*), and the command that turns it into a
# regression input is printed. Exits 1 if any target found a crasher, timeout or OOM.
#
# Environment:
#   FUZZ_JOBS=N            processes per target (default: nproc)
#   FUZZ_OUT=DIR           where logs and final stat lines go
#                          (default: fuzz/target/fuzz-count/<UTC time>)
#   FUZZ_TRACE_COMPARES=all  also build open_image_fast with comparison tracing (slower)
#   FUZZ_NICE=N            nice level of the fuzzers and builds (default 19)
#   FUZZ_MINIMIZE=N        new artifacts minimised per target (default 3)
#   FUZZ_TARGET_DIR=DIR    cargo target directory root (default fuzz/target): a second run
#                          alongside one in progress builds elsewhere, so the first one's
#                          fork-mode jobs keep starting the binary it began with
set -euo pipefail

usage() {
    echo "usage: $0 SECONDS [TARGET...]" >&2
    exit 2
}
[[ $# -ge 1 && $1 =~ ^[0-9]+$ && $1 -gt 0 ]] || usage
seconds=$1
shift

repo=$(cd "$(dirname "$0")/.." && pwd)
fuzz="$repo/fuzz"
jobs=${FUZZ_JOBS:-$(nproc)}
nice_level=${FUZZ_NICE:-19}
target_root=${FUZZ_TARGET_DIR:-$fuzz/target}
out=${FUZZ_OUT:-$fuzz/target/fuzz-count/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
run_nice() { nice -n "$nice_level" "$@"; }

all_targets=(decode_blocks open_image open_image_fast)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
    [[ -f "$fuzz/fuzz_targets/$t.rs" ]] || { echo "no fuzz target $t" >&2; exit 2; }
done

# libFuzzer flags per target. open_image inputs are patch lists: short ones say enough.
target_flags() {
    case $1 in
        decode_blocks) echo "-rss_limit_mb=1024 -timeout=10" ;;
        open_image | open_image_fast) echo "-max_len=512 -len_control=20 -rss_limit_mb=1024 -timeout=10" ;;
        *) echo "-rss_limit_mb=1024 -timeout=10" ;;
    esac
}

# open_image_fast spends ~half its time in comparison-tracing callbacks; without them it
# runs twice as fast (its harness already reseals checksums, what tracing would mostly help
# a mutator find). The other targets keep it.
build_variant() {
    if [[ $1 == open_image_fast && ${FUZZ_TRACE_COMPARES:-} != all ]]; then
        echo notc
    else
        echo tc
    fi
}

# --- tools ------------------------------------------------------------------------------
if ! rustup toolchain list | grep -q '^nightly'; then
    echo "== installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    run_nice cargo install cargo-fuzz --locked
fi

# --- seed corpus ------------------------------------------------------------------------
echo "== seeding fuzz/corpus"
run_nice cargo run --quiet --release --manifest-path "$fuzz/Cargo.toml" --bin seed_corpus

# --- build ------------------------------------------------------------------------------
binary() {
    echo "$target_root/count-$(build_variant "$1")/x86_64-unknown-linux-gnu/release/$1"
}
for t in "${targets[@]}"; do
    variant=$(build_variant "$t")
    extra=()
    [[ $variant == notc ]] && extra=(--no-trace-compares)
    echo "== building $t (sanitizer none, ${variant/tc/trace-compares}, debug assertions on)"
    (cd "$fuzz" && run_nice cargo +nightly fuzz build -s none --debug-assertions \
        "${extra[@]}" --target-dir "$target_root/count-$variant" "$t")
done

# --- run --------------------------------------------------------------------------------
summary="$out/summary.txt"
printf '%-16s %14s %10s %8s %8s %9s %5s\n' target executions exec/s seconds crashes timeouts ooms \
    >"$summary"
failed=0
for t in "${targets[@]}"; do
    artifacts="$fuzz/artifacts/$t"
    corpus="$fuzz/corpus/$t"
    mkdir -p "$artifacts" "$corpus"
    before=$(find "$artifacts" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' \
        -o -name 'oom-*' \) | sort)
    log="$out/$t.log"
    echo "== fuzzing $t for ${seconds}s in $jobs processes (log: $log)"
    start=$(date +%s)
    # shellcheck disable=SC2046
    (cd "$fuzz" && run_nice "$(binary "$t")" "$corpus" $(target_flags "$t") \
        -fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -max_total_time="$seconds" -artifact_prefix="$artifacts/" -print_final_stats=1) \
        >"$log" 2>&1 || true
    wall=$(($(date +%s) - start))
    # Fork mode prints one line per finished job:
    #   #RUNS: cov: C ft: F corp: N exec/s: E oom/timeout/crash: O/T/C time: Ss job: J ...
    last=$(grep -E '^#[0-9]+: cov:' "$log" | tail -n 1 || true)
    grep -E '^#[0-9]+: cov:|^INFO: (fuzzed for|exiting)|ERROR:|^==[0-9]+== ' "$log" \
        | tail -n 12 >"$out/$t.stats" || true
    if [[ -z $last ]]; then
        echo "   no job of $t finished: see $log" >&2
        runs=0 ooms=0 timeouts=0 crashes=0
    else
        runs=$(sed -E 's/^#([0-9]+):.*/\1/' <<<"$last")
        read -r ooms timeouts crashes < <(sed -E 's|.*oom/timeout/crash: ([0-9]+)/([0-9]+)/([0-9]+).*|\1 \2 \3|' <<<"$last")
    fi
    rate=$((runs / (wall > 0 ? wall : 1)))
    printf '%-16s %14s %10s %8s %8s %9s %5s\n' "$t" "$runs" "$rate" "$wall" "$crashes" \
        "$timeouts" "$ooms" >>"$summary"
    echo "$t executions=$runs wall_s=$wall exec_per_s=$rate crashes=$crashes timeouts=$timeouts ooms=$ooms" \
        >>"$out/$t.stats"
    new=$(comm -13 <(echo "$before") <(find "$artifacts" -maxdepth 1 -type f \
        \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort))
    if [[ $((crashes + timeouts + ooms)) -gt 0 || -n $new ]]; then
        failed=1
    fi
    minimise_max=${FUZZ_MINIMIZE:-3}
    count=0
    for artifact in $new; do
        count=$((count + 1))
        if [[ $count -gt $minimise_max ]]; then
            echo "   ($(wc -w <<<"$new") new artifacts in $artifacts; minimised the first $minimise_max)"
            break
        fi
        name=$(basename "$artifact")
        minimized="$artifacts/minimized-$name"
        scratch=$(mktemp -d)
        echo "== minimising $name"
        # shellcheck disable=SC2046
        (cd "$fuzz" && run_nice "$(binary "$t")" $(target_flags "$t") -minimize_crash=1 \
            -runs=20000 -artifact_prefix="$scratch/" "$artifact") \
            >"$out/$t.minimize-$name.log" 2>&1 || true
        smallest=$(find "$scratch" -type f -size +0 -printf '%s %p\n' | sort -n | head -n 1 \
            | cut -d' ' -f2-)
        if [[ -n $smallest ]]; then
            cp "$smallest" "$minimized"
        else
            minimized=$artifact
        fi
        rm -rf "$scratch"
        echo "   reproduce: $(binary "$t") $minimized"
        echo "   regression input: cp $minimized" \
            "crates/anvil/tests/fuzz-regressions/$t/<what-it-found>" \
            "&& cargo test -p anvil --test fuzz_regressions"
    done
done

echo
cat "$summary"
echo "(logs and final stat lines: $out)"
exit "$failed"
