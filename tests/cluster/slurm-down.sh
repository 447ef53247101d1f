#!/usr/bin/env bash
# Stop what tests/cluster/slurm-up.sh started (slurmd, slurmctld, munged), nothing else.
set -uo pipefail

STATE=/run/kvlab-slurm

stop() {  # stop NAME PIDFILE: SIGTERM the daemon, wait up to 20 s
    local name=$1 pidfile=$2 pid
    [[ -e $STATE/$name ]] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && { echo "slurm-down: $name ($pid) did not stop" >&2; return 1; }
    fi
    rm -f "$STATE/$name"
    echo "slurm-down: stopped $name"
}

status=0
stop slurmd /run/slurmd.pid || status=1
stop slurmctld /run/slurmctld.pid || status=1
stop munged /run/munge/munged.pid || status=1
exit $status
