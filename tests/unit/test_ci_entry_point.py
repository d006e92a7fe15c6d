"""``.ci/run`` and ``make test`` run the README's test command, inside the repository's own .venv."""

from __future__ import annotations

import re

from tests.conftest import REPO


def readme_test_command() -> str:
    """The ``python3 -m pytest ...`` line of the README's "Two commands" block (comment stripped)."""
    block = re.search(r"## Two commands\n\n```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "README.md has a 'Two commands' shell block"
    (line,) = [ln for ln in block[1].splitlines() if ln.startswith("python3 -m pytest")]
    return line.split("#", 1)[0].strip()


def test_ci_runs_the_readme_test_command_last_in_the_activated_venv() -> None:
    lines = [ln.strip() for ln in (REPO / ".ci/run").read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    assert commands[-1] == readme_test_command()
    assert ". .venv/bin/activate" in commands
    assert commands.index(". .venv/bin/activate") < len(commands) - 1
    assert "ruff check healer healer_dev api tests migrations bench" in commands
    assert "lint-imports" in commands and "mypy" in commands
    # No pip into the system's Python: every install goes through the venv's interpreter.
    assert not [c for c in commands if "pip install" in c and not c.startswith(".venv/bin/python -m pip")]


def test_make_test_installs_the_dev_extras_then_runs_the_readme_command() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    steps = [ln.strip() for ln in recipe.splitlines()[1:] if ln.startswith("\t")]
    assert steps[0].startswith(".venv/bin/python -m pip install") and "'.[dev]'" in steps[0]
    assert steps[-1] == f". .venv/bin/activate && {readme_test_command()}"
