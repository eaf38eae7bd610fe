"""Accounting: what a sequence of releases costs in (epsilon, delta), computed from public facts only.

The typed events a release is charged as, their composition by the configured accountant (the tight PLD of
`pld`, Renyi DP without replacement in `wor_rdp`, autodp's moments accountant), the calibration of sigma to
a target, and the accountants' names and settings. Imports nothing of the data, the ledger or the service:
a cost depends on the schedule, never on rows.
"""
