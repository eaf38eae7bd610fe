"""The ledger: per-dataset budgets, reservations and charges, and the control-database tables that hold them.

A release is charged before it is returned (`base.Ledger`, in memory; `database`, in PostgreSQL or SQLite
under row locks), a job's reservation bounds what it may charge and is refunded when it ends, and a refusal
says how much is left (`refusals`). The delta policy (`delta_policy`) keeps a private dataset's delta below
1/N. The tables (`schema`) are the public catalogue of datasets and the ledger: nothing sensitive.
"""
