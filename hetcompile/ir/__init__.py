"""Intermediate representations: the user spec, the canonical problem IR, the plan, routing table."""
