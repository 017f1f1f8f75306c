#!/usr/bin/env bash
# Install (if needed) and (re)start a throw-away SLURM cluster on this machine, for tests and demos.
# Debian 12 (Slurm 22.05), root, no systemd. Idempotent: re-running restarts it with empty state.
# Adapted from a tested single-machine recipe; used by the `slurm_cluster` pytest fixture.
#   SLURM_CI_DIR    work dir (default /tmp/slurmci); PID files land here:
#                   slurmctld.pid, slurmd-<node>.pid, munged.pid (only when this script started it)
#   SLURM_CI_NODES  1 = one real node named $(hostname -s); N>1 = N emulated nodes c1..cN
#                   (one slurmd each on this machine, ports 17001..; NodeAddr 127.0.0.1..N, all
#                   loopback, so tests can tell which node's address a task was given)
#   SLURM_CI_CPUS   CPUs per node (default: nproc; may exceed real cores)
# Exit 2 (and a reason on stderr) when it cannot run here: not root, the packages cannot be
# installed, or /etc/slurm/slurm.conf belongs to a real cluster (ClusterName other than ci).
# Any other failure exits non-zero (when the nodes do not come up, with the daemon logs' tails).
set -euo pipefail
D=${SLURM_CI_DIR:-/tmp/slurmci}
N=${SLURM_CI_NODES:-1}
CPUS=${SLURM_CI_CPUS:-$(nproc)}
HOST=$(hostname -s)
export DEBIAN_FRONTEND=noninteractive
[ "$(id -u)" = 0 ] || { echo "up.sh: needs root (starts slurmctld/slurmd/munged)" >&2; exit 2; }
if [ -e /etc/slurm/slurm.conf ] && ! grep -qx 'ClusterName=ci' /etc/slurm/slurm.conf; then
  echo "up.sh: /etc/slurm/slurm.conf belongs to another cluster; not overwriting it" >&2; exit 2
fi
mkdir -p "$D"

# 1. packages (policy-rc.d stops postinst from starting daemons without a config)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || { echo "up.sh: SLURM missing and no apt-get" >&2; exit 2; }
  added_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; added_policy=1
  fi
  ok=1
  { apt-get update -q && apt-get install -y -q --no-install-recommends \
      slurmctld slurmd slurm-client munge; } >"$D/apt.log" 2>&1 || ok=0
  if [ "$added_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  [ "$ok" = 1 ] || { echo "up.sh: apt-get could not install SLURM (see $D/apt.log):" >&2
                     tail -n 5 "$D/apt.log" >&2; exit 2; }
fi

# 2. munge (key is normally created by the package's postinst)
[ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
# $D/munged.pid names a munged this script started earlier (kept across re-runs); drop it if stale
if [ -s "$D/munged.pid" ] \
   && [ "$(cat /proc/"$(cat "$D/munged.pid")"/comm 2>/dev/null)" != munged ]; then
  rm -f "$D/munged.pid"
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  install -d -o munge -g munge -m 755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force
  for i in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  cp /run/munge/munged.pid "$D/munged.pid"   # ours to stop in down.sh
fi
munge -n | unmunge >/dev/null

# 3. stop daemons left by a previous run (by PID file), then start from empty state
for f in "$D"/slurmd-*.pid "$D"/slurmctld.pid; do
  [ -s "$f" ] || continue
  p=$(cat "$f"); kill "$p" 2>/dev/null || true
  for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
done
rm -rf "$D/state" "$D/spool" "$D/log" "$D"/slurmd-*.pid "$D/slurmctld.pid"
mkdir -p "$D/state" "$D/spool" "$D/log"

MEM=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
if [ "$N" = 1 ]; then
  NODES=$HOST
  NODELINE="NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
else
  NODES="c[1-$N]"
  NODELINE="NodeName=c[1-$N] NodeHostname=$HOST NodeAddr=127.0.0.[1-$N] Port=[17001-$((17000+N))] CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
fi
# Schedule every second, not every 30 s (backfill, which starts heterogeneous jobs) and 60 s (the
# main loop, which is the only one to notice that a held job's BeginTime has passed)
mkdir -p /etc/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
DependencyParameters=kill_invalid_depend
SchedulerParameters=bf_interval=1,sched_interval=1
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
$NODELINE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

# 4. start daemons (they daemonise themselves) and wait until every node is idle
t0=$(date +%s%N)
slurmctld
if [ "$N" = 1 ]; then slurmd; else for i in $(seq 1 "$N"); do slurmd -N "c$i"; done; fi
idle=0
for i in $(seq 300); do
  idle=$(sinfo -h -t idle -o %D 2>/dev/null | awk '{s+=$1} END {print s+0}')
  [ "$idle" = "$N" ] && break; sleep 0.1
done
sinfo
[ "$idle" = "$N" ] || { echo "nodes not idle" >&2; tail -n 30 "$D"/log/*.log >&2; exit 1; }
echo "cluster up: $N node(s) $NODES idle $(( ($(date +%s%N) - t0) / 1000000 )) ms after start"
