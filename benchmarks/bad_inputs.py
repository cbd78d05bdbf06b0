"""Every bad input of the locked-doors tests through the real CLI: exit code, seconds, message.

Reads the cases of ``tests/unit/test_inputs.py`` (``BAD``: argv, the key it must name) and runs
each as a user does, ``python -m orchestrator.search --preset smoke ARGV`` in a fresh
interpreter, timing the whole command, and prints one Markdown table row per case: what a
reviewer needs to see that each bad input ends in one line, fast, naming the key. About a
minute and a half on 2 cores.

    python -m benchmarks.bad_inputs            # every case
    python -m benchmarks.bad_inputs --quick    # the first two (what the tests run)
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "unit" / "test_inputs.py"


def _cases():  # noqa: ANN202 (a module read as data)
    spec = importlib.util.spec_from_file_location("locked_doors_cases", CASES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


QUICK_CASES = 2
"""``--quick``: the first cases only (what the test suite runs, so the script cannot rot)."""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"the first {QUICK_CASES} cases only")
    args = p.parse_args(argv)
    cases = _cases()
    chosen = cases.BAD[:QUICK_CASES] if args.quick else cases.BAD
    print("| input | exit | seconds | message |\n|---|---|---|---|")
    slowest = 0.0
    with tempfile.TemporaryDirectory(prefix="commtune-bad-") as tmp:
        folder = cases.make_files(Path(tmp))
        for argv, key, _ in chosen:
            args = [a.replace("{d}", str(folder)) for a in argv]
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "orchestrator.search", "--out", str(Path(tmp) / "out"),
                 *cases.SMOKE, *args],  # fmt: skip  (a case's own --out comes last and wins)
                cwd=ROOT, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            took = time.monotonic() - started
            slowest = max(slowest, took)
            shown = " ".join(argv).replace("{d}", "DIR").replace("|", "\\|")[:70]
            message = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
            message = message.replace("|", "\\|")[:160]
            named = "" if f"error: {key}" in proc.stderr else " (key not named!)"
            print(f"| `{shown}` | {proc.returncode} | {took:.2f} | {message}{named} |", flush=True)
    print(f"\n{len(chosen)} bad inputs; slowest {slowest:.2f} s")


if __name__ == "__main__":
    main()
