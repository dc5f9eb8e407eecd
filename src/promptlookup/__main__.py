"""`python -m promptlookup` is the same as the `promptlookup` console script."""

from promptlookup.cli import main

raise SystemExit(main())
