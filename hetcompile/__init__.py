"""hetcompile: compile a spec of LLMs, GPUs, regions and budget into a runnable serving plan."""

__version__ = "0.1.0"
