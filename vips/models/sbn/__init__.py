"""The sigmoid belief network: VIPS's public half (model.py; setup.py builds it for a job). Its facts (kind,
options, defaults, rule) are in spec.py. Importing this package loads nothing."""
