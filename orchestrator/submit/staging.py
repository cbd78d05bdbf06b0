"""What a job takes with it: the project, the resolved config and every local file it names.

A job sees only its uploaded working directory, so the client stages one: a copy of the project
(without run outputs, git data or caches), plus ``_commtune_inputs/`` holding the config as
resolved here (``--config``, ``--preset`` and every ``--set`` applied, written with
``dump_config``) and a copy of each local file or folder it names: a user workload file (or its
package), user search-space files, a data file, a tokenizer or a local model directory. The
config's paths are rewritten to the staged copies, so a job runs on a cluster whose nodes have
never seen them, whichever way they were given (``--config PATH``, ``--config=PATH``, a path
inside the config, a ``--set``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import sysconfig
from pathlib import Path

from orchestrator.config.schema import Config, ConfigError, dump_config

INPUTS = "_commtune_inputs"
"""The staged folder, inside the job's working directory."""
CONFIG_NAME = "config.yaml"
STAGE_LIMIT_BYTES = 256 * 2**20
"""Ray refuses large working directories; a bigger input belongs on shared storage."""
IGNORED = ("runs", ".git", "__pycache__", "*.egg-info", ".ruff_cache", ".pytest_cache", ".whl")


def _ignored(directory: str, names: list[str]) -> set[str]:
    """IGNORED's patterns, and every virtual environment (a folder holding ``pyvenv.cfg``,
    whatever its name): a project's ``.venv`` is gigabytes that the cluster has its own of,
    and copying it made every submission wait half a minute."""
    skipped = set(shutil.ignore_patterns(*IGNORED)(directory, names))
    return skipped | {n for n in names if (Path(directory, n) / "pyvenv.cfg").is_file()}


@dataclasses.dataclass(frozen=True)
class Input:
    """One local path the config names, and where its copy goes."""

    key: str
    source: Path
    staged: str
    """Relative to the working directory (what the job's config says)."""


def local_inputs(config: Config) -> list[Input]:
    """Every local file or folder the config names, with the key that names it."""
    found: list[Input] = []
    workload = config.workload
    if workload.entrypoint is not None:
        found += _entrypoint_input(workload.entrypoint)
    for i, item in enumerate(config.search.spaces):
        if "/" in item or item.endswith((".yaml", ".yml")):
            staged = f"spaces/{i}-{Path(item).name}"
            found.append(_input(f"search.spaces[{i}]", Path(item), staged))
    if workload.entrypoint is not None:
        return found
    if workload.data != "synthetic":
        data = Path(workload.data)
        found.append(_input("workload.data", data, f"data/{data.name}"))
    if workload.tokenizer:
        found.append(_input("workload.tokenizer", Path(workload.tokenizer), "tokenizer"))
    if (Path(workload.model).expanduser() / "config.json").is_file():
        found.append(_input("workload.model", Path(workload.model), "model"))
    return found


def _input(key: str, path: Path, staged: str) -> Input:
    path = path.expanduser()
    if not path.exists():
        raise ConfigError(key, f"{str(path)!r} does not exist here, so it cannot go with the job")
    return Input(key, path.resolve(), f"{INPUTS}/{staged}")


def _entrypoint_input(entrypoint: str) -> list[Input]:
    """A workload file goes as a file; a package that is not installed goes as a folder at the
    working directory's top (importable there); an installed one is left to the cluster."""
    module, _, _ = entrypoint.rpartition(":")
    if module.endswith(".py"):
        return [_input("workload.entrypoint", Path(module), f"workload/{Path(module).name}")]
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        raise ConfigError("workload.entrypoint", f"package {top!r} is not importable here")
    origin = Path(spec.origin)
    root = origin.parent if origin.name == "__init__.py" else origin
    installed = Path(sysconfig.get_paths()["purelib"]).resolve()
    if installed in root.resolve().parents:
        return []  # installed here: the cluster must have it installed too (its image)
    return [Input("workload.entrypoint", root.resolve(), root.name)]


def staged_config(config: Config, inputs: list[Input]) -> Config:
    """The config with each local path replaced by its staged copy's path."""
    by_key = {i.key: i.staged for i in inputs}
    workload = config.workload
    changes: dict[str, object] = {}
    entry = str(workload.entrypoint).rpartition(":")
    if "workload.entrypoint" in by_key and entry[0].endswith(".py"):
        changes["entrypoint"] = f"{by_key['workload.entrypoint']}:{entry[2]}"
    for key in ("data", "tokenizer", "model"):
        if f"workload.{key}" in by_key:
            changes[key] = by_key[f"workload.{key}"]
    spaces = [by_key.get(f"search.spaces[{i}]", s) for i, s in enumerate(config.search.spaces)]
    return dataclasses.replace(
        config,
        workload=dataclasses.replace(workload, **changes),
        search=dataclasses.replace(config.search, spaces=spaces),
    )


def stage(config: Config, working_dir: Path, into: Path) -> Path:
    """Copy ``working_dir`` and the config's inputs into ``into``; write the resolved config.
    Returns the staged config's path relative to ``into``."""
    inputs = local_inputs(config)
    size = sum(_size(i.source) for i in inputs)
    if size > STAGE_LIMIT_BYTES:
        biggest = max(inputs, key=lambda i: _size(i.source))
        raise ConfigError(
            biggest.key,
            f"the job's inputs come to {size / 2**20:.0f} MiB (over {STAGE_LIMIT_BYTES // 2**20}"
            f" MiB; {biggest.source} is the largest); put it on storage the cluster mounts and "
            "pass --no-upload with absolute paths",
        )
    shutil.copytree(working_dir, into, ignore=_ignored, symlinks=True)
    for item in inputs:
        target = into / item.staged
        target.parent.mkdir(parents=True, exist_ok=True)
        if item.source.is_dir():
            shutil.copytree(item.source, target, ignore=_ignored)
        else:
            shutil.copy2(item.source, target)
    relative = Path(INPUTS) / CONFIG_NAME
    (into / relative).parent.mkdir(parents=True, exist_ok=True)
    (into / relative).write_text(dump_config(staged_config(config, inputs)))
    return relative


def absolute_inputs(config: Config) -> None:
    """Without an upload the cluster reads the paths as given: each must be absolute (a
    relative one would be read from the job's own folder there)."""
    for item in local_inputs(config):
        raw = _raw_path(config, item.key)
        if raw is not None and not Path(raw).expanduser().is_absolute():
            raise ConfigError(
                item.key,
                f"{raw!r} is relative; with --no-upload give an absolute path the cluster "
                "sees (shared storage), or drop --no-upload to ship it",
            )


def _raw_path(config: Config, key: str) -> str | None:
    if key == "workload.entrypoint":
        module = str(config.workload.entrypoint).rpartition(":")[0]
        return module if module.endswith(".py") else None
    if key.startswith("search.spaces["):
        return config.search.spaces[int(key[len("search.spaces[") : -1])]
    return getattr(config.workload, key.split(".")[1])


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
