"""Guarded YAML for every file a user hands commtune (configs, spaces, best.yaml).

A config may come from someone else, so reading one must be bounded: a size cap (a 100 MB
file took 38 s to parse), a nesting cap (``[[[[...]]]]`` 50k deep overflowed Python's stack),
an expansion cap (a billion-laughs alias bomb is a few hundred bytes that expand to 10^9
nodes the first time anything walks them), and no duplicate keys (plain YAML keeps the last
one silently). Limits raise ``yaml.MarkedYAMLError`` so callers report the line.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1 << 20
"""Largest YAML file read (1 MiB): real configs and spaces are a few KiB."""
MAX_DEPTH = 32
"""Deepest nesting of lists and mappings: a config is three levels deep."""
MAX_NODES = 100_000
"""Most nodes after alias expansion (an alias counts as everything it refers to)."""


class GuardedLoader(yaml.SafeLoader):
    """SafeLoader (no arbitrary objects) with nesting, expansion and duplicate-key limits."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _limit(f"nesting deeper than {MAX_DEPTH} levels", self.peek_event())
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node, {}, set())
        return node


def _limit(problem: str, event_or_node: Any) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(problem=problem, problem_mark=event_or_node.start_mark)


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """Nodes ``node`` stands for once aliases are expanded; raises past MAX_NODES or on a
    node that contains itself. Memoized, so the walk is linear in the distinct nodes."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise _limit("a recursive alias (a node that contains itself)", node)
    open_.add(key)
    children: list[Any] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    total = 1 + sum(_expanded_size(child, sizes, open_) for child in children)
    open_.discard(key)
    if total > MAX_NODES:
        raise _limit(f"more than {MAX_NODES} values once aliases are expanded", node)
    sizes[key] = total
    return total


def _construct_mapping(loader: GuardedLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.MarkedYAMLError(
                problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


GuardedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str) -> Any:
    """Parse one YAML document within the limits; raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=GuardedLoader)  # a SafeLoader subclass


def read_capped(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes.

    Raises OSError (missing, unreadable) or ValueError (not a regular file: a folder, or a
    FIFO or /dev/zero that would block or never end; too large; not UTF-8).
    """
    if not stat.S_ISREG(path.stat().st_mode):  # before open(): opening a FIFO blocks
        raise ValueError(f"{path} is not a regular file")
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit // 1024} KiB, the cap for this file")
    return data.decode("utf-8")
