#!/usr/bin/env bash
# Dump the heaps of real workloads into files of 4 KiB pages, for benches and ratio tests.
#
# Usage (as root, from anywhere): scripts/dump-workloads.sh [OUTDIR]     default /tmp/uzram-pages
#
# Starts the Python, Node.js and Java programs in scripts/workloads/ (they build typical
# in-memory state, print READY and sleep) and a rustc compiling a real crate (clap_builder, from
# the offline cargo registry), each with a clean environment: `env -i` with only PATH, HOME and
# LANG. Each one is stopped (SIGSTOP) and its private anonymous memory dumped with
# `uzram dump-pages`, which leaves the stack (environment strings) out. Then the dumps are
# checked for a marker placed in this script's own environment. Writes:
#   OUTDIR/{python,node,java,rustc}.pages  full dumps
#   OUTDIR/all.pages                       BIG_MIB of the four, an even seeded sample, interleaved
#   OUTDIR/sample.pages.zst                SAMPLE_PAGES pages of the same mix in runs of SAMPLE_RUN
#                                          neighbours, zstd -19; copy it to testdata/ to refresh
#                                          the checked-in sample
#
# Environment knobs: UZRAM_BIN (default: build target/debug/uzram), WORKLOAD_MIB (200),
# RUSTC_CRATE (clap_builder), RUSTC_STOP_MIB (200), MAX_DUMP_MIB (1024), BIG_MIB (96),
# SAMPLE_PAGES (1280), SAMPLE_RUN (32), SEED (1).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORKLOADS=$REPO/scripts/workloads
OUT=${1:-/tmp/uzram-pages}
WORKLOAD_MIB=${WORKLOAD_MIB:-200}
RUSTC_CRATE=${RUSTC_CRATE:-clap_builder}
RUSTC_STOP_MIB=${RUSTC_STOP_MIB:-200}
MAX_DUMP_MIB=${MAX_DUMP_MIB:-1024}
BIG_MIB=${BIG_MIB:-96}
SAMPLE_PAGES=${SAMPLE_PAGES:-1280}
SAMPLE_RUN=${SAMPLE_RUN:-32}
SEED=${SEED:-1}
READY_TIMEOUT=${READY_TIMEOUT:-300}

die() { echo "dump-workloads: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: reading another process's memory needs ptrace access"
for tool in python3 node java javac cargo zstd pgrep; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done

# Lives only in this script's environment; the dumps must not contain it.
UZRAM_SECRET_MARKER="uzram-secret-marker-$(od -An -N8 -tx8 /dev/urandom | tr -d ' \n')"
export UZRAM_SECRET_MARKER

# Resolve real executables (python3 may be a pyenv shim that needs its own environment).
PYTHON=$(python3 -c 'import sys; print(sys.executable)')
NODE=$(command -v node)
JAVA=$(readlink -f "$(command -v java)")
JAVAC=$(readlink -f "$(command -v javac)")
CARGO=$(command -v cargo)
CLEAN_PATH=
for dir in "$(dirname "$PYTHON")" "$(dirname "$NODE")" "$(dirname "$JAVA")" "$(dirname "$CARGO")" \
    /usr/local/bin /usr/bin /bin; do
    case ":$CLEAN_PATH:" in *":$dir:"*) ;; *) CLEAN_PATH=${CLEAN_PATH:+$CLEAN_PATH:}$dir ;; esac
done
clean_env() { env -i "PATH=$CLEAN_PATH" "HOME=$HOME" "LANG=C.UTF-8" "$@"; }

if [ -z "${UZRAM_BIN:-}" ]; then
    (cd "$REPO" && cargo build -q -p uzram --bin uzram)
    UZRAM_BIN=$REPO/target/debug/uzram
