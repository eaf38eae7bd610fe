"""scikit-learn's 8 x 8 handwritten digits (UCI optdigits test set, 1,797 images), binarised for the SBN.

Public, data-independent preprocessing: a pixel is 1 when its grey level (0..16) exceeds THRESHOLD = 7,
else 0 (J = 64). The split is fixed and public: scikit-learn's train_test_split with test_size = 0.25 and
random_state = 0 (1,347 training and 450 test images).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import NDArray

THRESHOLD = 7
TEST_SIZE = 0.25
SPLIT_SEED = 0


def load_binary_digits(split: Literal["train", "test"]) -> NDArray[np.float64]:
    """Binarised digits of one split, as a float64 matrix of 0/1 values (rows x 64)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images = (np.asarray(load_digits().data) > THRESHOLD).astype(np.float64)
    train, test = train_test_split(images, test_size=TEST_SIZE, random_state=SPLIT_SEED)
    return np.ascontiguousarray(train if split == "train" else test, dtype=np.float64)
