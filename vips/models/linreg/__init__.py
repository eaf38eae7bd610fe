"""Bayesian linear regression: VIPS's public half (model.py); DP-SEP's is in vips.models.dpsep. Its facts
(kind, options, defaults) are in spec.py. Importing this package loads nothing."""
