"""What CI promises: a real component that cannot start fails the run there, instead of skipping."""

import pytest

from tests.slurm_cluster import cannot_run


def test_under_ci_a_component_that_cannot_start_fails(monkeypatch):
    monkeypatch.setenv("RLVR_CI", "1")
    with pytest.raises(pytest.fail.Exception, match="no SLURM cluster: needs root"):
        cannot_run("no SLURM cluster: needs root")


def test_elsewhere_it_skips_with_its_reason(monkeypatch):
    monkeypatch.delenv("RLVR_CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        cannot_run("no SLURM cluster: needs root")
