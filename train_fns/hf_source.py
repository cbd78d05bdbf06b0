"""What transformers knows about a model type, read from its source files, not imported.

The driver's input checks need two facts: is a name an HF model type, and how many positions
does that type's config default to. Importing transformers' auto classes to ask takes 5-15 s
(they import torch), which a typo should not cost; both facts are literals in transformers'
source (``CONFIG_MAPPING_NAMES``, the config class's field defaults), so they are parsed with
``ast``. Anything this reader cannot follow reads as "unknown" (None), and the caller asks
transformers itself, as before.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from pathlib import Path

ROOT_CONFIGS = frozenset({"PreTrainedConfig", "PretrainedConfig"})
"""Base classes where the search for a field default stops: they state no positions."""
UNKNOWN = object()
"""A field set to something that is not a literal (computed): only transformers knows it."""


@functools.cache
def _package() -> Path | None:
    """transformers' folder; find_spec of a top-level package does not import it."""
    spec = importlib.util.find_spec("transformers")
    origin = spec.origin if spec is not None else None
    return Path(origin).parent if origin else None


@functools.cache
def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _string_pairs(node: ast.AST) -> dict[str, str]:
    """Every ``("a", "B")`` tuple and ``{"a": "B"}`` entry under ``node``."""
    pairs: dict[str, str] = {}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Tuple) and len(sub.elts) == 2:
            items = [(sub.elts[0], sub.elts[1])]
        elif isinstance(sub, ast.Dict):
            items = [(k, v) for k, v in zip(sub.keys, sub.values, strict=True) if k is not None]
        else:
            continue
        for k, v in items:
            key, value = getattr(k, "value", None), getattr(v, "value", None)
            if isinstance(k, ast.Constant) and isinstance(key, str) and isinstance(value, str):
                pairs[key] = value
    return pairs


def _mapping(files: list[Path], name: str) -> dict[str, str]:
    """What module-level ``name = OrderedDict(...)`` and ``name.update(...)`` put in ``name``,
    across ``files`` (transformers 5 builds CONFIG_MAPPING_NAMES in two, 4.x in one)."""
    found: dict[str, str] = {}
    for path in files:
        tree = _parse(path)
        for stmt in tree.body if tree is not None else ():
            value = stmt.value if isinstance(stmt, ast.Assign | ast.Expr) else None
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in stmt.targets
            ):
                found.update(_string_pairs(value))  # type: ignore[arg-type]
            elif (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "update"
                and isinstance(value.func.value, ast.Name)
                and value.func.value.id == name
            ):
                found.update(_string_pairs(value))
    return found


def _auto_files() -> list[Path]:
    package = _package()
    if package is None:
        return []
    auto = package / "models" / "auto"
    return [p for p in (auto / "auto_mappings.py", auto / "configuration_auto.py") if p.is_file()]


@functools.cache
def model_types() -> dict[str, str] | None:
    """HF model type -> its config class name, as transformers' CONFIG_MAPPING_NAMES holds it;
    None when transformers is missing or its source does not read as expected."""
    found = _mapping(_auto_files(), "CONFIG_MAPPING_NAMES")
    return found if len(found) > 10 else None  # a handful means the layout has changed


@functools.cache
def _special_modules() -> dict[str, str]:
    return _mapping(_auto_files(), "SPECIAL_MODEL_TYPE_TO_MODULE_NAME")


def _config_file(model_type: str) -> Path | None:
    """The configuration module of a model type (transformers' model_type_to_module_name)."""
    package = _package()
    if package is None:
        return None
    module = _special_modules().get(model_type, model_type.replace("-", "_"))
    for folder in (package / "models" / module, package / "models" / "deprecated" / module):
        path = folder / f"configuration_{module}.py"
        if path.is_file():
            return path
    return None


def default_positions(model_type: str, keys: tuple[str, ...], stated: dict) -> int | None:
    """The first of ``keys`` that a config of this type holds as a whole number: from
    ``stated`` (a config.json and overrides) or the class defaults, through ``attribute_map``
    and base classes, as getattr on the built config would; None when the source does not
    say plainly (the caller then asks transformers)."""
    types = model_types() or {}
    class_name = types.get(model_type)
    # gpt-sw3 has no configuration module of its own: it borrows GPT2Config from gpt2's
    twins = [model_type] + [t for t, c in types.items() if c == class_name and t != model_type]
    path = next(filter(None, map(_config_file, twins)), None)
    if class_name is None or path is None:
        return None
    aliases = _class_default(path, class_name, "attribute_map", depth=0)
    for key in keys:
        real = aliases.get(key, key) if isinstance(aliases, dict) else key
        value = stated.get(real, stated.get(key))
        if value is None:
            value = _class_default(path, class_name, real, depth=0)
        if value is not None:
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def _class_default(path: Path, class_name: str, key: str, depth: int) -> object:
    """A field's literal default in class ``class_name`` of ``path`` or its bases."""
    tree = _parse(path)
    if tree is None or depth > 8 or class_name in ROOT_CONFIGS:
        return None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        return None
    fields = _class_fields(cls)
    if key in fields:
        return fields[key]
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found = _class_default(_base_file(tree, path, base.id), base.id, key, depth + 1)
            if found is not None:
                return found
    return None


def _class_fields(cls: ast.ClassDef) -> dict[str, object]:
    """Literal class-level fields (``n: int = 512``, ``attribute_map = {...}``) and the
    literal defaults of ``__init__`` (the pre-dataclass style)."""
    fields: dict[str, object] = {}
    for stmt in cls.body:
        target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
        if isinstance(target, ast.Name) and stmt.value is not None:  # type: ignore[union-attr]
            fields[target.id] = _literal(stmt.value)  # type: ignore[union-attr]
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            args = stmt.args.args[len(stmt.args.args) - len(stmt.args.defaults) :]
            kwargs = zip(stmt.args.kwonlyargs, stmt.args.kw_defaults, strict=True)
            for arg, default in [*zip(args, stmt.args.defaults, strict=True), *kwargs]:
                if isinstance(default, ast.Constant):
                    fields.setdefault(arg.arg, default.value)
    return fields


def _literal(node: ast.expr) -> object:
    """A literal, or whole-number arithmetic on literals (``4096 * 32``); else UNKNOWN."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        left, right = _literal(node.left), _literal(node.right)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right)):
            ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}
            return ops[type(node.op)](left, right)  # type: ignore[arg-type]
        return UNKNOWN
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return UNKNOWN


def _base_file(tree: ast.Module, path: Path, name: str) -> Path:
    """Where base class ``name`` is defined: this file, or the one a relative import names."""
    for stmt in tree.body:
        if not isinstance(stmt, ast.ImportFrom) or not stmt.level or not stmt.module:
            continue
        if any(alias.name == name and alias.asname is None for alias in stmt.names):
            folder = path.parents[stmt.level - 1]  # level 1: this folder
            return folder.joinpath(*stmt.module.split(".")).with_suffix(".py")
    return path


def hub_cache_snapshot(name: str) -> Path | None:
    """A downloaded copy of hub model ``name`` (``org/model``) in the local HF cache, looked up
    offline: commtune never downloads, but it can point at what is already on disk."""
    home = os.environ.get("HF_HOME", str(Path("~/.cache/huggingface").expanduser()))
    cache = Path(os.environ.get("HF_HUB_CACHE", os.path.join(home, "hub")))
    snapshots = cache / f"models--{name.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[0].parent if found else None
