"""Where experiments live: ``local`` (plain git, the default) and ``github`` (pull requests)."""
