"""Type stub of the compiled core (privacy_wall/noise/_discrete_gaussian.pyx)."""

import numpy as np
from numpy.typing import NDArray

P_MAX: int
Q_MAX: int
V_CAP_MAX: int

def parameters(p: int, q: int) -> tuple[int, int, int]: ...
def sample(
    bit_generator: np.random.BitGenerator, p: int, q: int, size: int, v_cap: int
) -> NDArray[np.int64]: ...
def uniform_below(bit_generator: np.random.BitGenerator, bound: int, size: int) -> NDArray[np.int64]: ...
