"""Benchmark executors: run ``tilegym-hf-bench`` for one commit, locally or in the experiment image.

``base`` holds the request/result records and the pure mapping from an exit to a metrics
``status``; ``local`` and ``docker`` do the process/container I/O; ``gpulock`` and ``jobqueue`` keep
one benchmark per GPU; ``artifact`` checks what the GPU job hands the bot job; ``cli`` wires
``tilegym-bot runner ...``.
"""
