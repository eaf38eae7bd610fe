"""Latent Dirichlet allocation: VIPS's public half (model.py) and the unigram fallback's public English word
prior (word_prior.py). Its facts (kind, options, defaults) are in spec.py. Importing this package loads
nothing."""
