#!/usr/bin/env bash
# Instructions per call of every variant of the overhead benchmark's echo (benches/instructions.rs),
# counted by callgrind: (total at 11 000 calls − total at 1 000 calls) / 10 000.
# Usage: bash benches/support/instructions.sh [variant ...]   (default: the tower peers and ours)
set -euo pipefail
cd "$(dirname "$0")/../.."
CARGO_PROFILE_BENCH_DEBUG=true cargo bench --bench instructions --no-run 2>/dev/null
binary=$(ls -t target/release/deps/instructions-* | grep -v '\.d$' | head -1)
variants=("$@")
if [ ${#variants[@]} -eq 0 ]; then
    variants=(bare tower_retry tower_retry+tps_budget tower_hedge ours_retry_policy
        ours_retry_no_policy ours_retry_no_policy_passthrough ours_hedge_policy)
fi
out=$(mktemp -d)
total() {
    INSTRUCTIONS_VARIANT=$1 INSTRUCTIONS_SHAPE=$2 INSTRUCTIONS_CALLS=$3 \
        valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$binary" >/dev/null 2>"$out/log"
    grep -E '^summary:' "$out/cg" | awk '{print $2}'
}
echo "| variant | no_headers: instructions per call | grpc_4_headers | grpc_4_headers+timeout | streaming |"
echo "|---|---:|---:|---:|---:|"
for variant in "${variants[@]}"; do
    row="| $variant |"
    for shape in no_headers grpc_4_headers grpc_4_headers+timeout; do
        small=$(total "$variant" "$shape" 1000)
        large=$(total "$variant" "$shape" 11000)
        row="$row $(( (large - small) / 10000 )) |"
    done
    case $variant in
        bare | ours_retry_policy)
            small=$(total "$variant" streaming 1000)
            large=$(total "$variant" streaming 11000)
            row="$row $(( (large - small) / 10000 )) |" ;;
        *) row="$row – |" ;;
    esac
    echo "$row"
done
rm -rf "$out"
