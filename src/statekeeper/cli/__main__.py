"""``python -m statekeeper.cli``."""

from statekeeper.cli import main

main()
