"""``python -m keylane``: the same entry point as the ``keylane`` console script."""

from keylane.cli import main

raise SystemExit(main())
