#!/usr/bin/env bash
# Instructions per call of the loopback benchmark's client thread, per hyper configuration,
# counted by callgrind (see the module docs of benches/loopback.rs, "Profiling one
# configuration").
#
# Builds the bench binary with debug symbols, then runs each configuration twice under
# `valgrind --tool=callgrind --separate-threads=yes` (`LOOPBACK_ONLY=<configuration>`), with
# N1 and N2 requests after the same warm-up; the set-up and the warm-up cancel out of
#     instructions per call = (Ir(N2) - Ir(N1)) / (N2 - N1),
# taken from the main thread's file (the client: the calling tasks, the layer, hyper-util and
# its HTTP/2 connection task, tokio's driver) and, as a check that the server does the same
# work for everyone, from the server thread's.
#
# Then, for pairs of configurations, the functions whose inclusive and self instructions per
# call differ the most (same formula, per function, from `callgrind_annotate`).
#
# Usage, from anywhere in the repository:
#     benches/support/profile_loopback.sh
# Environment (all optional):
#     N1, N2       requests of the two runs (1000 and 5000)
#     IN_FLIGHT    calls in flight (1: the most repeatable counts)
#     CONFIGS      configurations, space-separated (every hyper configuration)
#     PAIRS        "A:B" pairs to explain, space-separated (see the default below)
#     TOP          functions listed per pair (12)
#     OUT          where callgrind's files go (a fresh temporary directory)
#     CARGO_TARGET_DIR is honoured by the build as usual.
set -euo pipefail

cd "$(dirname "$0")/../.."
N1=${N1:-1000}
N2=${N2:-5000}
IN_FLIGHT=${IN_FLIGHT:-1}
CONFIGS=${CONFIGS:-"bare tower_retry tower_retry+tps_budget ours_retry_policy ours_retry_policy+throttle ours_retry_no_policy ours_retry_no_policy_passthrough"}
PAIRS=${PAIRS:-"ours_retry_policy:bare ours_retry_policy:tower_retry+tps_budget ours_retry_no_policy:bare ours_retry_no_policy_passthrough:bare"}
TOP=${TOP:-12}
OUT=${OUT:-$(mktemp -d -t profile_loopback.XXXXXX)}
mkdir -p "$OUT"

# Debug symbols for function names; the optimisation is the bench profile's.
binary=$(CARGO_PROFILE_BENCH_DEBUG=true cargo bench --bench loopback --features tonic --no-run \
    --message-format=json |
    sed -n 's/.*"target":{[^}]*"name":"loopback"[^}]*}.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
if [[ -z "$binary" ]]; then
    echo "could not find the loopback bench binary" >&2
    exit 1
fi
echo "binary: $binary; callgrind files in $OUT; $IN_FLIGHT in flight, N1=$N1, N2=$N2" >&2

# Runs configuration $1 with $2 requests under callgrind; prints the output file's prefix.
profile() {
    local prefix="$OUT/$1.$2"
    rm -f "$prefix".*
    LOOPBACK_ONLY=$1 LOOPBACK_REQUESTS=$2 LOOPBACK_IN_FLIGHT=$IN_FLIGHT \
        valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$prefix.%p" \
        "$binary" >&2 2>"$prefix.log"
    if compgen -G "$prefix.*-03" >/dev/null; then
        echo "warning: $1 ran on more than two threads, see $prefix.*" >&2
    fi
    echo "$prefix"
}

# Total instructions of thread $2 (01: main, the client; 02: the server) of run prefix $1.
total() {
    sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$1".*-"$2"
}

# "Ir<TAB>function" for every function of callgrind file $1; $2 is yes (inclusive) or no
# (self). callgrind_annotate lists a function once per source file its instructions come from
# (code inlined from the standard library counts under its own file): this adds the parts'
# self costs up, and keeps the largest part's inclusive cost (each part's inclusive cost
# holds what the others call through it, so a sum would count the same calls twice).
functions() {
    callgrind_annotate --inclusive="$2" --threshold=100 --auto=no "$1" 2>/dev/null |
        awk -v inclusive="$2" '
            /^ *[0-9,]+ \( *[0-9.]+%\)  / {
                ir = $0; sub(/^ */, "", ir); sub(/ .*/, "", ir); gsub(/,/, "", ir)
                name = $0; sub(/^ *[0-9,]+ \( *[0-9.]+%\)  /, "", name)
                if (name == "PROGRAM TOTALS") next
                sub(/ \[[^]]*\]$/, "", name); sub(/^[^:]*:/, "", name)
                if (inclusive != "yes") cost[name] += ir
                else if (!(name in cost) || ir + 0 > cost[name]) cost[name] = ir + 0
            }
            END { for (name in cost) print cost[name] "\t" name }'
}

