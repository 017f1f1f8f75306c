"""`rlvr plan`: predict what a cluster split would give, from one run's measured costs.

    sim.py      the schedule as an event simulation (actors, admission, work items, weight
                syncs, the learner): pure, property-tested (tests/test_plan_sim.py)
    model.py    how long a work item takes: the rollout's engine calls, fitted to a run
    measure.py  what a run folder measured (config.yaml, metrics.jsonl) -> simulator inputs
    report.py   the command: a table per split and the split to buy for a GPU budget

`rlvr bench plan CONFIG` checks the predictions against real runs on this machine.
"""
