"""The Monty worker's bridge (``bridge.py``), exec'd inside the sandbox."""
