"""End-to-end benchmark of one kernel experiment (throughput, correctness, cuTile coverage).

Importing this package must stay cheap and torch-free: the bot imports
``tilegym_hf_bench.metrics_schema`` to validate metrics files on machines without torch.
"""
