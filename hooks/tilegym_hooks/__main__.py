"""``python -m tilegym_hooks`` runs the same command line as the ``tilegym-hooks`` script."""

from tilegym_hooks.cli import main

raise SystemExit(main())
