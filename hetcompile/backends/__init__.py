"""Backends: lower a finished plan IR to files (plan.json, plan.md, SkyPilot, vLLM, router, scripts)."""
