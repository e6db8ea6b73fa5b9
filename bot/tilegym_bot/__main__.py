"""``python -m tilegym_bot``: the ``tilegym-bot`` command where no console script is installed."""

import sys

from tilegym_bot.cli import main

sys.exit(main())
