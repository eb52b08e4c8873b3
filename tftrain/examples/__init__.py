"""Example programs built on tftrain; run one with `python -m tftrain.examples.<name>`."""
