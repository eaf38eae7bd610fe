"""What a job asks for and what it will cost, decided before anything is reserved, from public facts only:
its model options, the schedule chosen when it gives only epsilon, the worker and database resources it
will need, the admission checks, and the bounded pool that prices quotes. Shared with the worker (which
reads the same options and schedule rules); imports no web framework.
"""
