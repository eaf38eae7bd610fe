"""The HTTP layer's plumbing, beside the routes: the server and its connection limits, request size limits,
trusted proxies, bearer-key authentication and roles, per-key request rates, bounded path and query
parameters, typed dependencies, the offline ReDoc page, and the typed client of the API that the CLI uses.
"""
