"""Queries: what each model asks of the sensitive rows, as clipped per-record sums with proven sensitivities.

`base` states the protocol (declared blocks, per-record bounds, a vectorised clipped sum, an optional joint
sensitivity); each other module is one model's query (BLR, DPVI, DP-SEP, linear regression, LDA, SBN). The
gate runs them; nothing else calls them on sensitive rows.
"""
