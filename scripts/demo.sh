#!/usr/bin/env bash
# Install everything, then run the main job: a copy-heavy generate on the bundled model with
# the default (--speculate auto), printing the text and the speculation report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh core
prompt_file=benchmarks/workloads/copy_edit.txt
exec .venv/bin/promptlookup generate --chat -n 256 -f "$prompt_file" "$@"
