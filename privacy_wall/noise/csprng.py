"""The generator of every private release.

Private releases draw from `private_generator()`: a cryptographically secure bit generator (randomgen's
AESCounter, AES-128 in counter mode) keyed with 128 bits from the operating system's CSPRNG (secrets), built
anew for each release so no caller can seed it. Unlike a PCG or Mersenne Twister stream, its outputs do not
reveal its state, so released noise cannot be used to predict (and subtract) other noise or the minibatch
drawn from the same stream. AESCounter was the fastest of randomgen's cryptographic generators here (AES-NI;
ChaCha20 and SPECK128 took 2-4 times as long for the resampling uniforms of an LDA iteration) and costs
about as much as PCG64DXSM: bench/README.md. A seeded generator is accepted only where the gate has checked
that the dataset is public.
"""

import secrets

import numpy as np
from randomgen import AESCounter


def private_generator() -> np.random.Generator:
    """A fresh generator over AES-128 in counter mode, its key 128 bits from the OS's CSPRNG (set directly,
    not through a SeedSequence). Uses AES-NI where the CPU has it (`AESCounter.use_aesni`), a portable
    AES otherwise (slower, the same stream)."""
    return np.random.Generator(AESCounter(key=secrets.randbits(128)))
