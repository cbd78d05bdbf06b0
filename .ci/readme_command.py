"""Print one of the README's two set-up commands, so that CI runs it exactly as written.

The README marks each with an HTML comment on the line before its code block:
``<!-- setup: run -->`` (install and run the embedded default) and ``<!-- setup: tests -->``
(install and run the quick suite). Usage: ``python3 .ci/readme_command.py tests README.md``."""

from __future__ import annotations

import sys
from pathlib import Path


def setup_command(readme: str, which: str) -> str:
    """The one-line command in the code block after ``<!-- setup: WHICH -->``."""
    lines = readme.splitlines()
    marker = f"<!-- setup: {which} -->"
    if marker not in lines:
        raise SystemExit(f"README.md has no {marker!r} line before a code block")
    block = lines[lines.index(marker) + 1 :]
    if not block or not block[0].startswith("```"):
        raise SystemExit(f"README.md: {marker!r} is not followed by a code block")
    closing = [i for i, line in enumerate(block[1:], 1) if line.strip() == "```"]
    if not closing:
        raise SystemExit(f"README.md: the code block after {marker!r} is not closed")
    body = block[1 : closing[0]]
    commands = [line for line in body if line.strip() and not line.startswith("#")]
    if len(commands) != 1:
        raise SystemExit(f"README.md: the block after {marker!r} must hold one command")
    return commands[0]


if __name__ == "__main__":
    print(setup_command(Path(sys.argv[2]).read_text(), sys.argv[1]))
