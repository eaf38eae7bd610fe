"""Latent Dirichlet allocation: VIPS's public half (model.py; setup.py builds it for a job) and the unigram
fallback's public English word prior (word_prior.py). Its facts (kind, options, defaults, rule) are in
spec.py. Importing this package loads nothing."""
