"""The experiment bot: turns two benchmark metrics files into a verdict and acts on it.

Pure parts (``policy``, ``stats``, ``ledger`` formatting, ``report``) take plain data; the
forges (``forge.local`` on git, ``forge.github`` on the REST API) and ``experiment`` do the I/O.
"""
