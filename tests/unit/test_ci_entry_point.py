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


def test_ci_runs_the_readme_test_command_in_the_activated_venv_and_exits_with_its_status() -> None:
    lines = [ln.strip() for ln in (REPO / ".ci/run").read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    run = [c for c in commands if c.startswith(readme_test_command())]
    assert run == [f"{readme_test_command()} && tests=0 || tests=$?"]
    assert commands[-1] == 'exit "$tests"'  # after the linters' and the builds' verdicts
    assert ". .venv/bin/activate" in commands
    assert commands.index(". .venv/bin/activate") < commands.index(run[0])
    # The linters run beside the tests, in the venv; their failure fails the run too.
    lint = next(c for c in commands if "ruff check" in c)
    assert "ruff check healer healer_dev api tests migrations bench && lint-imports && mypy" in lint
    assert commands.index(". .venv/bin/activate") < commands.index(lint)
    assert any(c.startswith('waited "lint') for c in commands)
    # No pip into the system's Python: every install goes through the venv's interpreter.
    assert not [c for c in commands if "pip install" in c and not c.startswith(".venv/bin/python -m pip")]


def test_make_test_installs_the_dev_extras_then_runs_the_readme_command() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    steps = [ln.strip() for ln in recipe.splitlines()[1:] if ln.startswith("\t")]
    assert steps[0].startswith(".venv/bin/python -m pip install") and "'.[dev]'" in steps[0]
    assert steps[-1] == f". .venv/bin/activate && {readme_test_command()}"
