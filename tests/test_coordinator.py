"""The coordinator's bookkeeping over real sockets: membership, lost actors and re-issued work."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from learner.admission import Admission
from learner.coordinator import Coordinator
from protocol.messages import (PROTOCOL_VERSION, Group, Heartbeat, Hello, Prompt, RolloutSpec,
                               Sample, SyncWeights, Work)
from protocol.staleness import Staleness
from protocol.transport import ActorEndpoint, LearnerEndpoint
from tests.calibration import record

V = PROTOCOL_VERSION
SPEC = RolloutSpec(strategy="fixed", max_new_tokens=4)


def prompt_stream():
    for i in itertools.count():
        yield Prompt(group_id=f"g{i}", prompt_id=f"p{i}", prompt_token_ids=[1, 2], answer="3", n=2)


@pytest.fixture
def learner():
    with LearnerEndpoint(port=0) as endpoint:
        yield endpoint


def make_coordinator(learner, per_step=4, per_work=2, max_staleness=0) -> Coordinator:
    return Coordinator(learner, Admission(prompt_stream(), SPEC, per_step, per_work,
                                          Staleness(max_staleness)))


def join(coord: Coordinator, actor_id: int, pid: int) -> ActorEndpoint:
    actor = ActorEndpoint("127.0.0.1", coord.endpoint.port, f"actor-{actor_id}-{pid}".encode())
    actor.send(Hello(protocol_version=V, policy_version=-1, actor_id=actor_id, host="h", pid=pid))
    assert coord.poll(5.0)
    return actor


def recv_all(actor: ActorEndpoint, kind) -> list:
    out = []
    while (msg := actor.recv(0.5)) is not None:
        if isinstance(msg, kind):
            out.append(msg)
    return out


def group_for(prompt: Prompt, actor_id: int) -> Group:
    sample = Sample(token_ids=[5], logprobs=[-0.1], policy_version=0, reward=1.0, acc=True,
                    truncated=False)
    return Group(protocol_version=V, policy_version=0, group_id=prompt.group_id,
                 prompt_id=prompt.prompt_id, actor_id=actor_id, work_id="w",
                 prompt_token_ids=prompt.prompt_token_ids, samples=[sample, sample])


def test_work_goes_only_to_members_of_the_weight_group(learner):
    coord = make_coordinator(learner)
    a0 = join(coord, 0, 100)
    assert coord.admit(version=0) == 0  # joined, but holds no weights yet
    assert coord.membership_changed
    assert coord.sync_weights(0, new_epoch=True)
    [sync] = recv_all(a0, SyncWeights)
    assert (sync.group_epoch, sync.rank, sync.world_size) == (1, 1, 2)
    assert coord.admit(version=0) == 4
    assert not coord.membership_changed
    a0.close()


def test_a_lost_actors_prompts_go_out_again_first_without_a_new_admission_slot(learner):
    coord = make_coordinator(learner)
    a0, a1 = join(coord, 0, 100), join(coord, 1, 101)
    assert coord.sync_weights(0, new_epoch=True)
    coord.admit(version=0)
    assert coord.admission.slots_taken == 4
    handed = {m.work_id: m for m in recv_all(a0, Work)}
    lost_ids = {p.group_id for w in handed.values() for p in w.prompts}
    a0.close()
    coord.lose(coord.actors[b"actor-0-100"], "test")
    assert sorted(p.group_id for p in coord.admission.reissue) == sorted(lost_ids)
    assert coord.membership_changed  # the group must be formed again
    assert coord.sync_weights(0, new_epoch=True)
    coord.admit(version=0)  # the bound is full: only the re-issued prompts go out
    assert coord.admission.slots_taken == 4
    reissued = {p.group_id for w in recv_all(a1, Work) for p in w.prompts}
    assert lost_ids <= reissued
    assert coord.stats["faults/actors_lost"] == 1
    assert coord.stats["faults/prompts_reissued"] == len(lost_ids)
    a1.close()


def test_a_group_that_arrives_twice_is_ingested_once(learner):
    coord = make_coordinator(learner)
    a0 = join(coord, 0, 100)
    first = next(prompt_stream())
    for _ in range(2):
        a0.send(group_for(first, 0))
        assert coord.poll(5.0)
    assert len(coord.take(10)) == 1
    assert coord.stats["groups/duplicates_ignored"] == 1
    a0.close()


def test_a_restarted_actor_replaces_its_old_process_and_counts_as_a_restart(learner):
    coord = make_coordinator(learner)
    old = join(coord, 0, 100)
    assert coord.sync_weights(0, new_epoch=True)
    coord.admit(version=0)
    new = join(coord, 0, 200)
    assert list(coord.actors) == [b"actor-0-200"]
    assert coord.stats["faults/actor_restarts"] == 1
    assert len(coord.admission.reissue) == 4
    old.close()
    new.close()


def test_a_silent_actor_is_reaped_and_one_that_beats_is_kept(learner):
    coord = make_coordinator(learner)
    quiet, beating = join(coord, 0, 100), join(coord, 1, 101)
    time.sleep(0.6)
    beating.send(Heartbeat(protocol_version=V, policy_version=0, actor_id=1, busy=False))
    assert coord.poll(5.0)
    lost = coord.reap(timeout_s=0.5)
    [kept] = coord.actors.values()
    # the window: the beating actor must look alive at the reap (read less than 0.5 s before)
    record("s since the beating actor was read, at the reap", time.monotonic() - kept.last_seen,
           high=0.5)
    assert [a.actor_id for a in lost] == [0]
    assert [a.actor_id for a in coord.actors.values()] == [1]
    quiet.close()
    beating.close()


def test_an_actor_whose_heartbeats_wait_unread_while_the_learner_was_busy_is_not_reaped(
        learner):
    """After a broadcast that timed out (20 s without reading) a live actor's heartbeats wait
    in the queue: it was once reaped before they were read, came back on the next one and
    counted as lost (faults/actors_lost 3 after two kills in tests/test_faults.py)."""
    coord = make_coordinator(learner)
    a0, a1 = join(coord, 0, 100), join(coord, 1, 101)
    deadline = time.monotonic() + 0.8  # the learner is busy: it reads nothing meanwhile
    while time.monotonic() < deadline:
        for actor_id, actor in ((0, a0), (1, a1)):
            actor.send(Heartbeat(protocol_version=V, policy_version=0, actor_id=actor_id,
                                 busy=True))
        time.sleep(0.1)
    time.sleep(0.2)
    assert coord.poll(5.0)  # the failed-sync wait reads one message, then reaps
    assert coord.reap(timeout_s=0.5) == []
    record("s since the least recently read actor was read, at the reap",
           time.monotonic() - min(a.last_seen for a in coord.actors.values()), high=0.5)
    assert sorted(a.actor_id for a in coord.actors.values()) == [0, 1]
    assert coord.stats["faults/actors_lost"] == 0
    a0.close()
    a1.close()


def test_a_heartbeat_from_an_actor_taken_for_dead_brings_it_back(learner):
    coord = make_coordinator(learner)
    slow = join(coord, 0, 100)
    coord.lose(coord.actors[b"actor-0-100"], "test")
    slow.send(Heartbeat(protocol_version=V, policy_version=0, actor_id=0, busy=False))
    assert coord.poll(5.0)
    assert [a.actor_id for a in coord.actors.values()] == [0]
    assert coord.membership_changed
    slow.close()


def test_a_member_taken_for_dead_that_beats_again_is_a_member_still_and_gets_work(learner):
    """A weight group member lost to silence (only slow: a vLLM actor's first steps beside a busy
    machine) and heard from before any sync: it never left the group, which stays as it was, and
    work goes to it. Back as a newcomer of rank 0 in the unchanged group, it got no work and no
    new group was formed: a sync-mode run waited for its next step until it timed out."""
    coord = make_coordinator(learner)
    slow = join(coord, 0, 100)
    assert coord.sync_weights(0, new_epoch=True)
    assert coord.admit(0) == 4
    coord.reap(timeout_s=0.0)  # silent since it joined
    assert coord.actors == {} and coord.stats["faults/actors_lost"] == 1
    recv_all(slow, Work)
    slow.send(Heartbeat(protocol_version=V, policy_version=0, actor_id=0, busy=False))
    assert coord.poll(5.0)
    assert not coord.membership_changed
    assert coord.roster()["0"]["pid"] == 100 and coord.roster()["0"]["weight_rank"] == 1
    assert coord.admit(0) == 4  # the lost prompts, handed out again
    assert [p.group_id for w in recv_all(slow, Work) for p in w.prompts] == ["g0", "g1", "g2", "g3"]
    slow.close()


def test_processes_json_lists_the_actors_alive_as_they_are_lost_and_come_back(learner, tmp_path):
    """tests/test_faults.py and a user's `kill` find an actor's pid there."""
    from learner.fleet import Fleet
    from protocol.config import load_config
    from tests.conftest import TINY

    coord = make_coordinator(learner)
    fleet = Fleet(load_config(TINY), coord, learner, None, None, tmp_path, 0)
    slow = join(coord, 0, 100)
    assert coord.sync_weights(0, new_epoch=True)
    fleet.write_processes()  # as a new weight group does

    def listed():
        fleet.keep()
        return {a: (v["pid"], v["weight_rank"]) for a, v in
                json.loads((tmp_path / "processes.json").read_text())["actors"].items()}

    assert listed() == {"0": (100, 1)}
    coord.actors[b"actor-0-100"].last_seen -= 1000  # silent past actors.heartbeat_timeout_s
    assert listed() == {}
    slow.send(Heartbeat(protocol_version=V, policy_version=0, actor_id=0, busy=False))
    time.sleep(0.2)
    assert listed() == {"0": (100, 1)}
    slow.close()


def test_a_member_lost_while_a_group_formed_without_it_comes_back_as_a_newcomer(learner):
    coord = make_coordinator(learner)
    a0, a1 = join(coord, 0, 100), join(coord, 1, 101)
    assert coord.sync_weights(0, new_epoch=True)
    coord.lose(coord.actors[b"actor-1-101"], "silent")
    assert coord.sync_weights(1, new_epoch=True)  # the group without actor 1
    a1.send(Heartbeat(protocol_version=V, policy_version=1, actor_id=1, busy=False))
    assert coord.poll(5.0)
    assert coord.roster()["1"]["weight_rank"] == 0 and coord.membership_changed
    a0.close()
    a1.close()


def test_each_sync_an_actor_reports_is_counted_once_however_many_heartbeats_repeat_it(learner):
    coord = make_coordinator(learner)
    actor = join(coord, 0, 100)
    for version, sync_s in ((-1, 0.0), (0, 0.25), (0, 0.25), (0, 0.25), (1, 0.5), (1, 0.5)):
        actor.send(Heartbeat(protocol_version=V, policy_version=version, actor_id=0, busy=False,
                             sync_s=sync_s))
        assert coord.poll(5.0)
    assert coord.sync_seconds == [0.25, 0.5]
    actor.close()


def test_a_sync_to_a_closed_actor_reports_it_unreached_and_loses_it(learner):
    coord = make_coordinator(learner)
    a0, a1 = join(coord, 0, 100), join(coord, 1, 101)
    assert coord.sync_weights(0, new_epoch=True)
    a1.close()
    deadline = time.monotonic() + 5.0
    reached = True
    while reached and time.monotonic() < deadline:  # ZeroMQ notices the closed peer shortly
        reached = coord.sync_weights(1, new_epoch=False)
        time.sleep(0.05)
    assert not reached
    assert [a.actor_id for a in coord.actors.values()] == [0]
    assert coord.membership_changed
    a0.close()


def test_heartbeats_a_dead_actor_sent_before_it_died_do_not_bring_it_back(learner):
    """Read after its loss, they once put the dead peer into the next weight group and counted
    its loss again when the restarted process said hello."""
    coord = make_coordinator(learner)
    dead = join(coord, 0, 100)
    assert coord.sync_weights(0, new_epoch=True)
    for _ in range(3):  # queued at the learner, not read yet
        dead.send(Heartbeat(protocol_version=V, policy_version=0, actor_id=0, busy=False))
    time.sleep(0.2)
    dead.close()
    deadline = time.monotonic() + 5.0
    while coord.actors and time.monotonic() < deadline:  # ZeroMQ notices the closed peer
        coord.sync_weights(1, new_epoch=False)
        time.sleep(0.05)
    assert not coord.actors
    coord.drain()
    assert not coord.actors and coord.stats["faults/late_heartbeats"] == 3
    restarted = join(coord, 0, 200)
    assert list(coord.actors) == [b"actor-0-200"]
    assert coord.stats["faults/actors_lost"] == 1
    assert coord.stats["faults/actor_restarts"] == 1
    restarted.close()


def test_a_heartbeat_from_a_replaced_process_does_not_bring_it_back(learner):
    coord = make_coordinator(learner)
    old = join(coord, 0, 100)
    new = join(coord, 0, 200)
    old.send(Heartbeat(protocol_version=V, policy_version=0, actor_id=0, busy=False))
    assert coord.poll(5.0)
    assert list(coord.actors) == [b"actor-0-200"]
    assert coord.stats["faults/actors_lost"] == 1
    old.close()
    new.close()


def test_the_start_waits_for_every_actors_hello_and_gives_up_naming_the_key(learner):
    """The learner waits `actors.start_timeout_s` for the actors' hellos; the weight sync's own
    timeout was used once, and a vLLM actor starting beside other work on a 2-core machine
    outlasted its 120 s."""
    coord = make_coordinator(learner)
    a0 = ActorEndpoint("127.0.0.1", coord.endpoint.port, b"actor-0-100")
    a0.send(Hello(protocol_version=V, policy_version=-1, actor_id=0, host="h", pid=100))
    coord.wait_for_actors(1, timeout_s=5.0)  # a hello not read yet counts
    assert list(coord.actors) == [b"actor-0-100"]
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"only 1 of 2 actors said hello within 1 s "
                                           r"\(actors.start_timeout_s\)"):
        coord.wait_for_actors(2, timeout_s=1.0)
    elapsed = time.monotonic() - t0
    # its low end is the deadline itself (giving up early is a bug, not noise): only the high
    # end is a margin
    record("wait_for_actors(timeout_s=1.0) gives up after s", elapsed, high=3.0)
    assert 1.0 <= elapsed < 3.0
    a0.close()


def test_a_checkpoint_keeps_every_prompt_not_yet_taken_and_a_resumed_coordinator_sends_it_first(
        learner):
    coord = make_coordinator(learner, max_staleness=1)
    a0 = join(coord, 0, 100)
    assert coord.sync_weights(0, new_epoch=True)
    assert coord.admit(version=0) == 8  # two steps' prompts, g0..g7
    prompts = {p.group_id: p for w in recv_all(a0, Work) for p in w.prompts}
    for gid in ("g0", "g1", "g2", "g5"):  # four come back; three are taken (trained)
        a0.send(group_for(prompts[gid], 0))
        assert coord.poll(5.0)
    assert [g.group_id for g in coord.take(3)] == ["g0", "g1", "g2"]
    coord.stats["faults/actors_lost"] = 2
    state = coord.state_dict()
    # in flight (g3, g4, g6, g7) and returned but not taken (g5): kept, in hand-out order
    assert [p["group_id"] for p in state["pending"]] == ["g3", "g4", "g5", "g6", "g7"]
    a0.close()

    resumed = Coordinator(learner, Admission(iter([]), SPEC, 4, 2, Staleness(1), slots_taken=0))
    resumed.load_state_dict(state)
    b0 = join(resumed, 0, 200)
    assert resumed.sync_weights(1, new_epoch=True)
    assert resumed.epoch == state["epoch"] + 1 and resumed.stats["faults/actors_lost"] == 2
    # the pending prompts go out again, with their group ids and no new admission slot (the
    # stream is empty: one fresh prompt would raise StopIteration)
    assert resumed.admit(version=0) == 5 and resumed.admission.slots_taken == 8
    again = [p for w in recv_all(b0, Work) for p in w.prompts]
    assert again == [prompts[g] for g in ("g3", "g4", "g5", "g6", "g7")]
    b0.close()


def test_a_prompt_whose_group_came_back_after_its_actor_was_lost_is_not_handed_out_again(
        learner):
    coord = make_coordinator(learner)
    a0, a1 = join(coord, 0, 100), join(coord, 1, 101)
    assert coord.sync_weights(0, new_epoch=True)
    coord.admit(version=0)
    slow = [p for w in recv_all(a0, Work) for p in w.prompts]
    recv_all(a1, Work)
    coord.lose(coord.actors[b"actor-0-100"], "silent")  # only slow: its groups still come
    a0.send(group_for(slow[0], 0))
    assert coord.poll(5.0)
    assert [g.group_id for g in coord.take(1)] == [slow[0].group_id]  # trained
    coord.admit(version=0)  # the reissue: only the prompt whose group never came
    again = [p.group_id for w in recv_all(a1, Work) for p in w.prompts]
    assert again == [slow[1].group_id]
    assert slow[0].group_id not in [p["group_id"] for p in coord.state_dict()["pending"]]
    a0.close()
    a1.close()


def test_groups_held_in_the_delay_line_stay_pending_until_trained(learner):
    # stale_inject: the learner takes a group when it arrives but trains it K steps later; a
    # checkpoint in between must keep its prompt, or a resume would lose it
    coord = make_coordinator(learner, max_staleness=1)
    a0 = join(coord, 0, 100)
    assert coord.sync_weights(0, new_epoch=True)
    coord.admit(version=0)
    prompts = {p.group_id: p for w in recv_all(a0, Work) for p in w.prompts}
    for gid in ("g0", "g1"):
        a0.send(group_for(prompts[gid], 0))
        assert coord.poll(5.0)
    held = coord.take(2, keep_pending=True)
    assert [g.group_id for g in held] == ["g0", "g1"] and coord.ready == []
    assert [p["group_id"] for p in coord.state_dict()["pending"]][:2] == ["g0", "g1"]
    coord.trained(["g0"])
    assert [p["group_id"] for p in coord.state_dict()["pending"]][:2] == ["g1", "g2"]
    a0.close()


def test_groups_sort_by_when_their_prompts_were_handed_out(learner):
    # the delay line deals its fill in this order; a group already trained has no place in it
    coord = make_coordinator(learner, max_staleness=1)
    a0 = join(coord, 0, 100)
    assert coord.sync_weights(0, new_epoch=True)
    coord.admit(version=0)
    prompts = [p for w in recv_all(a0, Work) for p in w.prompts]
    for p in reversed(prompts[:3]):  # the last one handed out finished first
        a0.send(group_for(p, 0))
        assert coord.poll(5.0)
    held = coord.take(3, keep_pending=True)
    assert [g.group_id for g in held] == [p.group_id for p in reversed(prompts[:3])]
    assert [g.group_id for g in coord.in_handout_order(held)] == [
        p.group_id for p in prompts[:3]]
    coord.trained([prompts[0].group_id])  # no longer pending: last, not lost
    assert [g.group_id for g in coord.in_handout_order(held)] == [
        p.group_id for p in (prompts[1], prompts[2], prompts[0])]
    a0.close()
