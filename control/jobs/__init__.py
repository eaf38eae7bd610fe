"""The job lifecycle the API and the worker share: the queue that sends a job (and its brokers), its end
(terminal status and refund in one transaction), stopping it, the reaper that ends what nobody runs, and
what its outputs take in storage. Imports no web framework (an import contract), so the worker may import
it.
"""
