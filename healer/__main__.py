"""``python -m healer``: the same as the ``healer`` command."""

from healer.cli import main

main()
