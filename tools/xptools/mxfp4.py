"""DeepSeek-layout MXFP4 in numpy: each byte holds two E2M1 values (low nibble first), and
every 32 values along a row share one UE8M0 scale byte (2^(s-127)). Independent of the Rust
codec: the tools compare the two."""
from __future__ import annotations

import numpy as np

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def decode(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[rows, k/2] packed nibbles and [rows, k/32] E8M0 scales -> [rows, k] float32."""
    packed = np.asarray(packed, np.uint8)
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.float32)
    out[:, 0::2] = E2M1[packed & 15]
    out[:, 1::2] = E2M1[packed >> 4]
    return out * np.repeat(np.exp2(np.asarray(scales, np.uint8).astype(np.float32) - 127), 32, axis=1)
