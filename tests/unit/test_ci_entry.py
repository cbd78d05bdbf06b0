"""CI runs the README's set-up commands as written: the markers it reads them by are in place,
each marks one command, and a block without its marker is refused rather than guessed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setup_command():
    spec = importlib.util.spec_from_file_location("readme_command", ROOT / ".ci/readme_command.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.setup_command


def test_ci_reads_both_set_up_commands_from_the_readme() -> None:
    setup_command = _setup_command()
    readme = (ROOT / "README.md").read_text()
    tests = setup_command(readme, "tests")
    assert tests.startswith("pip install ") and tests.endswith("python -m pytest -q")
    assert setup_command(readme, "run").endswith("python -m orchestrator.search")
    assert "readme_command.py tests README.md" in (ROOT / ".ci/run").read_text()


def test_a_missing_or_ambiguous_block_is_refused() -> None:
    setup_command = _setup_command()
    with pytest.raises(SystemExit, match="no '<!-- setup: tests -->'"):
        setup_command("# title\n```bash\npytest\n```\n", "tests")
    two = "<!-- setup: tests -->\n```bash\npip install .\npytest\n```\n"
    with pytest.raises(SystemExit, match="must hold one command"):
        setup_command(two, "tests")
    with pytest.raises(SystemExit, match="is not closed"):
        setup_command("<!-- setup: tests -->\n```bash\npytest\n", "tests")
