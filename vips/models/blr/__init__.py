"""Bayesian logistic regression: VIPS's public half (model.py), DPVI's (dpvi.py); DP-SEP's is in
vips.models.dpsep. Its facts (kind, options, defaults) are in spec.py. Importing this package loads
nothing: the API reads spec.py without the model's numerical code."""
