"""Role derivation from the SLURM environment, without SLURM: envs below are the variables Slurm
22.05 set in the measured job steps (see slurm/roles.py), trimmed to what matters."""

from __future__ import annotations

import os

import pytest

from slurm import role as role_main
from slurm import roles
from slurm.roles import (PORT_RANGE, REQUEUE_EXIT_CODE, Layout, RoleError, derive_role,
                         exec_plan, job_ports, learner_nodelist)

JOB = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "c[1-3]", "SLURM_JOB_NUM_NODES": "3"}


def step(**env) -> dict[str, str]:
    return {**JOB, **{k: str(v) for k, v in env.items()}}


def het_step(**env) -> dict[str, str]:
    """A step of a heterogeneous job: learner component on c3 (2 ranks), actors on c[1-2] (4)."""
    base = {"SLURM_JOB_ID": "52", "SLURM_HET_SIZE": "2",
            "SLURM_JOB_NODELIST_HET_GROUP_0": "c3", "SLURM_JOB_NODELIST_HET_GROUP_1": "c[1-2]",
            "SLURM_NTASKS_HET_GROUP_0": "2", "SLURM_NTASKS_HET_GROUP_1": "4",
            "SLURM_JOB_NUM_NODES_HET_GROUP_0": "1", "SLURM_JOB_NUM_NODES_HET_GROUP_1": "2"}
    return {**base, **{k: str(v) for k, v in env.items()}}


LAYOUT = Layout(learner_nodes=1, learner_ranks_per_node=2, actors_per_node=2)


def test_a_learner_step_task_is_the_learner_rank_of_its_procid():
    env = step(SLURM_PROCID=1, SLURM_LOCALID=1, SLURM_NODEID=0, SLURM_NTASKS=2)
    role = derive_role(env, LAYOUT, "10.0.0.1", group="learner")
    assert (role.kind, role.index, role.local_rank, role.local_count) == ("learner", 1, 1, 2)
    assert (role.learner_ranks, role.actors) == (2, 4)  # 1 node x 2 ranks; 2 nodes x 2 actors
    assert role.learner_host == "10.0.0.1" and role.job_id == 41 and role.restart_count == 0


def test_an_actor_step_numbers_actors_by_procid_not_by_its_step_relative_node_id():
    # measured: in the `--relative=1` actor step, c3 has SLURM_NODEID=1 (counted from the step)
    env = step(SLURM_PROCID=3, SLURM_LOCALID=1, SLURM_NODEID=1, SLURM_NTASKS=4)
    role = derive_role(env, LAYOUT, "10.0.0.1", group="actor")
    assert (role.kind, role.index, role.actors) == ("actor", 3, 4)


def test_one_step_over_all_nodes_places_tasks_by_node_and_local_id():
    layout = Layout(learner_nodes=1, learner_ranks_per_node=1, actors_per_node=2)
    places = {}
    for node in range(3):
        for local in range(2):
            env = step(SLURM_PROCID=node * 2 + local, SLURM_LOCALID=local, SLURM_NODEID=node)
            role = derive_role(env, layout, "h")
            places[(node, local)] = (role.kind, role.index)
    assert places == {(0, 0): ("learner", 0), (0, 1): ("idle", -1),
                      (1, 0): ("actor", 0), (1, 1): ("actor", 1),
                      (2, 0): ("actor", 2), (2, 1): ("actor", 3)}


def test_every_actor_id_and_learner_rank_is_taken_exactly_once():
    layout = Layout(learner_nodes=2, learner_ranks_per_node=3, actors_per_node=2)
    env_of = lambda n, l: {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "g[1-5]",  # noqa: E731
                           "SLURM_JOB_NUM_NODES": "5", "SLURM_NODEID": str(n),
                           "SLURM_LOCALID": str(l), "SLURM_PROCID": str(n * 3 + l)}
    roles_ = [derive_role(env_of(n, l), layout, "h") for n in range(5) for l in range(3)]
    learners = sorted(r.index for r in roles_ if r.kind == "learner")
    actors = sorted(r.index for r in roles_ if r.kind == "actor")
    assert learners == list(range(6)) and actors == list(range(6))
    assert {r.learner_ranks for r in roles_} == {6} and {r.actors for r in roles_} == {6}


