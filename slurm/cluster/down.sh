#!/usr/bin/env bash
# Stop the cluster started by up.sh, by PID: slurmd(s), slurmctld, then munged if up.sh started it
# (KEEP_MUNGE=1 leaves it running). Job steps still running die with their slurmd.
#   SLURM_CI_DIR  the same work dir given to up.sh (default /tmp/slurmci)
D=${SLURM_CI_DIR:-/tmp/slurmci}
rc=0
# alive: exists and is not a zombie waiting for its parent (the daemons' parent is PID 1)
alive() { kill -0 "$1" 2>/dev/null && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null; }
stop() { [ -s "$1" ] || return 0; p=$(cat "$1"); kill "$p" 2>/dev/null || { rm -f "$1"; return 0; }
         for i in $(seq 100); do alive "$p" || { rm -f "$1"; return 0; }; sleep 0.1; done
         echo "PID $p ($1) still alive after 10 s" >&2; return 1; }
for f in "$D"/slurmd-*.pid; do stop "$f" || rc=1; done
stop "$D/slurmctld.pid" || rc=1
if [ "${KEEP_MUNGE:-0}" != 1 ] && [ -s "$D/munged.pid" ]; then
  if [ "$(cat /proc/"$(cat "$D/munged.pid")"/comm 2>/dev/null)" = munged ]; then
    stop "$D/munged.pid" || rc=1
  else rm -f "$D/munged.pid"; fi
fi
exit $rc
