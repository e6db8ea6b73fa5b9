"""Granite (ibm-granite/granite-3.3-2b-instruct architecture): cuTile forwards, model-local
kernels, inventory."""