declare -A run1 run2
for config in $CONFIGS; do
    run1[$config]=$(profile "$config" "$N1")
    run2[$config]=$(profile "$config" "$N2")
done

per_call() { # prefix1 prefix2 thread
    echo "$(($(total "$2" "$3") - $(total "$1" "$3")))" "$((N2 - N1))" |
        awk '{ printf "%.0f", $1 / $2 }'
}

echo
echo "Instructions per call (callgrind, $IN_FLIGHT in flight, (Ir($N2) - Ir($N1)) / $((N2 - N1)))"
echo
echo "| configuration | client thread | − bare | server thread |"
echo "|---|---:|---:|---:|"
bare=""
if [[ -n "${run1[bare]:-}" ]]; then
    bare=$(per_call "${run1[bare]}" "${run2[bare]}" 01)
fi
for config in $CONFIGS; do
    client=$(per_call "${run1[$config]}" "${run2[$config]}" 01)
    server=$(per_call "${run1[$config]}" "${run2[$config]}" 02)
    over=""
    [[ -n "$bare" ]] && over=$(printf '%+d' $((client - bare)))
    echo "| $config | $client | $over | $server |"
done

# The functions whose instructions per call differ the most between $1 and $2 (A − B), by
# inclusive or self ($3: yes or no) cost, leaving out those that hold more than half of A's
# instructions. A function of A's layer that polls the client's future (or calls the client)
# has that work in its inclusive cost, which B counts under other functions: its inclusive
# difference is larger than the thread's; the self costs add up to the thread's difference.
explain() {
    local a=$1 b=$2 inclusive=$3
    {
        functions "${run1[$a]}".*-01 "$inclusive" | sed 's/^/a1\t/'
        functions "${run2[$a]}".*-01 "$inclusive" | sed 's/^/a2\t/'
        functions "${run1[$b]}".*-01 "$inclusive" | sed 's/^/b1\t/'
        functions "${run2[$b]}".*-01 "$inclusive" | sed 's/^/b2\t/'
    } | awk -F'\t' -v n=$((N2 - N1)) -v total="$(per_call "${run1[$a]}" "${run2[$a]}" 01)" '
        {
            sign = ($1 ~ /2$/ ? 1 : -1)
            d[$3] += sign * ($1 ~ /^a/ ? 1 : -1) * $2
            if ($1 ~ /^a/) in_a[$3] += sign * $2
        }
        END {
            for (f in d) {
                v = d[f] / n
                # What holds most of the thread (main, block_on, the task harness) holds all
                # of the difference too: left out.
                if (in_a[f] / n > total / 2) continue
                name = length(f) > 150 ? substr(f, 1, 149) "…" : f
                if (v >= 0.5 || v <= -0.5) printf "%.0f\t%+.0f\t%s\n", (v < 0 ? -v : v), v, name
            }
        }' |
        sort -t$'\t' -k1,1nr | awk -v top="$TOP" 'NR <= top' | cut -f2- | sed 's/\t/ | /; s/^/| /; s/$/ |/'
}

for pair in $PAIRS; do
    a=${pair%%:*}
    b=${pair#*:}
    [[ -n "${run1[$a]:-}" && -n "${run1[$b]:-}" ]] || continue
    for inclusive in yes no; do
        kind=$([[ $inclusive == yes ]] && echo inclusive || echo self)
        echo
        echo "$a − $b, client thread, $kind instructions per call, top $TOP by size"
        echo
        echo "| Δ/call | function |"
        echo "|---:|---|"
        explain "$a" "$b" "$inclusive"
    done
done
