"""Build a run config (a tree of frozen dataclasses) from YAML, with `a.b.c=value` overrides on top.

Why: a typo in a key or a bad value must stop `rlvr train` before any actor, learner or SLURM job
starts, with a message that names the full dotted key (`rollout.max_new_tokens`) and, for an
unknown key, the nearest valid names. The dataclasses are the whole schema: annotations say what a
value may be, defaults fill what the YAML leaves out, an optional `validate(self)` method makes
cross-field checks, and the string literal under each field is its documentation. No Hydra, no
registries, no exec'd config: YAML is read with `yaml.safe_load` and every value is checked.

Field types: int, float, bool, str, Literal[...], X | None, tuple[X, ...] (or fixed tuple[X, Y]),
and nested dataclasses (sections; a section left out takes its default). bool is not an int; an int
is a float; a string such as "1e-4" (YAML 1.1 reads it as a string) is a float; a list is a tuple.

    cfg = load(Config, "configs/tiny-cpu.yaml", ["rollout.max_new_tokens=64", "optim.lr=1e-4"])
    dump(cfg, run_dir / "config.yaml")     # load(Config, run_dir / "config.yaml") == cfg
    print(describe(Config))                # every key with its type, default and doc
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import inspect
import textwrap
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

__all__ = ["ConfigError", "build", "load", "to_dict", "dump", "field_docs", "describe"]

_MISSING = dataclasses.MISSING


class ConfigError(ValueError):
    """A bad key or value in a run config. The message names the full dotted key; when several
    problems are found at once, it lists them one per line."""


def build(cls: type, data: dict | None = None, overrides=(), where: str = "") -> Any:
    """Make a `cls` instance from plain `data` (as YAML gives it) with `overrides` applied on top.
    `where` is the dotted key of `cls` inside a larger tree, used only in messages."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{_name(where)} must be a mapping of keys, got {_show(data)}")
    errors: list[str] = []
    data = _apply_overrides(copy.deepcopy(data), overrides, where, errors)
    obj = None
    try:
        obj = _section(cls, data, where, _all_keys(cls, where))
    except ConfigError as e:
        errors.append(str(e))
    if errors:
        raise ConfigError("\n".join(errors))
    return obj


def load(cls: type, path: str | Path, overrides=()) -> Any:
    """Read the YAML file at `path` (an empty file means all defaults) and `build` from it."""
    return build(cls, read_yaml(path), overrides)


def read_yaml(path: str | Path) -> dict:
    """The YAML mapping at `path` ({} for an empty file); errors name the file (and line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        raise ConfigError(f"YAML syntax error in {at}: {getattr(e, 'problem', None) or e}") from e
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {_show(data)}")
    return data or {}


def to_dict(obj: Any) -> Any:
    """Plain YAML-able data for a config instance: sections become dicts, tuples become lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (tuple, list)):
        return [to_dict(v) for v in obj]
    return obj


def dump(obj: Any, path: str | Path) -> None:
    """Write the resolved config as YAML; `load(type(obj), path)` gives back an equal instance."""
    # ASCII with escapes: PyYAML writes some line breaks (U+0085) raw and reads them back changed
    text = yaml.safe_dump(to_dict(obj), sort_keys=False)
    Path(path).write_text(text, encoding="utf-8")


def field_docs(cls: type, prefix: str = "") -> dict[str, str]:
    """Dotted key -> the docstring written as a string literal right after that field."""
    own: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's doc for a field wins
        if dataclasses.is_dataclass(klass):
            own.update(_class_docs(klass))
    hints, docs = get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        if f.name in own:
            docs[key] = own[f.name]
        if (sub := _section_type(hints[f.name])) is not None:
            docs.update(field_docs(sub, key))
    return docs


def describe(cls: type) -> str:
    """Every key of `cls` with its type, default and doc (for `rlvr train --help-config`)."""
    lines: list[str] = []
    _describe(cls, "", None, field_docs(cls), lines)
    return "\n".join(lines)


def _apply_overrides(data: dict, overrides, where: str, errors: list[str]) -> dict:
    for text in overrides:
        key, eq, raw = text.partition("=")
        key = key.strip()
        if not eq or not key or "" in key.split("."):
            errors.append(f"override {text!r} is not of the form a.b.c=value")
            continue
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or e
            errors.append(f"override of '{_join(where, key)}': {raw!r} is not YAML ({problem})")
            continue
        *parents, leaf = key.split(".")
        node, full = data, _join(where, key)
        for i, part in enumerate(parents):
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                section = _join(where, ".".join(parents[: i + 1]))
                errors.append(f"cannot set '{full}': '{section}' is a value, not a section")
                break
            node = node[part]
        else:
            node[leaf] = value
    return data


