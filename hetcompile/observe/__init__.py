"""observe: the running fleet measured (observe.py), as observed.yaml (plan/observed.py); `hetcompile observe`."""
