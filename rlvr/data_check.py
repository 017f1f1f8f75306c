"""`rlvr data check CONFIG`: the task's problem files and model folder, checked without starting
a run. `rlvr train` runs the same checks before any process starts and refuses the run, naming
the key and the first bad rows, where a learner would otherwise fail after the processes
started (a traceback from the learner's log, with actors already sampling).

Checked, for `task.kind: file`, in `task.train_path` and `task.eval_path`:
- every row: the prompt and answer fields present and of the right type (tasks/datasets.py);
- every answer, under the built-in reward: parseable by math-verify (an answer it cannot parse
  scores every response 0, so the prompt can never teach anything); under a reward function of
  your own, accepted by its `check_answer` attribute when it has one;
`task.reward`, when it names your function: importable, and taking (response, answer, fields);
and for `model.path` when it is set: a folder with a config transformers can read, of an
architecture it can load as a causal LM, and a tokenizer.

    rlvr data check configs/my-task.yaml [a.b=value ...]    counts, then the first bad rows
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from dataclasses import dataclass, field
from pathlib import Path

from protocol.config import Config, ConfigError, load_config
from tasks import rewards
from tasks.datasets import DatasetError, scan_problems

SHOWN = 5  # bad rows printed per file


@dataclass
class FileReport:
    key: str  # the config key naming the file
    path: str
    good: int = 0
    bad: list[str] = field(default_factory=list)  # one message per bad row, in file order


def answer_parses(answer: str) -> bool:
    """Whether math-verify reads the reference answer (tasks/verifier.py's math_equal)."""
    from math_verify import parse

    return bool(parse("$" + answer + "$"))


def _answer_check(reward: str):
    """answer -> what is wrong with it for `reward`, or None. The built-in reward needs an
    answer math-verify parses; a function of the user's may carry `check_answer(answer)`,
    which raises on an answer it cannot judge (tasks.code's does); without one, every answer
    passes."""
    if reward == rewards.BUILTIN:
        return lambda a: None if answer_parses(a) else "is not parseable by math-verify"
    try:
        checks = rewards.check_answers(reward)  # of each term of a weighted sum that has one
    except rewards.RewardError:  # check_reward reports it
        checks = []

    def problem(answer: str) -> str | None:
        for ref, check in checks:
            try:
                check(answer)
            except Exception as e:  # noqa: BLE001 - the user's check says what is wrong its way
                return f"is refused by {ref}'s check_answer: {type(e).__name__}: {_one_line(e)}"
        return None
    return problem


def check_file(key: str, path: str, cfg: Config) -> FileReport:
    t = cfg.task
    report = FileReport(key, path)
    try:
        problems, report.bad = scan_problems(path, t.prompt_field, t.answer_field,
                                             t.solution_field)
    except DatasetError as e:
        report.bad = [str(e)]
        return report
    answer_problem = _answer_check(t.reward)
    problems_of = {a: answer_problem(a) for a in {p.answer for p in problems}}  # ~2 ms each
    for p in problems:
        if problems_of[p.answer] is None:
            report.good += 1
        else:
            report.bad.append(f"{path} ({p.prompt_id}): answer {p.answer[:60]!r} "
                              f"{problems_of[p.answer]}: every response would score 0")
    if not problems and not report.bad:
        report.bad.append(f"{path}: no problems in file")
    return report


def check_files(cfg: Config) -> list[FileReport]:
    t = cfg.task
    if t.kind != "file":
        return []  # the built-in task makes its own problems
    files = [("task.train_path", t.train_path)]
    if t.eval_path and t.eval_path != t.train_path:
        files.append(("task.eval_path", t.eval_path))
    return [check_file(key, path, cfg) for key, path in files]


def check_reward(cfg: Config) -> str | None:
    """What is wrong with `task.reward`, in one line, or None."""
    if cfg.task.reward == rewards.BUILTIN:
        return None
    try:
        rewards.resolve_judge(cfg.task.reward)
    except rewards.RewardError as e:
        return f"task.reward: {_one_line(e)}"
    return None


def check_model(cfg: Config) -> str | None:
    """What is wrong with `model.path`, in one line, or None (also when it is unset: the
    built-in task warm-starts its own model). A folder that passed is remembered under
    `warm_start.cache_dir` by the digest of what the verdict reads (model_folder_digest), so a
    run on a model checked before does not import transformers here: 10 s of the launcher's
    start-up, before any process can start."""
    path = cfg.model.path
    if not path:
        return None
    if not Path(path).is_dir():
        return f"model.path {path}: no such folder (a Hugging Face model folder is expected)"
    if not (Path(path) / "config.json").is_file():
        return f"model.path {path}: no config.json (not a Hugging Face model folder)"
    passed = Path(cfg.warm_start.cache_dir) / "checked-models" / model_folder_digest(Path(path))
    if passed.exists():
        return None
    problem = _check_model_folder(path)
    if problem is None:
        passed.parent.mkdir(parents=True, exist_ok=True)
        passed.touch()
    return problem


# the files a model's weights are kept in: the check reads none of them
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")


def model_folder_digest(folder: Path) -> str:
    """What check_model's verdict depends on: the installed transformers' version and the name
    and bytes of each file in the folder but the weights (config.json, the tokenizer's files)."""
    digest = hashlib.sha256(importlib.metadata.version("transformers").encode())
    for f in sorted(folder.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES):
            digest.update(f"\0{f.name}\0{f.stat().st_size}\0".encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:20]


def _check_model_folder(path: str) -> str | None:
    from transformers import AutoConfig

    from tasks.tiny_model import load_tokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - transformers raises several types here
        return f"model.path {path}: config.json unreadable: {_one_line(e)}"
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return (f"model.path {path}: model_type {getattr(config, 'model_type', '?')!r} is not an "
                f"architecture transformers can load as a causal LM")
    try:
        tokenizer = load_tokenizer(path)
    except Exception as e:  # noqa: BLE001
        return f"model.path {path}: no loadable tokenizer: {_one_line(e)}"
    # without tokenizer files transformers still builds one, of a single token
    if len(tokenizer) < 2:
        return f"model.path {path}: no loadable tokenizer (no tokenizer files in the folder)"
    embedded = getattr(config, "vocab_size", None)
    if embedded is not None and len(tokenizer) > embedded:
        return (f"model.path {path}: the tokenizer has {len(tokenizer)} tokens, the model "
                f"embeds {embedded}")
    return None


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def preflight(cfg: Config) -> None:
    """`rlvr train`'s check before any process starts: raises ConfigError naming the key and
    the first bad row."""
    problem = check_reward(cfg) or check_model(cfg)
    if problem:
        raise ConfigError(problem)
    for r in check_files(cfg):
        if r.bad:
            more = f" (and {len(r.bad) - 1} more: rlvr data check lists them)" if r.bad[1:] else ""
            raise ConfigError(f"{r.key}: {r.bad[0]}{more}")


def data_check(config: str, overrides: list[str]) -> int:
    cfg = load_config(config, overrides)
    failed = False
    problem = check_model(cfg)
    print(problem or (f"model.path {cfg.model.path}: ok" if cfg.model.path else
                      "model.path: unset (the built-in task warm-starts the tiny model)"))
    failed |= problem is not None
    problem = check_reward(cfg)
    print(problem or f"task.reward {cfg.task.reward}: ok")
    failed |= problem is not None
    reports = check_files(cfg)
    if not reports:
        print(f"task.kind {cfg.task.kind}: built in, no files to check")
    for r in reports:
        print(f"{r.key} {r.path}: {r.good} good rows, {len(r.bad)} bad")
        for line in r.bad[:SHOWN]:
            print(f"  {line}")
        if len(r.bad) > SHOWN:
            print(f"  ... and {len(r.bad) - SHOWN} more")
        failed |= bool(r.bad)
    return 1 if failed else 0


def add_cli(sub) -> None:
    d = sub.add_parser("data", help="check a task's data and model without starting a run")
    dsub = d.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser("check", help="validate every row of the task's files, and model.path")
    c.add_argument("config")
    c.add_argument("overrides", nargs="*", help="dotted overrides a.b=value")
    c.set_defaults(func=lambda args: data_check(args.config, args.overrides))


if __name__ == "__main__":
    sys.exit(data_check(sys.argv[1], sys.argv[2:]))
