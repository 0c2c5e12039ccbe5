"""The typing test: a user's module must pass ``mypy --strict``, a wrong one must fail.

Run from the repository root: ``python tests/typing/check.py``. ``user_module.py``
must type-check with no error (its ``typing.assert_type`` calls pin the inferred
types); in ``wrong_usage.py`` every line marked ``# error: CODE`` must draw an
error with that code, and no other line may draw one. Exits non-zero otherwise.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")
MARK = re.compile(r"#\s*error:\s*(?P<code>[a-z-]+)")


def mypy(module: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(HERE / "mypy.ini"), module],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def errors_in(output: str, module: str) -> set[tuple[int, str]]:
    found = set()
    for line in output.splitlines():
        match = ERROR.match(line.strip())
        if match and Path(match["path"]).as_posix() == module:
            found.add((int(match["line"]), match["code"]))
    return found


def main() -> int:
    failed = False
    good = "tests/typing/user_module.py"
    status, output = mypy(good)
    if status != 0:
        print(f"FAIL {good} must type-check under mypy --strict:\n{output}")
        failed = True
    else:
        print(f"ok   {good} passes mypy --strict")

    bad = "tests/typing/wrong_usage.py"
    expected = {
        (number, match["code"])
        for number, text in enumerate((ROOT / bad).read_text().splitlines(), start=1)
        if (match := MARK.search(text))
    }
    status, output = mypy(bad)
    found = errors_in(output, bad)
    if status == 0 or found != expected:
        print(f"FAIL {bad} must fail exactly on its marked lines")
        for line, code in sorted(expected - found):
            print(f"  expected on line {line}: [{code}], not reported")
        for line, code in sorted(found - expected):
            print(f"  unexpected on line {line}: [{code}]")
        print(output)
        failed = True
    else:
        print(f"ok   {bad} fails mypy --strict on its {len(expected)} marked lines, no others")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
