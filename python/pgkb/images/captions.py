"""Captions for the images of one ingest run: from the caption cache when it has them, else from the
vision endpoint (stored in the cache). A failing endpoint never stops the run: the image goes in without
a caption; after MAX_FAILURES_IN_A_ROW failures in a row the endpoint is taken as down and not called
again in this run (``down`` says why), so a dead endpoint costs a few timeouts, not one per image."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pgkb.images.check import CheckedImage
from pgkb.models.vision import VisionCaptioner, VisionError

MAX_FAILURES_IN_A_ROW = 3


class CaptionCache(Protocol):
    """Where captions are kept between runs (kb.image_captions through its functions, for one KB)."""

    def lookup(self, sha256s: list[str], model: str, language: str) -> dict[str, str]: ...

    def store(self, sha256: str, model: str, language: str, caption: str) -> None: ...


@dataclass
class Caption:
    text: str | None  # None: no caption (see error)
    cached: bool = False
    error: str | None = None  # the endpoint failed (or was given up on): worth retrying next run


class Captioning:
    """The captioner and cache of a run; ``captioner`` None: images are indexed without captions."""

    def __init__(self, captioner: VisionCaptioner | None, cache: CaptionCache | None) -> None:
        self.captioner, self.cache = captioner, cache
        self.calls = 0  # requests sent to the vision endpoint
        self.failures_in_a_row = 0
        self.down: str | None = None

    @property
    def model(self) -> str | None:
        return self.captioner.model if self.captioner else None

    def tag(self) -> str:
        """What captions depend on, for content hashes: the model, or that there is none."""
        return f"vision={self.model}" if self.captioner else "vision=none"

    def cached(self, sha256s: list[str], language: str) -> dict[str, str]:
        if not self.captioner or not self.cache or not sha256s:
            return {}
        return self.cache.lookup(sorted(set(sha256s)), self.captioner.model, language)

    def ask(self, image: CheckedImage, language: str) -> Caption:
        """A fresh caption from the endpoint (stored in the cache), or why there is none."""
        assert self.captioner is not None
        if self.down:
            return Caption(None, error=self.down)
        payload, mime = image.for_vision()  # ImageRejected: the caller records a bad image
        self.calls += 1
        try:
            text = self.captioner.caption(payload, mime, language)
        except VisionError as e:
            self.failures_in_a_row += 1
            if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
                self.down = (
                    f"{self.failures_in_a_row} caption requests in a row failed, so the vision endpoint looks "
                    f"down ({e}); the remaining images of this run are indexed without captions"
                )
            return Caption(None, error=str(e))
        self.failures_in_a_row = 0
        if self.cache:
            self.cache.store(image.sha256, self.captioner.model, language, text)
        return Caption(text)
