"""observe: the running fleet measured (observe.py), as observed.yaml (doc.py); `hetcompile observe`."""
