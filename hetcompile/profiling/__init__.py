"""Measured profiles: `hetcompile profile` sweeps a running vLLM server and fits the step model."""

from hetcompile.profiling.sweep import ProfileError, SweepConfig, profile

__all__ = ["ProfileError", "SweepConfig", "profile"]
