"""Bayesian linear regression: VIPS's public half (model.py) and DP-SEP's (dpsep.py); which of them a job
runs (setup.py). Its facts (kind, options, defaults, rules) are in spec.py. Importing this package loads
nothing."""
