"""The GPU check's first two stages, before any training: what the code needs of its
libraries, and whether the real NCCL reads every NCCL_ALGO/NCCL_PROTO value the search offers.

- ``versions``: torch, CUDA, NCCL and transformers, each against the floor the code needs
  (pyproject's torch and transformers floors; NCCL 2.24, the first to read a ``coll:`` prefix),
  and the GPU's UUID as a re-measurement records it.
- ``nccl values``: each value of ``search_spaces/nccl.yaml``'s NCCL_ALGO and NCCL_PROTO choices
  (plus one that NCCL must refuse, so a stage that refuses nothing is seen to be blind) set
  in a fresh process that makes a 1-rank NCCL communicator and runs every collective the
  trials call: NCCL parses the variables as the communicator is made and refuses a value it
  cannot read (``ncclInvalidUsage``), which a subprocess catches without ending the check.
  The value must be accepted where ``search_spaces._nccl``'s port of NCCL's grammar accepts it.

torch and the standard library only (the lent machines have no Optuna): the space is read as
YAML, and the grammar's module is loaded from its file.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONTROL = ("NCCL_ALGO", "allreduce:nosuchalgo")
"""A value NCCL must refuse: if it is accepted, the stage cannot see a refusal."""
VALUE_TIMEOUT_S = 120.0
COMMUNICATOR = """
import tempfile, torch, torch.distributed as dist
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
store = dist.FileStore(tempfile.mkdtemp() + "/store", 1)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
x, out = torch.ones(1 << 16, device=dev), torch.empty(1 << 16, device=dev)
dist.all_reduce(x)
dist.all_gather_into_tensor(out, x)
dist.reduce_scatter_tensor(x, out)
dist.broadcast(x, 0)
torch.cuda.synchronize()
dist.destroy_process_group()
print("accepted")
"""


def load_file_module(relative: str, name: str) -> ModuleType:
    """A module loaded from its file alone: importing ``search_spaces`` would import Optuna."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {relative}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _as_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(re.match(r"\d*", part).group() or 0) for part in text.split("."))


CUDA_SINCE = (12, 6)
"""The oldest CUDA that PyTorch's official wheels of the torch floor (2.8) are built for: an
older CUDA means a source build of torch that nothing here has run on."""


def floors(pyproject: str, prefix_since: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Each library's floor: pyproject's ``>=`` for torch and transformers, NCCL's from the
    grammar module (the first NCCL to read ``coll:`` prefixes), CUDA's from the torch floor's
    wheels (``CUDA_SINCE``)."""
    found = {}
    for package in ("torch", "transformers"):
        match = re.search(rf'"{package}>=([0-9.]+)', pyproject)
        if match is None:
            raise ValueError(f"pyproject.toml has no {package}>= floor")
        found[package] = _as_tuple(match.group(1))
    return {**found, "NCCL": prefix_since, "CUDA": CUDA_SINCE}


def version_lines(versions: dict[str, str | None], floor: dict[str, tuple[int, ...]]) -> list[str]:
    """One line a library: its version against its floor (``ok``, ``BELOW``, or ``none``)."""
    lines = []
    for name, version in versions.items():
        need = floor.get(name)
        if version is None:
            verdict = "none (no CUDA)" if need else ""
        elif need is None:
            verdict = ""
        else:
            verdict = "ok" if _as_tuple(version) >= need else "BELOW"
        shown = f" >= {'.'.join(map(str, need))}" if need else ""
        lines.append(f"  {name} {version}{shown} {verdict}".rstrip())
    return lines


def offered_values(space_file: Path) -> dict[str, list[str]]:
    """The non-null choices of NCCL_ALGO and NCCL_PROTO in a space file (a choice may be a
    mapping with its own condition: its ``value``), whatever context would offer them."""
    params = yaml.safe_load(space_file.read_text())["params"]
    out: dict[str, list[str]] = {}
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        choices = [c["value"] if isinstance(c, dict) else c for c in params[name]["choices"]]
        out[name] = [str(c) for c in choices if c is not None]
    return out


def nccl_reads(name: str, value: str) -> tuple[bool, str]:
    """Whether the real NCCL makes a communicator and runs the collectives with ``name`` set
    to ``value`` (a fresh process: NCCL reads it once), and its last words."""
    env = {**os.environ, name: value, "NCCL_DEBUG": "WARN"}
    try:
        done = subprocess.run([sys.executable, "-c", COMMUNICATOR], env=env, capture_output=True,
                              text=True, timeout=VALUE_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"no answer in {VALUE_TIMEOUT_S:g}s"
    said = (done.stdout + done.stderr).strip().splitlines()
    ok = done.returncode == 0 and "accepted" in done.stdout
    warned = [line for line in said if "NCCL WARN" in line or "Error" in line]
    return ok, (warned or said or [""])[-1][:200]


def versions_stage(cuda: bool) -> list[str]:
    """Print the versions against the floors; the libraries below theirs."""
    import transformers

    from train_fns.ranks import gpu_uuid, nccl_version

    grammar = load_file_module("search_spaces/_nccl.py", "commtune_gpu_check_nccl")
    floor = floors((ROOT / "pyproject.toml").read_text(), grammar.PREFIX_SINCE)
    versions = {"torch": torch.__version__.split("+")[0], "CUDA": torch.version.cuda,
                "NCCL": nccl_version() if cuda else None,
                "transformers": transformers.__version__}  # fmt: skip
    lines = version_lines(versions, floor)
    if cuda:  # what a re-measurement records of each rank (train_fns.ranks.gpu_uuid)
        lines.append(f"  GPU {gpu_uuid(torch.device('cuda', 0))}")
    print("stage versions:\n" + "\n".join(lines), flush=True)
    return [line.split()[0] for line in lines if line.endswith("BELOW")]


def nccl_values_stage(cuda: bool) -> list[str]:
    """Print what NCCL made of each offered value; the values NCCL and the port disagree on
    (and the control, if NCCL accepted it)."""
    grammar = load_file_module("search_spaces/_nccl.py", "commtune_gpu_check_nccl")
    offered = offered_values(ROOT / "search_spaces" / "nccl.yaml")
    print("stage nccl values:", flush=True)
    wrong = []
    for name, value in [(n, v) for n, values in offered.items() for v in values] + [CONTROL]:
        elems = grammar.ALGOS if name == "NCCL_ALGO" else grammar.PROTOS
        try:
            grammar.parse_list(value, elems)
            port = True
        except ValueError:
            port = False
        if not cuda:
            print(f"  {name}={value}: port {'accepts' if port else 'refuses'}; NCCL not run (CPU)")
            continue
        real, words = nccl_reads(name, value)
        agree = real == port
        print(f"  {name}={value}: NCCL {'accepts' if real else 'refuses'}, port "
              f"{'accepts' if port else 'refuses'}{'' if agree else ' DISAGREE'}"
              f"{'' if real else f' ({words})'}", flush=True)  # fmt: skip
        if not agree:
            wrong.append(f"{name}={value}")
    return wrong
