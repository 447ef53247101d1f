#!/usr/bin/env bash
# A real one-node Slurm cluster on this Debian host, for tests/test_cluster.py and for trying
# `snakemake --profile profiles/slurm` before a real cluster. Run as root:
#
#   tests/cluster/slurm-up.sh      # install (if missing), configure, start; waits until the node is idle
#   tests/cluster/slurm-down.sh    # stop what this script started
#
# The node advertises what this machine really has (`slurmd -C`: CPUs, sockets, cores, memory).
# No accounting daemon (slurmdbd): finished jobs stay visible to `squeue --states=all` for
# MinJobAge seconds, so Snakemake's Slurm plugin is run with `--slurm-status-command squeue` here.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARKER="# Written by kvlab tests/cluster/slurm-up.sh"
STATE=/run/kvlab-slurm              # what this script started, for slurm-down.sh
PARTITION=${KVLAB_SLURM_PARTITION:-debug}
WAIT_S=${KVLAB_SLURM_WAIT_S:-90}

say() { echo "slurm-up: $*"; }
die() { echo "slurm-up: $*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "run as root: it installs Debian packages and starts munged, slurmctld and slurmd"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
   || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || die "slurmctld/slurmd/munged are missing and there is no apt-get: install Slurm and MUNGE by hand"
    say "installing slurm-wlm and munge (apt-get)"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
fi

if [[ -e $CONF ]] && ! grep -qF "$MARKER" "$CONF"; then
    die "$CONF exists and was not written by this script: this host already has a Slurm setup; not touching it"
fi

mkdir -p "$STATE"

# MUNGE: Slurm's daemons and clients authenticate each other with it.
if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    mungekey --create --force --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "munged already running"
else
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$STATE/munged"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
    munge -n | unmunge >/dev/null || die "munged did not start"
fi

# The node as slurmd sees it: "NodeName=HOST CPUs=N Boards=... RealMemory=MB".
NODE_LINE=$(slurmd -C | head -n 1)
NODE=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$NODE_LINE")
[[ -n $NODE ]] || die "slurmd -C printed no NodeName line: $NODE_LINE"

cat > "$CONF" <<CONF
$MARKER: a one-node test cluster on $NODE.
ClusterName=kvlab
SlurmctldHost=$NODE
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups: they are not writable in every container this runs in.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# Cores and memory are what jobs ask for and get.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# No accounting daemon: sacct has nothing to ask, squeue shows finished jobs for MinJobAge seconds.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
# A test cluster: a job's processes get 10 s after scancel's SIGTERM, then SIGKILL.
KillWait=10
$NODE_LINE State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
say "wrote $CONF: $NODE_LINE, partition $PARTITION"

install -d -o slurm -g slurm /var/lib/slurm/slurmctld /var/log/slurm
install -d -o root -g root /var/lib/slurm/slurmd

if scontrol ping 2>/dev/null | grep -q "is UP"; then
    say "slurmctld already running: reconfiguring"
    scontrol reconfigure
else
    slurmctld -c          # -c: a clean start, no jobs left from an earlier run
    touch "$STATE/slurmctld"
fi
if pgrep -x slurmd >/dev/null; then
    say "slurmd already running"
else
    slurmd
    touch "$STATE/slurmd"
fi

# Wait until the node takes jobs.
for _ in $(seq "$WAIT_S"); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    case $state in
        idle*) break ;;
        down*|drain*) scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 1
done
if [[ ${state:-} != idle* ]]; then
    echo "slurm-up: node $NODE is '${state:-unknown}', not idle, after ${WAIT_S} s; the daemons' logs say:" >&2
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
    exit 1
fi
sinfo
say "Slurm $(sinfo -V | awk '{print $2}') is up: one node ($NODE), partition $PARTITION"
