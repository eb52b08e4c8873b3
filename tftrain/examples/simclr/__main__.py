"""`python -m tftrain.examples.simclr`: see `main.py`."""

from tftrain.examples.simclr.main import run_main

run_main()
