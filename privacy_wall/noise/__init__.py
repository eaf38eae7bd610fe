"""Noise: the exact discrete Gaussian sampler, the fixed-point release that adds it, the generator it draws
from and the draw-ahead thread.

Every private release's noise comes from here and from nothing else: integer noise from the compiled
sampler (`_discrete_gaussian.pyx`, wrapped by `discrete_gaussian`), drawn from an unseedable AES-CTR
generator (`csprng`), added on a public grid by `mechanisms.release_blocks`, and possibly drawn ahead on a
second thread (`draw_ahead`). Imports nothing of the data, the ledger or the service.
"""
