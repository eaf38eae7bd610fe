"""The control plane: what both the API (service/) and the worker (worker/) run on.

jobs/ (a job's lifecycle: queueing, control, the reaper, its end), planning/ (admission, schedules,
options, resources, pricing), store/ (the control database's tables and queries), budgets/ (datasets'
budgets, keys' quotas and spend), and the settings, errors, API schemas, caches and rate limits both
processes read. It imports the privacy wall's ledger and accounting, never the wall's data side, the
worker or the web layer (pyproject.toml's import contracts).
"""
