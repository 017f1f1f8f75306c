"""Every config key is read by the code that runs, not only by the schema and its checks.

A key that nothing reads does nothing whatever its value (`aero.negative_pick` and
`ar3po.buffer_pick` once were such keys). This walks every field of `Config` and looks for an
attribute read of its name in the project's code outside protocol/config_checks.py (which only
refuses values) and outside the sections' own `validate` methods. It proves a key is read, not
that its value changes a run: the behaviour of each key is pinned by the tests of the code that
uses it, and keys that cannot act in a combination are refused (tests/test_config_checks.py).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from protocol.config import Config

ROOT = Path(__file__).resolve().parents[1]
CODE = ("actors", "learner", "protocol", "rlvr", "tasks")
ONLY_CHECKS = {"protocol/config_checks.py"}


def leaf_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        factory = f.default_factory
        if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory):
            keys += leaf_keys(factory, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def attributes_read() -> set[str]:
    """Names read as `x.name` anywhere in the code, except in checks and validate methods."""
    names: set[str] = set()
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            if str(path.relative_to(ROOT)) in ONLY_CHECKS:
                continue
            tree = ast.parse(path.read_text())
            skipped = {id(node) for fn in ast.walk(tree)
                       if isinstance(fn, ast.FunctionDef) and fn.name == "validate"
                       for node in ast.walk(fn)}
            names |= {node.attr for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and id(node) not in skipped
                      and isinstance(node.ctx, ast.Load)}
    return names


def test_every_config_key_is_read_by_the_code_that_runs():
    keys = leaf_keys(Config)
    assert len(keys) > 100 and "ar3po.buffer_pick" in keys  # the walk reaches every section
    read = attributes_read()
    unread = [k for k in keys if k.rsplit(".", 1)[-1] not in read]
    assert unread == [], f"config keys nothing reads (make them act, or remove them): {unread}"
