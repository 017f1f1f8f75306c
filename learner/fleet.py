"""The learner's hold on its actors: who is alive, `processes.json`, and the weights they hold.

`publish` sends the current weights to the live actors, first forming a new weight group
(over the rendezvous store rank 0 hosts) when the members changed; a broadcast that fails (an
actor died in it) closes the group, and the learner waits until every member has beaten since
or is taken for dead, then forms it again with the live ones. `keep` notices lost and new actors
between steps and stops the run when none has been alive for `weight_sync.timeout_s`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from learner.actor_eval import ActorEvals
from learner.coordinator import Coordinator
from learner.engine import publish_weights
from learner.run_log import write_json_atomic
from protocol.config import Config
from protocol.transport import LearnerEndpoint
from protocol.weights import WeightGroup, WeightSyncError, announce_sync

log = logging.getLogger(__name__)


class Fleet:
    def __init__(self, cfg: Config, coord: Coordinator, endpoint: LearnerEndpoint, store,
                 engine, run_dir: Path, version: int, actor_evals: ActorEvals | None = None):
        """`store`: the weight group's rendezvous store (protocol.weights.host_store), hosted
        from the learner's start for the whole run."""
        self.cfg, self.coord, self.endpoint, self.store = cfg, coord, endpoint, store
        self.engine, self.run_dir, self.actor_evals = engine, run_dir, actor_evals
        self.group: WeightGroup | None = None
        # the version the actors hold (the last one published): admission counts from it, since
        # under weight_sync.sync_every > 1 they sample up to sync_every - 1 versions behind
        self.actors_version = version
        self.waits: list[float] = []  # learner waits of the syncs since the last step logged
        self.sent = (0, 0)  # the last sync's buckets and bytes (weight_sync.bucket_mb)
        self.no_actors_since: float | None = None
        self.roster_written: dict | None = None  # the actors processes.json lists

    def write_processes(self) -> None:
        """processes.json: every role's pid, host and endpoints; rewritten when actors change."""
        net = self.cfg.net
        self.roster_written = self.coord.roster()
        write_json_atomic(self.run_dir / "processes.json", {
            "learner": {"pid": os.getpid(), "host": socket.gethostname(),
                        "zmq": self.endpoint.address,
                        "weights": f"{net.learner_host}:{net.weights_port}"},
            "actors": self.roster_written})

    def publish(self, version: int) -> float:
        """Send weights `version` to the actors (a new weight group first when the live actors
        changed), forming the group again after a failed broadcast. Returns the seconds taken."""
        c, coord = self.cfg, self.coord
        t0 = time.time()
        while True:
            self.keep()
            try:
                self._sync_once(version)
                return time.time() - t0
            except WeightSyncError as e:
                coord.stats["faults/weight_sync_failures"] += 1
                log.warning("weight sync of version %d failed: %s", version, e)
                self._close_group()
                failed_at = time.monotonic()
                deadline = failed_at + c.actors.heartbeat_timeout_s
                while any(a.last_seen < failed_at for a in coord.actors.values()) \
                        and time.monotonic() < deadline:
                    coord.poll(0.05)
                    coord.reap(c.actors.heartbeat_timeout_s)

    def _sync_once(self, version: int) -> None:
        c, coord = self.cfg, self.coord
        new_epoch = self.group is None or coord.membership_changed
        if new_epoch:
            self._close_group()
        t0 = time.time()  # sync/learner_wait_s: from telling the actors to the last one's copy
        reached = coord.sync_weights(version, new_epoch)
        announce_sync(self.store, coord.epoch, version, reached)
        if new_epoch:
            self.write_processes()
        if not reached:
            raise WeightSyncError("a weight group member could not be reached")
        if new_epoch:
            self.group = WeightGroup.create(c.net.learner_host, c.net.weights_port, 0,
                                            len(coord.members) + 1, c.weight_sync.timeout_s,
                                            c.weight_backend, epoch=coord.epoch, store=self.store)
        self.sent = publish_weights(self.engine, self.group, c.weight_sync.bucket_mb << 20)
        self.actors_version = version
        self.waits.append(time.time() - t0)

    def _close_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def keep(self, reform_at: int | None = None) -> None:
        """Notice lost and new actors; with `reform_at`, give that version's weights to a
        changed group now. Stops the run when no actor has been alive for
        `weight_sync.timeout_s`."""
        c, coord = self.cfg, self.coord
        coord.reap(c.actors.heartbeat_timeout_s)  # reads what is waiting first
        if coord.roster() != self.roster_written:  # lost, or back from the dead
            self.write_processes()
        if self.actor_evals:  # an evaluation whose share was on a lost actor is abandoned
            self.actor_evals.check_actors(coord.actors)
        now = time.monotonic()
        if coord.actors:
            self.no_actors_since = None
        elif self.no_actors_since is None:
            self.no_actors_since = now
        elif now - self.no_actors_since > c.weight_sync.timeout_s:
            raise RuntimeError(f"no live actor for {c.weight_sync.timeout_s:.0f} s "
                               "(weight_sync.timeout_s): stopping the run")
        if reform_at is not None and coord.actors and coord.membership_changed:
            self.publish(reform_at)

    def sync_metrics(self) -> dict:
        """The learner's wait in the broadcasts since the last call (one per sync), and the
        actors' seconds from joining a broadcast to decoding with its weights, as they reported
        them since (a heartbeat after each sync: often the next step's row)."""
        coord, out = self.coord, {}
        if coord.sync_seconds:
            reported, coord.sync_seconds = coord.sync_seconds, []
            out["sync/s"] = sum(reported) / len(reported)
        if self.waits:
            waits, self.waits = self.waits, []
            out.update({"sync/learner_wait_s": sum(waits) / len(waits), "sync/count": len(waits)})
        return out

    def metrics(self) -> dict:
        """Cumulative counts: messages the endpoint rejected (by codec reason) and faults."""
        rejected = self.endpoint.rejected
        return {"protocol/rejected": sum(rejected.values()),
                **{f"protocol/rejected/{reason}": n for reason, n in rejected.items()},
                **self.coord.fault_metrics()}

    def close(self, version: int, reason: str) -> None:
        """Tell the actors to stop, leave the weight group, close the endpoint."""
        self.coord.shutdown(version, reason)
        self._close_group()
        self.store = None
        self.endpoint.close()
