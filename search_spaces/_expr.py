"""The two tiny expression languages of a space file: ``when:`` conditions and constraints.

Both are parsed with :mod:`ast` and checked against a whitelist of node types, then
evaluated by walking the tree. Nothing is ever passed to ``eval``: a space file is user
input, and ``when: __import__('os').system(...)`` must be a SpaceError, not a shell.

Conditions: ``name OP literal`` clauses (OP one of ``== != < <= > >=``) joined by
``and``/``or`` with optional parentheses. The left side names a context value or an
earlier param, optionally as a remainder (``world_size % 4 == 0``: a divisibility test);
the right side is a literal. A bare word on the right is a string
(``backend == nccl``), except ``null``/``true``/``false`` (and Python's spellings).

Constraints: one comparison, possibly chained (``1 <= A * B <= 64``), between arithmetic
expressions of param names and numbers using ``+ - *`` and unary minus.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._env import SpaceError

_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
ORDERING_OPS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_ARITH: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}
_WORDS = {"null": None, "None": None, "true": True, "True": True, "false": False, "False": False}
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class Clause:
    """One ``name OP literal`` comparison of a condition."""

    name: str
    op: type
    literal: Any
    modulo: int | None = None
    """``name % modulo`` is compared, not ``name`` (a divisibility test)."""

    @property
    def is_ordering(self) -> bool:
        return self.op in ORDERING_OPS


def _left(node: ast.expr) -> tuple[str, int | None] | None:
    """The clause's left side: ``name`` or ``name % positive_int`` (None: neither)."""
    if isinstance(node, ast.Name):
        return node.id, None
    is_mod = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)
    if is_mod and isinstance(node.left, ast.Name) and isinstance(node.right, ast.Constant):
        k = node.right.value
        if isinstance(k, int) and not isinstance(k, bool) and k > 0:
            return node.left.id, k
    return None


def _parse(text: Any, key: str, what: str) -> ast.expr:
    if not isinstance(text, str) or not text.strip():
        raise SpaceError(key, f"{what} must be a non-empty string, got {text!r}")
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise SpaceError(key, f"cannot parse {what} {text!r}: {e.msg}") from None


def _literal(node: ast.expr, key: str, text: str) -> Any:
    if isinstance(node, ast.Name):
        return _WORDS.get(node.id, node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, _SCALARS):
        return node.value
    is_negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    if is_negative and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    raise SpaceError(key, f"in {text!r}: the right side of a clause must be a plain value")


def _clause(node: ast.Compare, key: str, text: str) -> Clause:
    if len(node.ops) != 1 or type(node.ops[0]) not in _COMPARE:
        raise SpaceError(key, f"in {text!r}: write one comparison per clause (name == value)")
    left = _left(node.left)
    if left is None:
        raise SpaceError(
            key, f"in {text!r}: the left side of a clause must be a name (or name % number)"
        )
    literal = _literal(node.comparators[0], key, text)
    return Clause(left[0], type(node.ops[0]), literal, left[1])


@dataclass(frozen=True, eq=False)
class Condition:
    """A parsed ``when:`` expression; ``evaluate`` answers True, False or None (unknown)."""

    text: str
    tree: ast.expr
    clauses: tuple[Clause, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.name for c in self.clauses))

    def evaluate(self, values: Mapping[str, Any]) -> bool | None:
        """Three-valued: None when a name it needs is not in ``values`` yet.

        That lets a space be dropped statically from the context alone
        (``backend == nccl`` on gloo) while param-dependent parts wait for sampling.
        """
        return _evaluate(self.tree, values)

    def __str__(self) -> str:
        return self.text


def parse_condition(text: Any, key: str) -> Condition:
    """Parse a ``when:`` string or raise SpaceError naming ``key``."""
    tree = _parse(text, key, "condition")
    clauses: list[Clause] = []

    def check(node: ast.expr) -> None:
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                check(value)
        elif isinstance(node, ast.Compare):
            clauses.append(_clause(node, key, text))
        else:
            raise SpaceError(
                key,
                f"condition {text!r} is not of the form `name == value`, joined by and/or",
            )

    check(tree)
    return Condition(text.strip(), tree, tuple(clauses))


def _evaluate(node: ast.expr, values: Mapping[str, Any]) -> bool | None:
    if isinstance(node, ast.BoolOp):
        results = [_evaluate(v, values) for v in node.values]
        decisive, other = (False, True) if isinstance(node.op, ast.And) else (True, False)
        if decisive in results:
            return decisive
        return other if all(r is other for r in results) else None
    assert isinstance(node, ast.Compare)
    left = _left(node.left)
    assert left is not None
    name, modulo = left
    if name not in values:
        return None
    value, op = values[name], type(node.ops[0])
    literal = _literal(node.comparators[0], "", "")
    if modulo is not None:
        if not isinstance(value, int) or isinstance(value, bool):
            return False  # only a whole number is divisible
        value = value % modulo
    if op in ORDERING_OPS and (value is None or literal is None):
        return False  # an unset variable is neither above nor below a number
    return bool(_COMPARE[op](value, literal))


@dataclass(frozen=True, eq=False)
class Constraint:
    """A parsed constraint; it holds vacuously while any participant is unset (None)."""

    text: str
    tree: ast.Compare
    names: tuple[str, ...]
    """Participants, in order of first appearance."""

    def holds(self, values: Mapping[str, Any]) -> bool:
        if any(values.get(name) is None for name in self.names):
            return True
        left = _arith(self.tree.left, values)
        for op, node in zip(self.tree.ops, self.tree.comparators, strict=True):
            right = _arith(node, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def __str__(self) -> str:
        return self.text


def parse_constraint(text: Any, key: str) -> Constraint:
    """Parse a constraint string or raise SpaceError naming ``key``."""
    tree = _parse(text, key, "constraint")
    if not isinstance(tree, ast.Compare) or not all(type(op) in _COMPARE for op in tree.ops):
        raise SpaceError(key, f"constraint {text!r} must compare two expressions (A * B <= 64)")
    names: list[str] = []

    def check(node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise SpaceError(key, f"in {text!r}: only numbers may appear as constants")
        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            check(node.left)
            check(node.right)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            check(node.operand)
        else:
            raise SpaceError(key, f"in {text!r}: use only names, numbers, + - * and comparisons")

    for node in [tree.left, *tree.comparators]:
        check(node)
    if not names:
        raise SpaceError(key, f"constraint {text!r} names no param")
    return Constraint(text.strip(), tree, tuple(dict.fromkeys(names)))


def _arith(node: ast.expr, values: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        operand = _arith(node.operand, values)
        return -operand if isinstance(node.op, ast.USub) else operand
    assert isinstance(node, ast.BinOp)
    return _ARITH[type(node.op)](_arith(node.left, values), _arith(node.right, values))
