#!/usr/bin/env bash
# Fuzz smoke run: builds every fuzz target and runs each for a few seconds from the
# checked-in seeds, under a memory limit. Exits non-zero if any target finds a crash (the
# failing input is left in fuzz/artifacts/<target>/). See fuzz/README.md.
#
#   bash fuzz/smoke.sh                      # 10 s per target (no cargo-fuzz needed)
#   FUZZ_SECONDS=300 bash fuzz/smoke.sh     # a longer run
#   FUZZ_TARGETS="replay_body" bash fuzz/smoke.sh
#   FUZZ_SANITIZER=address bash fuzz/smoke.sh   # ASan (needs RUSTC_BOOTSTRAP=1, set below)
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
seconds=${FUZZ_SECONDS:-10}
sanitizer=${FUZZ_SANITIZER:-none}
read -r -a targets <<<"${FUZZ_TARGETS:-service_config pushback retry_after grpc_timeout replay_body retry_info}"

cd "$(dirname "$0")"

if [[ $sanitizer == none ]]; then
    # What `cargo fuzz build --sanitizer none` runs (its coverage flags, `--cfg fuzzing`, the
    # host target so that build scripts and proc macros stay uninstrumented), without
    # installing cargo-fuzz: that alone takes minutes of compiling on a fresh machine.
    host=$(rustc -vV | sed -n 's/^host: //p')
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Cllvm-args=-sanitizer-coverage-stack-depth \
-Cdebug-assertions -Ccodegen-units=1" cargo build --release --target "$host" --bins
    fuzz() {
        local target=$1
        shift
        "target/$host/release/$target" -artifact_prefix="artifacts/$target/" "$@"
    }
else
    if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
        echo "installing cargo-fuzz $CARGO_FUZZ_VERSION"
        cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
    fi
    # Sanitizers are passed as `-Z` flags. The stable toolchain ships their runtimes, and
    # RUSTC_BOOTSTRAP lets it accept the flag.
    export RUSTC_BOOTSTRAP=1
    cargo fuzz build --sanitizer "$sanitizer"
    fuzz() {
        local target=$1
        shift
        local corpus=()
        while [[ $# -gt 0 && $1 != -* ]]; do
            corpus+=("$1")
            shift
        done
        cargo fuzz run --sanitizer "$sanitizer" "$target" "${corpus[@]}" -- "$@"
    }
fi

failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "artifacts/$target"
    log=$(mktemp)
    echo "== $target: ${seconds}s"
    # corpus/<target> (scratch, ignored by git) takes what the fuzzer finds; the seeds are
    # only read. -timeout: one input taking over 10 s counts as a hang, which fails too.
    if fuzz "$target" "corpus/$target" "seeds/$target" \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        echo "   ok: ${runs:-?} inputs"
    else
        tail -n 60 "$log"
        echo "   FAILED: $target (input in fuzz/artifacts/$target/)"
        failed+=("$target")
    fi
    rm -f "$log"
done

if ((${#failed[@]} > 0)); then
    echo "fuzz smoke failed: ${failed[*]}"
    exit 1
fi
echo "fuzz smoke passed: ${targets[*]}"
