#!/usr/bin/env bash
# Run the test command N times (default 5) with a CPU hog beside it: one busy-loop process per core,
# stopped when this script ends however it ends. A test whose verdict depends on the machine's load
# fails here; none may. Each run's closing pytest line goes to stdout, its whole log to
# $LOG_DIR/run-K.log (default /tmp/promptlookup-load).
#
#   bash scripts/test_under_load.sh [N] [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${1:-5}
shift || true
log_dir=${LOG_DIR:-/tmp/promptlookup-load}
mkdir -p "$log_dir"

hogs=()
stop_hogs() { for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done; wait 2>/dev/null; }
trap stop_hogs EXIT INT TERM
for _ in $(seq "$(nproc)"); do
    (while :; do :; done) &
    hogs+=($!)
done
echo "test_under_load: ${#hogs[@]} busy processes (pids ${hogs[*]}), $runs runs, logs in $log_dir"

failed=0
for k in $(seq "$runs"); do
    start=$(date +%s)
    bash scripts/test.sh "$@" >"$log_dir/run-$k.log" 2>&1
    rc=$?
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log_dir/run-$k.log" | tail -1)
    echo "run $k: exit $rc in $(( $(date +%s) - start )) s: ${summary:-no pytest summary}"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
done
echo "test_under_load: $((runs - failed)) of $runs runs passed"
[ "$failed" -eq 0 ]
