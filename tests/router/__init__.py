"""Tests of the bundled router (hetcompile/router)."""
