"""Performance knowledge: GPU and model catalogs, the analytic model, measured-profile import."""
