"""What has been spent and what may be: datasets and their budget status as the service reads them from
the wall's ledger, what each job and each key has spent (priced by the configured accountant from committed
charges), and the custodian's per-key quotas on a dataset.
"""