def _section(cls: type, data: Any, key: str, all_keys: list[str]) -> Any:
    if data is None:  # `section:` with nothing under it
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{_name(key)} is a section: give it a mapping, not {_show(data)}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [str(k) for k in data if k not in fields]
    errors = [_unknown(_join(key, k), key, list(fields), all_keys) for k in unknown]
    kwargs = {}
    for name, f in fields.items():
        sub, default = _join(key, name), _default(f)
        if name in data:
            value = data[name]
        elif dataclasses.is_dataclass(hints[name]):  # a missing section takes its default
            value = {} if default is _MISSING else to_dict(default)
        elif default is not _MISSING:
            continue
        else:
            errors.append(f"missing required config key '{sub}'")
            continue
        try:
            kwargs[name] = _convert(hints[name], value, sub, all_keys)
        except ConfigError as e:
            errors.append(str(e))
    if errors:
        raise ConfigError("\n".join(errors))
    try:
        obj = cls(**kwargs)
        if callable(getattr(obj, "validate", None)):
            obj.validate()
    except ValueError as e:  # ConfigError included: cross-field checks name their section
        raise ConfigError(f"{key}: {e}" if key else str(e)) from e
    return obj


def _convert(tp: Any, value: Any, key: str, all_keys: list[str]) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if len(args) != 2 or type(None) not in args:
            raise TypeError(f"config field '{key}' has an unsupported type: {_type_name(tp)}")
        return _convert(next(a for a in args if a is not type(None)), value, key, all_keys)
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        if isinstance(value, bool):  # YAML 1.1 reads an unquoted off/no as False, on/yes as True
            words = ("on", "yes", "true") if value else ("off", "no", "false")
            spelled = [a for a in args if isinstance(a, str) and a in words]
            if len(spelled) == 1:
                return spelled[0]
        choices = ", ".join(repr(a) for a in args)
        raise ConfigError(f"'{key}' must be one of {choices}; got {_show(value)}")
    if dataclasses.is_dataclass(tp):
        return _section(tp, value, key, all_keys)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{key}' must be a list ({_type_name(tp)}), got {_show(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        elif len(args) != len(value):
            raise ConfigError(f"'{key}' must have {len(args)} items, got {len(value)}")
        items = enumerate(zip(args, value))
        return tuple(_convert(t, v, f"{key}[{i}]", all_keys) for i, (t, v) in items)
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    if tp is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)  # "1e-4": YAML 1.1 only reads floats with a dot as floats
        except (ValueError, OverflowError):
            pass
    if tp not in (bool, int, float, str):
        raise TypeError(f"config field '{key}' has an unsupported type: {_type_name(tp)}")
    hint = " (it is a value, not a section)" if isinstance(value, dict) else ""
    raise ConfigError(f"'{key}' must be {tp.__name__}, got {_show(value)}{hint}")


def _unknown(full: str, parent: str, names: list[str], all_keys: list[str]) -> str:
    """Suggest near names in the same section first, then keys with a near name anywhere (a key
    put in the wrong section)."""
    name = full.rsplit(".", 1)[-1]
    near = [_join(parent, n) for n in difflib.get_close_matches(name, names, n=3)]
    leaves = {k: k.rsplit(".", 1)[-1] for k in all_keys}
    near_leaves = difflib.get_close_matches(name, set(leaves.values()), n=3, cutoff=0.8)
    near += [k for k, leaf in leaves.items() if leaf in near_leaves]
    near = list(dict.fromkeys(near))[:3]
    if near:
        return f"unknown config key '{full}'; did you mean {' or '.join(repr(k) for k in near)}?"
    return f"unknown config key '{full}'; valid keys here: {', '.join(names)}"


def _default(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not _MISSING else _MISSING


def _section_type(tp: Any) -> type | None:
    """The dataclass behind a section field (`Section` or `Section | None`), else None."""
    for t in (tp, *get_args(tp)) if get_origin(tp) in (Union, types.UnionType) else (tp,):
        if dataclasses.is_dataclass(t) and isinstance(t, type):
            return t
    return None


def _all_keys(cls: type, prefix: str) -> list[str]:
    hints, keys = get_type_hints(cls), []
    for f in (f for f in dataclasses.fields(cls) if f.init):
        keys.append(key := _join(prefix, f.name))
        if (sub := _section_type(hints[f.name])) is not None:
            keys += _all_keys(sub, key)
    return keys


def _class_docs(klass: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):  # no source (REPL, make_dataclass): no docs
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _describe(cls: type, prefix: str, defaults: Any, docs: dict[str, str], lines: list) -> None:
    hints = get_type_hints(cls)
    for f in (f for f in dataclasses.fields(cls) if f.init):
        key, tp = _join(prefix, f.name), hints[f.name]
        default = getattr(defaults, f.name) if defaults is not None else _default(f)
        sub = _section_type(tp)
        if sub is not None and default is not None:
            lines.append(f"{key}:  [section {sub.__name__}]")
        else:
            shown = "(required)" if default is _MISSING else _yaml(default)
            lines.append(f"{key}: {_type_name(tp)} = {shown}")
        lines += ["    " + line for line in docs.get(key, "").splitlines()]
        if sub is not None:
            _describe(sub, key, default if isinstance(default, sub) else None, docs, lines)


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "None"
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is tuple:
        return f"tuple[{', '.join('...' if a is Ellipsis else _type_name(a) for a in args)}]"
    return tp.__name__ if isinstance(tp, type) else repr(tp).replace("typing.", "")


def _yaml(value: Any) -> str:
    text = yaml.safe_dump(to_dict(value), default_flow_style=True, width=10**6, allow_unicode=True)
    return text.strip().removesuffix("...").strip()


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _name(key: str) -> str:
    return f"'{key}'" if key else "the config"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