def test_a_hetjob_takes_the_learner_address_from_component_0_and_counts_from_both():
    env = het_step(SLURM_JOB_NODELIST="c[1-2]", SLURM_JOB_NUM_NODES=2, SLURM_PROCID=2,
                   SLURM_LOCALID=0, SLURM_NODEID=1, SLURM_NTASKS=4)
    assert learner_nodelist(env) == "c3"  # not the actor component's own SLURM_JOB_NODELIST
    role = derive_role(env, LAYOUT, "127.0.0.3", group="actor")
    assert (role.kind, role.index, role.learner_ranks, role.actors) == ("actor", 2, 2, 4)
    assert role.job_id == 52  # both components carry the leader's id


def test_a_hetjob_step_over_both_components_puts_component_0_first():
    # measured: `srun --het-group=0,1` numbers tasks across components, component 0 first
    kinds = [derive_role(het_step(SLURM_PROCID=p, SLURM_LOCALID=p % 2, SLURM_NTASKS=6),
                         LAYOUT, "h") for p in range(6)]
    assert [(r.kind, r.index) for r in kinds] == [("learner", 0), ("learner", 1), ("actor", 0),
                                                   ("actor", 1), ("actor", 2), ("actor", 3)]


def test_a_homogeneous_job_reads_the_learner_address_from_its_first_node():
    assert learner_nodelist(step()) == "c[1-3]"


def test_consecutive_jobs_get_distinct_ports_in_range_unless_pinned():
    ports = [job_ports(j) for j in range(1, 3000)]
    assert len({p[0] for p in ports}) == len(ports)  # no two of 3000 consecutive jobs collide
    assert all(PORT_RANGE[0] <= p[0] and p[2] < PORT_RANGE[1] for p in ports)
    assert job_ports(41, port_base=30000) == (30000, 30001, 30002)