fi
"$UZRAM_BIN" dump-pages --help 2>&1 | grep -q -- --pid ||
    die "$UZRAM_BIN has no dump-pages subcommand (set UZRAM_BIN to a uzram binary that has)"

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/uzram-workloads.XXXXXX)
PIDS=()
cleanup() {
    # SIGKILL also ends the processes left stopped by a failed dump.
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# start NAME COMMAND...: run COMMAND in a clean environment; its pid is in LAST_PID.
start() {
    local name=$1
    shift
    # env execs the command, so $! is the workload's own pid.
    (cd "$WORK" && exec env -i "PATH=$CLEAN_PATH" "HOME=$HOME" "LANG=C.UTF-8" "$@") \
        >"$WORK/$name.log" 2>&1 &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}

wait_ready() {
    local name=$1 pid=$2 deadline=$((SECONDS + READY_TIMEOUT))
    until grep -q '^READY' "$WORK/$name.log"; do
        kill -0 "$pid" 2>/dev/null || { tail -20 "$WORK/$name.log" >&2; die "$name exited early"; }
        [ "$SECONDS" -lt "$deadline" ] || die "$name not READY after ${READY_TIMEOUT}s"
        sleep 0.5
    done
    echo "$name: $(grep '^READY' "$WORK/$name.log")"
}

# end PID: kill a process this script started and stop tracking it.
end() {
    local pid=$1 keep=() p
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

dump() {
    local name=$1 pid=$2
    kill -STOP "$pid"
    "$UZRAM_BIN" dump-pages --pid "$pid" --output "$OUT/$name.pages" --max-mib "$MAX_DUMP_MIB"
    end "$pid"
    [ -s "$OUT/$name.pages" ] || die "the dump of $name is empty"
}

# Python, Node.js and Java build their state side by side.
start python "$PYTHON" "$WORKLOADS/py_heap.py" "$WORKLOAD_MIB"
python_pid=$LAST_PID
start node "$NODE" "$WORKLOADS/node_heap.js" "$WORKLOAD_MIB"
node_pid=$LAST_PID
mkdir -p "$WORK/java"
clean_env "$JAVAC" -d "$WORK/java" "$WORKLOADS/JavaHeap.java"
start java "$JAVA" -Xmx1g -cp "$WORK/java" JavaHeap "$WORKLOAD_MIB"
java_pid=$LAST_PID

wait_ready python "$python_pid"
wait_ready node "$node_pid"
wait_ready java "$java_pid"
dump python "$python_pid"
dump node "$node_pid"
dump java "$java_pid"

# rustc: build a crate depending on clap from the offline registry, and stop the rustc that
# compiles $RUSTC_CRATE once it has grown to RUSTC_STOP_MIB.
proj=$WORK/rustc-proj
mkdir -p "$proj/src"
cat >"$proj/Cargo.toml" <<'EOF'
[package]
name = "rustc-workload"
version = "0.1.0"
edition = "2021"

[dependencies]
clap = { version = "4", features = ["derive"] }

[workspace]
EOF
echo 'fn main() {}' >"$proj/src/main.rs"
cp "$REPO/Cargo.lock" "$proj/"
start rustc "$CARGO" build --offline -j1 --manifest-path "$proj/Cargo.toml" \
    --target-dir "$WORK/rustc-target"
cargo_pid=$LAST_PID
rustc_pid=
deadline=$((SECONDS + READY_TIMEOUT))
while [ -z "$rustc_pid" ]; do
    kill -0 "$cargo_pid" 2>/dev/null ||
        die "cargo ended before the rustc for $RUSTC_CRATE reached $RUSTC_STOP_MIB MiB;" \
            "lower RUSTC_STOP_MIB or pick another RUSTC_CRATE"
    [ "$SECONDS" -lt "$deadline" ] || die "no rustc for $RUSTC_CRATE after ${READY_TIMEOUT}s"
    for pid in $(pgrep -P "$cargo_pid" -x rustc || true); do
        # A rustc may exit at any moment: every read of its /proc files may fail.
        crate=$( (tr '\0' '\n' <"/proc/$pid/cmdline" | grep -A1 -x -- --crate-name | tail -1) \
            2>/dev/null || true)
        [ "$crate" = "$RUSTC_CRATE" ] || continue
        rss_mib=$(awk '/^VmRSS:/ { print int($2 / 1024) }' "/proc/$pid/status" 2>/dev/null || true)
        if [ "${rss_mib:-0}" -ge "$RUSTC_STOP_MIB" ]; then
            kill -STOP "$pid"
            PIDS+=("$pid")
            rustc_pid=$pid
            echo "rustc: stopped pid $pid compiling $RUSTC_CRATE at ${rss_mib} MiB resident"
        fi
    done
    sleep 0.05
done
dump rustc "$rustc_pid"
end "$cargo_pid"

NAMES=(python node java rustc)
DUMPS=()
for name in "${NAMES[@]}"; do DUMPS+=("$OUT/$name.pages"); done
for f in "${DUMPS[@]}"; do
    if grep -a -q -F -e "$UZRAM_SECRET_MARKER" "$f"; then
        die "$f contains this script's environment marker: the clean environment leaked"
    fi
done
echo "no dump contains the parent's environment marker"

"$PYTHON" "$WORKLOADS/sample_pages.py" --seed "$SEED" --pages $((BIG_MIB * 256)) \
    "$OUT/all.pages" "${DUMPS[@]}"
"$PYTHON" "$WORKLOADS/sample_pages.py" --seed "$((SEED + 1))" --pages "$SAMPLE_PAGES" \
    --run "$SAMPLE_RUN" "$WORK/sample.pages" "${DUMPS[@]}"
zstd -q -f -19 "$WORK/sample.pages" -o "$OUT/sample.pages.zst"
echo "$OUT/sample.pages.zst: $(stat -c %s "$OUT/sample.pages.zst") bytes" \
    "(to refresh the checked-in sample: cp $OUT/sample.pages.zst $REPO/testdata/)"
