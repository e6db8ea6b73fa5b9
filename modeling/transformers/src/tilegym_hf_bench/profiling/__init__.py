"""Coverage by GPU time: which kernels ran, which are cuTile, and which module launched each.

``classify`` and ``attribution`` are pure (tested on plain data); ``torch_trace`` and
``nsys_trace`` turn a profiler's output into their inputs.
"""
