"""Pack tokenised documents into fixed-length windows that attention and loss never cross.

Documents are laid end to end, each followed by an EOS separator, and cut into windows of
``window`` tokens (a document longer than what is left of a window continues in the next one;
the last window is padded). Per token, in arrays of shape (n_windows, window):

- ``input_ids``;
- ``doc_ids``: index of the source document, -1 on padding. A block-diagonal causal mask is
  ``(doc_ids[:, :, None] == doc_ids[:, None, :]) & causal`` (a fragment continued from the
  previous window only sees its own window);
- ``position_ids``: restart at 0 where each document (or its continued fragment) starts in the
  window, as flash-attention's variable-length path expects;
- ``labels``: the Hugging Face unshifted convention (the model predicts ``labels[t]`` from
  tokens ``< t``). ``labels[t] = -100`` where token t starts a document fragment, so the last
  token of one document is never trained to predict the first of the next, and on padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100


@dataclass(frozen=True)
class PackedWindows:
    input_ids: np.ndarray  # (n_windows, window) int32
    position_ids: np.ndarray  # (n_windows, window) int32
    doc_ids: np.ndarray  # (n_windows, window) int32, -1 = padding
    labels: np.ndarray  # (n_windows, window) int32, -100 = no loss
    n_docs: int
    n_tokens: int  # real tokens (EOS separators included, padding excluded)

    @property
    def n_windows(self) -> int:
        return int(self.input_ids.shape[0])

    def columns(self) -> dict[str, np.ndarray]:
        """The four per-token arrays by their dataset column names."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "doc_ids": self.doc_ids,
                "labels": self.labels}

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.n_tokens / self.input_ids.size if self.input_ids.size else 0.0


def pack_sequences(docs: Sequence[Sequence[int]], window: int, eos_id: int, pad_id: int) -> PackedWindows:
    """Pack ``docs`` (token id lists) into windows of ``window`` tokens; see the module docstring.

    >>> p = pack_sequences([[5, 6, 7], [8]], window=4, eos_id=2, pad_id=0)
    >>> p.input_ids.tolist(), p.doc_ids.tolist()
    ([[5, 6, 7, 2], [8, 2, 0, 0]], [[0, 0, 0, 0], [1, 1, -1, -1]])
    >>> p.position_ids.tolist(), p.labels.tolist()
    ([[0, 1, 2, 3], [0, 1, 0, 0]], [[-100, 6, 7, 2], [-100, 2, -100, -100]])
    """
    if window < 2:
        raise ValueError(f"window={window}: a window needs at least 2 tokens")
    lengths = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
    total = int(lengths.sum())
    n_windows = -(-total // window)
    size = n_windows * window
    flat = np.full(size, pad_id, dtype=np.int32)
    doc = np.full(size, -1, dtype=np.int32)
    if total:
        flat[:total] = np.concatenate([np.append(np.asarray(d, dtype=np.int32), np.int32(eos_id)) for d in docs])
        doc[:total] = np.repeat(np.arange(len(docs), dtype=np.int32), lengths)
    t = np.arange(size)
    # A fragment starts at a window edge or where the document changes; padding starts nothing.
    starts = (t % window == 0) | (doc != np.roll(doc, 1))
    starts &= doc >= 0
    segment_start = np.maximum.accumulate(np.where(starts, t, 0))
    position = np.where(doc >= 0, t - segment_start, 0).astype(np.int32)
    labels = np.where(starts | (doc < 0), IGNORE_INDEX, flat).astype(np.int32)
    shape = (n_windows, window)
    return PackedWindows(flat.reshape(shape), position.reshape(shape), doc.reshape(shape), labels.reshape(shape),
                         n_docs=len(docs), n_tokens=total)
