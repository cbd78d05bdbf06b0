"""Every bad input of the locked-doors tests through the real CLI: exit code, seconds, message.

Reads the cases of ``tests/unit/test_inputs.py`` (``BAD``: argv, the key it must name) and runs
each as a user does, ``python -m orchestrator.search --preset smoke ARGV`` in a fresh
interpreter, timing the whole command, and prints one Markdown table row per case: what a
reviewer needs to see that each bad input ends in one line, fast, naming the key. About a
minute and a half on 2 cores.

    python -m benchmarks.calibration.bad_inputs            # every case
    python -m benchmarks.calibration.bad_inputs --quick    # the first two (the tests')
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

from benchmarks._commands import ROOT, run_module
from benchmarks._record import add_results_option, recording

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
    add_results_option(p)
    args = p.parse_args(argv)
    cases = _cases()
    chosen = cases.BAD[:QUICK_CASES] if args.quick else cases.BAD
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory(prefix="commtune-bad-") as tmp):  # fmt: skip
        print("| input | exit | seconds | message |\n|---|---|---|---|")
        folder = cases.make_files(Path(tmp))
        figures["cases"] = []
        for case, key, _ in chosen:
            given = [a.replace("{d}", str(folder)) for a in case]
            # a case's own --out comes last and wins
            ran = run_module("orchestrator.search", ["--out", str(Path(tmp) / "out"), *cases.SMOKE,
                             *given], check=False, timeout_s=300)  # fmt: skip
            shown = " ".join(case).replace("{d}", "DIR").replace("|", "\\|")[:70]
            message = ran.stderr.strip().splitlines()[-1] if ran.stderr.strip() else ""
            named = f"error: {key}" in ran.stderr
            figures["cases"].append({"input": shown, "exit": ran.returncode, "seconds": ran.seconds,
                                     "message": message, "key_named": named})  # fmt: skip
            cell = message.replace("|", "\\|")[:160] + ("" if named else " (key not named!)")
            print(f"| `{shown}` | {ran.returncode} | {ran.seconds:.2f} | {cell} |", flush=True)
        slowest = max(c["seconds"] for c in figures["cases"])
        print(f"\n{len(chosen)} bad inputs; slowest {slowest:.2f} s")


if __name__ == "__main__":
    main()
