"""The control database as the service sees it: its engine, its tables, the values their columns hold (job
states, API keys stored as hashes), posterior documents in chunks, release arrays as .npz, and UTC
timestamps. Nothing sensitive is stored here; the bottom layer of the service, importing none of it above.
"""
