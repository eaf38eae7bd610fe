"""Bayesian logistic regression: VIPS's public half (model.py), DPVI's (dpvi.py) and DP-SEP's (dpsep.py,
with the DP-SEP base linear regression's shares); which of them a job runs (setup.py). Its facts (kind,
options, defaults, rules) are in spec.py. Importing this package loads nothing: the API reads spec.py
without the model's numerical code."""
