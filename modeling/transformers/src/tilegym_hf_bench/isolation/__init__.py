"""Confinement of the worker process that imports an experiment's code (see audit_hook)."""
