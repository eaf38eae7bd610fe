"""The sigmoid belief network: VIPS's public half (model.py). Its facts (kind, options, defaults) are in
spec.py. Importing this package loads nothing."""
