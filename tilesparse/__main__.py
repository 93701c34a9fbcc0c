"""`python -m tilesparse` runs the CLI."""

from .cli import main

raise SystemExit(main())
