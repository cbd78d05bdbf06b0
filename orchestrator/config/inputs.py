"""The locked doors: reading what a user hands commtune, bounded and checked before Ray.

Configs may come from someone else, so every file is read with a size cap and a guarded YAML
loader, every name that becomes a path is one safe component, every folder commtune will
write is checked before anything starts, and a local model or data file is checked on the
driver (a broken one used to fail inside a worker). Cheap checks here import neither torch
nor transformers: a bad input exits in about a second, not after a 5-15 s import.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from orchestrator.runfiles import REPORT_HTML, WRITTEN_FILES
from search_spaces.guarded_yaml import load_yaml, read_capped
from search_spaces.knobs import BOOL, BY_NAME, CHOICE, LOSSY_VALUES, RESHARD


class ConfigError(ValueError):
    """A user error in the configuration; ``key`` is the dotted path at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A run name becomes runs/<name>: one path component, no separators, no leading dot."""


def check_range(key: str, value: Any, low: float, high: float) -> None:
    """``low <= value <= high``, a whole number when both ends are ints; bools are refused
    (YAML's ``true`` is the int 1 to Python)."""
    kind = int if isinstance(low, int) and isinstance(high, int) else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(key, f"got {value!r}; use {what} from {low:g} to {high:g}")


def check_choice(key: str, value: Any, choices: tuple) -> None:
    # by type too: 1 == True, so `use_gpu: 1` passed as true
    if not any(value == c and type(value) is type(c) for c in choices):
        shown = ", ".join("null" if c is None else str(c).lower() for c in choices)
        raise ConfigError(key, f"got {value!r}; use one of: {shown}")


def check_tuned(tuned: dict[str, Any], config: Any = None) -> None:
    """``tuned`` holds plan knobs (what best.yaml records): known names, values of their kind;
    with the ``config``, values that fit its workers, precision and opt-ins."""
    for key, value in tuned.items():
        knob = BY_NAME.get(key)
        if knob is None:
            close = difflib.get_close_matches(str(key), BY_NAME, n=1)
            hint = f"did you mean 'tuned.{close[0]}'? " if close else ""
            raise ConfigError(f"tuned.{key}", f"unknown knob; {hint}known: {', '.join(BY_NAME)}")
        if knob.takes == BOOL or (knob.takes == RESHARD and isinstance(value, bool)):
            if not isinstance(value, bool):
                raise ConfigError(f"tuned.{key}", f"got {value!r}; use true or false")
        elif knob.takes == RESHARD:
            check_range(f"tuned.{key}", value, 2, 1 << 20)
        elif knob.takes == CHOICE:
            check_choice(f"tuned.{key}", value, knob.values)
        else:
            check_range(f"tuned.{key}", value, *knob.values)
    if config is not None:
        _check_tuned_fit(tuned, config)


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``extra`` over ``base``; mappings merge, everything else replaces."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def check_split(tuned: dict[str, Any], per_worker: int, key: str) -> None:
    """The accumulation of ``tuned`` (at ``key``) divides the per-worker batch, and does not
    meet ``static_graph``."""
    accumulation = tuned.get("accumulation_steps", 1)
    if per_worker % accumulation:
        raise ConfigError(f"{key}.accumulation_steps", f"{accumulation} does not divide the "
                          f"per-worker batch {per_worker}; use a divisor of it")  # fmt: skip
    if accumulation > 1 and tuned.get("static_graph"):
        raise ConfigError(f"{key}.static_graph", "true breaks with accumulation in torch "
                          "(pytorch#143580); set it false or accumulation_steps 1")  # fmt: skip


def _check_tuned_fit(tuned: dict[str, Any], config: Any) -> None:
    """Tuned values this config cannot run: refused here, not as a failed worker group."""
    workers, precision = config.cluster.num_workers, config.workload.precision
    reshard = tuned.get("reshard_after_forward", True)
    problems = {
        "reshard_after_forward": isinstance(reshard, int) and not isinstance(reshard, bool)
        and (reshard >= workers or workers % reshard) and (
            f"{reshard} ranks must divide cluster.num_workers={workers} and be fewer; use "
            "true, false or such a divisor"),
        "reduce_dtype": tuned.get("reduce_dtype", "fp32") not in ("fp32", precision) and (
            f"{tuned.get('reduce_dtype')} under workload.precision={precision}; use fp32"
            + ("" if precision == "fp32" else f" or {precision}")),
        "adamw_impl": tuned.get("adamw_impl") == "fused" and config.cluster.use_gpu is False
        and "fused AdamW runs on CUDA only and cluster.use_gpu is false; use foreach or null",
    }  # fmt: skip
    for key, value in LOSSY_VALUES.items():
        if tuned.get(key) in value and not config.search.lossy:
            problems[key] = (f"{tuned[key]} is lossy (it changes the gradients); set "
                             "search.lossy: true to allow it, or use fp32/null")  # fmt: skip
    for key, why in problems.items():
        if why:
            raise ConfigError(f"tuned.{key}", why)


def read_yaml(path: Path, key: str) -> dict[str, Any]:
    """Read a YAML mapping (capped, guarded); any problem is a ConfigError naming the file."""
    try:
        text = read_capped(path)
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}; check the path") from e
    except ValueError as e:  # too large, not a regular file, not UTF-8
        raise ConfigError(key, f"{e}; pass a YAML config file") from e
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(key, f"malformed YAML in {path}{where}: {problem}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(key, f"{path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def parse_set(item: str) -> tuple[list[str], Any]:
    """Parse one ``--set a.b=value``; the value is YAML (``8`` is an int, ``true`` a bool)."""
    if "=" not in item:
        raise ConfigError("--set", f"{item!r} is not KEY=VALUE; e.g. --set search.trials=8")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError("--set", f"{item!r} has an empty key; e.g. --set search.trials=8")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.MarkedYAMLError as e:
        if "aliases" in str(e.problem) or "nesting" in str(e.problem):
            raise ConfigError(f"--set {key}", f"value refused: {e.problem}") from e
        value = raw
    except yaml.YAMLError:
        value = raw
    return parts, value


def check_finite(data: Any, key: str) -> None:
    """Refuse NaN and infinity anywhere (``.nan`` as a time budget is a deadline that never
    fires; as a bucket size, a crash in a worker)."""
    if isinstance(data, float) and not math.isfinite(data):
        raise ConfigError(key or "<top>", f"got {data!r}; use a finite number")
    if isinstance(data, dict):
        for k, v in data.items():
            check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            check_finite(v, f"{key}[{i}]")


def check_name(key: str, value: str) -> None:
    """A name that becomes a folder must stay one folder: ``../../tmp/x`` wrote outside runs/."""
    if not SAFE_NAME.fullmatch(value):
        raise ConfigError(
            key,
            f"got {value!r}; use letters, digits, '.', '_' or '-' (at most 100, not starting "
            "with '.' or '-'), e.g. name: bert-large-ddp",
        )


def check_out_dir(out: Path, key: str = "--out") -> None:
    """``out`` is a folder commtune can create or write: not a file, under a writable folder.

    Nothing is left behind (a dry run writes nothing): a folder is made and removed in the
    nearest existing ancestor.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(key, f"{out} exists and is not a folder; choose a folder path")
    probe = out
    while not probe.exists():
        if probe.is_symlink():  # a dangling link: mkdir would fail on it
            raise ConfigError(key, f"{probe} is a broken symlink; choose another --out")
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(key, f"{out} cannot be created: {probe} is a file; choose another path")
    try:  # a real try: root passes os.access() where mkdir still fails (/proc, read-only)
        os.rmdir(tempfile.mkdtemp(prefix=".commtune-check-", dir=probe))
    except OSError as e:
        raise ConfigError(key, f"{out} cannot be created: {probe}: {e.strerror}; choose "
                          "another path") from e  # fmt: skip


def check_report_path(out: Path, key: str = "--out") -> None:
    """A file commtune will write: not a folder, in a folder it can create or write, and
    never one of a run's own files or another existing file that is not a page (the report
    would replace the evidence it was drawn from)."""
    if out.is_dir():
        raise ConfigError(key, f"{out} is a folder; name a file such as {out / REPORT_HTML}")
    if (
        out.name in WRITTEN_FILES
        and out.name != REPORT_HTML
        or (out.exists() and out.suffix.lower() not in (".html", ".htm"))
    ):
        raise ConfigError(key, f"{out} would be overwritten with the report; name a new "
                          f".html file such as {out.parent / REPORT_HTML}")  # fmt: skip
    check_out_dir(out.parent, key)


def check_workload(workload: Any) -> None:
    """The model, data and tokenizer the workers will open, checked on the driver; what needs
    transformers (an HF model type) comes last, after everything cheap. A user workload's
    entrypoint is only read here; ``plans.check_entrypoint`` imports and builds it."""
    if workload.entrypoint is not None:
        _check_entrypoint(workload)
        return
    from train_fns.model_presets import MODEL_PRESETS, declared_positions, local_dir

    model = workload.model
    looks_like_path = model.startswith((".", "~", "/")) or os.sep in model
    if local_dir(model) is None and (looks_like_path or Path(model).expanduser().is_dir()):
        raise ConfigError(
            "workload.model",
            f"{model} is not a folder with config.json; point workload.model at a Hugging "
            f"Face model folder{_cached(model)}",
        )
    try:
        limit = declared_positions(model, workload.model_overrides)
    except (OSError, ValueError) as e:
        raise ConfigError("workload.model", f"{e}; fix the file or use a preset") from e
    _check_files(workload)
    _check_seq_len(workload, limit)  # what the preset or config.json states: no import
    if model not in MODEL_PRESETS:  # an HF model type or a local config: transformers reads it
        _check_seq_len(workload, _source_positions(workload))  # its source: no import
        _check_seq_len(workload, _hf_positions(workload))


def _check_entrypoint(workload: Any) -> None:
    entrypoint = workload.entrypoint
    module, sep, name = str(entrypoint).rpartition(":")
    if not isinstance(entrypoint, str) or not sep or not module or not name.isidentifier():
        raise ConfigError(
            "workload.entrypoint",
            f"{entrypoint!r} is not MODULE:FUNCTION; e.g. my_workload.py:make_workload or "
            "my_package.my_module:make_workload",
        )
    if workload.task is not None or workload.data != "synthetic" or workload.tokenizer:
        raise ConfigError(
            "workload.entrypoint",
            "task, data and tokenizer belong to the built-in models; your make_workload gives "
            "its own batches (drop them, or pass what you need in workload.options)",
        )


def _check_seq_len(workload: Any, limit: int | None) -> None:
    if limit is not None and workload.seq_len > limit:
        raise ConfigError(
            "workload.seq_len",
            f"{workload.seq_len} exceeds the {limit} positions of model {workload.model!r}; "
            "lower workload.seq_len or set workload.model_overrides.max_position_embeddings",
        )


def _check_files(workload: Any) -> None:
    if workload.data != "synthetic":
        path = Path(workload.data).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError("workload.data", f"{workload.data!r} is not a readable file; use "
                              "'synthetic' or a local .txt/.jsonl file")  # fmt: skip
    if workload.tokenizer is not None and not Path(workload.tokenizer).expanduser().is_dir():
        raise ConfigError("workload.tokenizer", f"{workload.tokenizer!r} is not a folder; use "
                          "a local tokenizer folder or leave it unset")  # fmt: skip


def _source_positions(workload: Any) -> int | None:
    """The model type (named, or a local config.json's) is one the installed transformers
    knows, and the positions its config will hold, both read from transformers' source files
    (an import takes 5-15 s; a typo should exit at once). None: the source does not say."""
    from train_fns.hf_source import default_positions, model_types
    from train_fns.model_presets import POSITION_KEYS, local_dir, read_config_json

    types = model_types()
    if types is None:  # an unknown layout of transformers: _hf_positions asks it
        return None
    folder = local_dir(workload.model)
    stated = read_config_json(folder) if folder is not None else {}
    model_type = stated.get("model_type", workload.model)
    if model_type not in types:
        if folder is None:
            raise _unknown_model(workload.model, types)
        raise ConfigError(
            "workload.model",
            f"{folder / 'config.json'} has model_type {model_type!r}, which the installed "
            f"transformers does not know; {_did_you_mean(model_type, types)}fix its "
            "model_type or upgrade transformers",
        )
    return default_positions(model_type, POSITION_KEYS, {**stated, **workload.model_overrides})


def _unknown_model(model: str, types: Any) -> ConfigError:
    """Neither a preset, a folder nor an HF model type: close names, or a cached hub copy."""
    from train_fns.model_presets import MODEL_PRESETS

    hint = _did_you_mean(model, [*MODEL_PRESETS, *types])
    return ConfigError(
        "workload.model",
        f"unknown model {model!r}; {hint}use a preset ({', '.join(MODEL_PRESETS)}), an HF "
        f"model type such as 'roberta', or a local directory with config.json{_cached(model)}",
    )


def _did_you_mean(name: str, choices: Any) -> str:
    close = difflib.get_close_matches(name, choices, n=3)
    return f"did you mean {' or '.join(map(repr, close))}? " if close else ""


def _cached(model: str) -> str:
    """A hint naming the hub cache's copy of ``model``, if one is on disk (never fetched)."""
    from train_fns.hf_source import hub_cache_snapshot

    found = hub_cache_snapshot(model)
    return f" (a copy is in the Hugging Face cache: workload.model: {found})" if found else ""


def _hf_positions(workload: Any) -> int | None:
    """The positions of an HF model type or a local model's config, as transformers reads
    them (imported only here, once every cheap check has passed)."""
    from train_fns.model_presets import is_known_model

    if not is_known_model(workload.model):
        raise _unknown_model(workload.model, ())
    from train_fns.models import max_positions, resolve_model_config

    try:
        return max_positions(resolve_model_config(workload.model, workload.model_overrides))
    except Exception:  # an override transformers refuses: config.model_overrides names its key
        pass
    try:
        return max_positions(resolve_model_config(workload.model, {}))
    except (OSError, TypeError, ValueError, KeyError) as e:
        raise ConfigError(
            "workload.model", f"transformers cannot read the model config: {str(e)[:200]}"
        ) from e


def parse_env_items(items: list[str], key: str) -> dict[str, str]:
    """``NAME=VALUE`` command-line items (``key`` is the option) -> a dict held to the
    environment allow-list and value checks, as a config's ``env:`` is (unsafe NCCL values
    only through a config with ``search.unsafe_nccl: true``)."""
    from search_spaces import SpaceError, env_strings

    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(key, f"{item!r} is not NAME=VALUE; e.g. {key} NCCL_BUFFSIZE=8388608")
        env[name.strip()] = value
    try:
        return env_strings(env)
    except SpaceError as e:
        raise ConfigError(f"{key} {e.key}" if e.key else key, e.message) from e
