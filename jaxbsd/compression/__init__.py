"""The compression engine (being assembled): surgery, specs, sites, methods, budgets, reports, the engine."""
