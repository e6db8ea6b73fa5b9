"""Pre-commit guards for TileGym experiments: scope, coverage prefixes and the sandbox.

Each guard keeps its rule as a pure function over plain data (paths, file contents) and leaves
git and file-system access to a thin I/O layer, so the rules are tested without a repository.

Finding codes (``path:line: CODE message``):

==========  ====================================================================================
SCOPE001    file outside what an experiment for its model may change
SCOPE002    ``monkey_patch.py`` changed outside ``apply_tilegym_kernel_to_<K>``
SCOPE003    ``tilegym_patch.py`` changed outside ``MODEL_PATCH_KWARGS["<K>"]``
SCOPE004    coverage prefixes removed (an experiment may only add)
SCOPE005    a guarded file cannot be parsed (syntax error, not UTF-8, too large, bad YAML)
PREFIX000   prefix file missing, unreadable, too large, not UTF-8, or invalid YAML (duplicate key)
PREFIX001   prefix file is not ``prefixes: [str, ...]``
PREFIX002   prefix entry is not a string
PREFIX003   prefix entry is empty
PREFIX004   duplicate prefix
PREFIX005   prefix names no ``@ct.kernel`` function under ``src/tilegym``
SANDBOX001  a file under ``sandbox/`` other than README.md and .gitignore is in the index
==========  ====================================================================================
"""
