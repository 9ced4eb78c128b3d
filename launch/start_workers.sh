#!/usr/bin/env bash
# Starts or stops local TFF worker services (wrapper of launch/workers.py).
#
#   launch/start_workers.sh N [BASE_PORT]   start N workers (BASE_PORT, BASE_PORT+1, ...;
#                                           free ports if omitted); prints host:port,...
#   launch/start_workers.sh stop            SIGINT, then SIGKILL after 10 s
#   launch/start_workers.sh status          list the recorded workers
#
# State (pids, ports) goes to $FEDRECGEL_WORKERS_STATE, default
# runs/workers/state.json; logs next to it. $PYTHON overrides the interpreter
# (default: the repository's .venv).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
script="$repo/launch/workers.py"

usage() {
  echo "usage: $0 N [BASE_PORT] | stop | status" >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
case "$1" in
  stop|status)
    [[ $# -eq 1 ]] || usage
    exec "$python" "$script" "$1"
    ;;
  ''|*[!0-9]*)
    usage
    ;;
  *)
    [[ $# -le 2 ]] || usage
    exec "$python" "$script" start "$@"
    ;;
esac
