"""cuTile kernels written into Hugging Face transformers models.

Entry points live in ``tilegym.transformers.monkey_patch`` (``apply_tilegym_kernel`` and
``apply_tilegym_kernel_to_<model_key>``); model glue and inventory under ``<model_key>/``.
Nothing is imported eagerly, so importing this package never touches transformers.
"""