def test_roles_of_one_job_agree_on_ports():
    roles_ = [derive_role(step(SLURM_PROCID=p, SLURM_LOCALID=p % 2, SLURM_NODEID=p // 2),
                          LAYOUT, "h", group="actor") for p in range(4)]
    assert len({(r.master_port, r.zmq_port, r.weights_port) for r in roles_}) == 1


def test_a_job_without_a_node_for_actors_is_refused():
    env = step(SLURM_JOB_NUM_NODES=1, SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0)
    with pytest.raises(RoleError, match="at least one node for actors"):
        derive_role(env, LAYOUT, "h", group="learner")


def test_outside_a_job_step_the_error_names_the_missing_variable():
    with pytest.raises(RoleError, match="SLURM_PROCID is not set"):
        derive_role(dict(JOB), LAYOUT, "h", group="learner")
    with pytest.raises(RoleError, match="SLURM_JOB_NODELIST is not set"):
        learner_nodelist({})


def test_a_step_with_more_tasks_than_the_layout_is_refused():
    env = step(SLURM_PROCID=4, SLURM_LOCALID=0, SLURM_NODEID=0)
    with pytest.raises(RoleError, match="learner index 4 is outside 0..1"):
        derive_role(env, LAYOUT, "h", group="learner")


def learner_role(**kw):
    env = step(SLURM_PROCID=1, SLURM_LOCALID=1, SLURM_NODEID=0, **kw)
    return derive_role(env, LAYOUT, "10.0.0.1", group="learner", port_base=25000)


def test_a_learner_rank_gets_the_rendezvous_env_and_binds_every_interface():
    argv, env = exec_plan(learner_role(), "/runs/a", ["optim.lr=1e-4"], ["py"])
    assert argv[:5] == ["py", "-m", "learner.main", "--run-dir", "/runs/a"]
    assert env == {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "25000", "RANK": "1",
                   "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert "net.bind_host=0.0.0.0" in argv and "--resume" not in argv
    assert argv.index("optim.lr=1e-4") < argv.index("net.learner_host=10.0.0.1")  # launcher wins


def test_a_requeued_learner_resumes():
    argv, _ = exec_plan(learner_role(SLURM_RESTART_COUNT=1), "/runs/a", [], ["py"])
    assert "--resume" in argv


def test_an_actor_gets_its_id_and_the_learner_address_but_no_rendezvous_env():
    env = step(SLURM_PROCID=3, SLURM_LOCALID=1, SLURM_NODEID=1)
    role = derive_role(env, LAYOUT, "10.0.0.1", group="actor", port_base=25000)
    argv, extra = exec_plan(role, "/runs/a", [], ["py"])
    assert argv[:7] == ["py", "-m", "actors.main", "--run-dir", "/runs/a", "--actor-id", "3"]
    assert extra == {}
    assert argv[7:] == ["net.learner_host=10.0.0.1", "net.master_port=25000", "net.zmq_port=25001",
                        "net.weights_port=25002", "actors.count=4", "learner.ranks=2"]


def test_node_addr_is_read_from_scontrol_show_node():
    line = ("NodeName=c2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 CPULoad=0.31 "
            "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.2 "
            "NodeHostName=vm Port=17002 Version=22.05.8 OS=Linux 6.1.0 RealMemory=24105 State=IDLE")
    assert roles.parse_node_addr(line) == "127.0.0.2"
    with pytest.raises(RoleError, match="no NodeAddr"):
        roles.parse_node_addr("Node c9 not found")


@pytest.fixture
def fake_slurm(monkeypatch):
    """role.main with scontrol and execv replaced: returns what would have been exec'd. The
    environment role.main changes is restored afterwards (it execs in real life)."""
    monkeypatch.setattr(roles, "hostnames", lambda nodes: {"c[1-3]": ["c1", "c2", "c3"]}[nodes])
    monkeypatch.setattr(roles, "node_addr", lambda name: {"c1": "192.168.0.11"}[name])
    execd = []
    monkeypatch.setattr(role_main.os, "execv", lambda path, argv: execd.append((path, argv)))
    for k, v in step(SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NODEID=0, SLURM_NTASKS=1).items():
        monkeypatch.setenv(k, v)
    saved = dict(os.environ)
    yield execd
    os.environ.clear()
    os.environ.update(saved)


def test_the_entry_execs_the_learner_with_the_address_of_the_first_node(fake_slurm, monkeypatch):
    monkeypatch.delenv(role_main.EXEC_ENV, raising=False)
    role_main.main(["--run-dir", "/r", "--group", "learner", "a.b=1"])
    [(path, argv)] = fake_slurm
    assert path == argv[0] and argv[1:4] == ["-m", "learner.main", "--run-dir"]
    assert "net.learner_host=192.168.0.11" in argv and "a.b=1" in argv
    assert role_main.os.environ["MASTER_ADDR"] == "192.168.0.11"
    assert role_main.os.environ["RANK"] == "0" and role_main.os.environ["WORLD_SIZE"] == "1"


def test_an_actor_does_not_inherit_rendezvous_env_from_the_submitter(fake_slurm, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "elsewhere")
    monkeypatch.setenv("RANK", "5")
    role_main.main(["--run-dir", "/r", "--group", "actor"])
    assert "MASTER_ADDR" not in role_main.os.environ and "RANK" not in role_main.os.environ


def test_rlvr_slurm_exec_replaces_the_interpreter(fake_slurm, monkeypatch):
    monkeypatch.setenv(role_main.EXEC_ENV, "/bin/echo probe.py")
    role_main.main(["--run-dir", "/r", "--group", "actor", "--actors-per-node", "3"])
    [(path, argv)] = fake_slurm
    assert path == "/bin/echo"
    assert argv[:5] == ["/bin/echo", "probe.py", "-m", "actors.main", "--run-dir"]
    assert "actors.count=6" in argv


def test_an_idle_task_exits_without_exec(fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURM_LOCALID", "1")  # node 0 has one learner rank: local id 1 is surplus
    assert role_main.main(["--run-dir", "/r"]) == 0
    assert fake_slurm == []


def test_the_requeue_exit_code_is_not_a_common_failure_code():
    assert REQUEUE_EXIT_CODE not in (0, 1, 2, 124, 137, 143)


def test_the_entry_outside_a_job_says_so_and_exits_2(monkeypatch, capsys):
    for k in ("SLURM_JOB_NODELIST", "SLURM_HET_SIZE", "SLURM_JOB_NODELIST_HET_GROUP_0"):
        monkeypatch.delenv(k, raising=False)
    assert role_main.main(["--run-dir", "/r", "--group", "learner"]) == 2
    assert "SLURM_JOB_NODELIST is not set" in capsys.readouterr().err
