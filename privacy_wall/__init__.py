"""The privacy wall: the only code that reaches sensitive data, and everything a release's guarantee rests on.

privacy_wall/README.md says which files to read for which guarantee, in order. Subpackages: `accounting`
(what releases cost), `noise` (the exact noise and its generator), `ledger` (budgets and charges), `data`
(reading and storing the rows), `queries` (what each model asks of them); beside them the gate, its row
sampling, the sharded passes, the dataset-name rule and the database engines.
"""
