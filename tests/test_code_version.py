"""Which code made a run (learner/code_version.py): the commit and whether tracked files differed,
read from a real git checkout, and the line a sweep says when it reuses a run made by other code."""

import subprocess
from pathlib import Path

from learner.code_version import code_version, differs, label
from rlvr.bench import common


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_the_commit_and_a_change_to_a_tracked_file_are_read_from_the_checkout(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "notes.txt").write_text("untracked files are not the code\n")
    assert code_version(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == {"commit": head, "dirty": True}
    assert label(code_version(tmp_path)) == head[:7] + "+changes"


def test_outside_a_checkout_the_code_is_unknown_not_guessed(tmp_path):
    assert code_version(tmp_path) == {"commit": None, "dirty": None}
    assert label(None) == label(code_version(tmp_path)) == "unknown"


def test_only_the_same_clean_commit_counts_as_the_same_code():
    clean = {"commit": "a" * 40, "dirty": False}
    assert differs(clean, clean) is None
    assert differs({"commit": "b" * 40, "dirty": False}, clean) == \
        "made by code bbbbbbb, code now aaaaaaa"
    changed = {"commit": "a" * 40, "dirty": True}  # either side changed: nobody can tell
    assert differs(changed, changed) == "made by code aaaaaaa+changes, code now aaaaaaa+changes"
    assert differs(None, clean) == "made by code unknown, code now aaaaaaa"


def test_a_reused_run_made_by_other_code_says_so(tmp_path, monkeypatch):
    now = {"commit": "c" * 40, "dirty": False}
    monkeypatch.setattr("learner.code_version.code_version", lambda: now)
    made_by = '{"code": {"commit": "%s", "dirty": false}}'
    (tmp_path / "summary.json").write_text(made_by % ("d" * 40))
    assert common.reusing("sweep", tmp_path) == \
        f"sweep: reusing finished run {tmp_path} (made by code ddddddd, code now ccccccc)"
    (tmp_path / "summary.json").write_text(made_by % ("c" * 40))
    assert common.reusing("sweep", tmp_path) == f"sweep: reusing finished run {tmp_path}"
