"""Checking an image before it is indexed, and preparing it for a vision endpoint (Pillow).

An image is refused (ImageRejected, recorded as an ingest failure of that image) when it is larger than
MAX_IMAGE_BYTES (20 MB) or MAX_IMAGE_PIXELS (40 megapixels), not of an accepted format (image files:
PNG, JPEG, WebP, GIF; images inside PDFs also JPEG 2000 and TIFF, as pypdf extracts them), or does not
decode completely (corrupt or truncated). An image smaller than MIN_CAPTION_SIDE pixels on a side is
accepted but not worth captioning (an icon, a bullet, a rule). The vision endpoint gets PNG or JPEG of at
most MAX_SEND_SIDE pixels on the longer side: other formats, larger images and animations (first frame)
are converted.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000
MIN_CAPTION_SIDE = 32
MAX_SEND_SIDE = 2048
MAX_SEND_BYTES = 4 * 1024 * 1024  # larger PNG/JPEG files are re-encoded (smaller) before sending
FILE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
PDF_FORMATS = (*FILE_FORMATS, "JPEG2000", "TIFF")


class ImageRejected(ValueError):
    """The image cannot be indexed; the message is the reason recorded for it."""


@dataclass(frozen=True)
class CheckedImage:
    data: bytes
    sha256: str
    format: str  # Pillow's name: PNG, JPEG, WEBP, GIF, JPEG2000, TIFF
    width: int
    height: int

    @property
    def small(self) -> bool:
        """Too small to be worth a caption (icons, bullets, rules)."""
        return min(self.width, self.height) < MIN_CAPTION_SIDE

    def for_vision(self) -> tuple[bytes, str]:
        """(bytes, MIME type) to send: the file itself when it is a modest PNG or JPEG, else a PNG (or a
        JPEG, for JPEG sources) scaled to at most MAX_SEND_SIDE pixels on its longer side."""
        if (
            self.format in ("PNG", "JPEG")
            and max(self.width, self.height) <= MAX_SEND_SIDE
            and len(self.data) <= MAX_SEND_BYTES
        ):
            return self.data, f"image/{self.format.lower()}"
        try:
            with Image.open(io.BytesIO(self.data)) as im:
                im.seek(0)
                frame = im.convert("RGBA" if _has_alpha(im) else "RGB")
            frame.thumbnail((MAX_SEND_SIDE, MAX_SEND_SIDE))
            out = io.BytesIO()
            if self.format in ("JPEG", "JPEG2000") and frame.mode == "RGB":
                frame.save(out, "JPEG", quality=90)
                return out.getvalue(), "image/jpeg"
            frame.save(out, "PNG", optimize=False)
            return out.getvalue(), "image/png"
        except (OSError, ValueError) as e:
            raise ImageRejected(f"cannot convert the image for the vision endpoint: {e}") from e


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info)


def check_image(data: bytes, formats: tuple[str, ...] = FILE_FORMATS) -> CheckedImage:
    """The image, checked (size, pixels, format, complete decode); ImageRejected says why not."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRejected(f"image is {len(data) / 2**20:.1f} MB; the limit is {MAX_IMAGE_BYTES / 2**20:.0f} MB")
    if not data:
        raise ImageRejected("image file is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=list(formats)) as im:  # no other decoder is tried
                fmt, (width, height) = im.format or "?", im.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise ImageRejected(
                        f"image is {width}x{height} = {width * height / 1e6:.1f} megapixels; "
                        f"the limit is {MAX_IMAGE_PIXELS / 1e6:.0f}"
                    )
                im.load()  # decodes everything: a truncated or corrupt image fails here
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageRejected(f"image has too many pixels (the limit is {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels)") from e
    except UnidentifiedImageError as e:
        accepted = ", ".join(f.lower() for f in formats)
        raise ImageRejected(f"not a readable image of an accepted format ({accepted}): corrupt or other") from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageRejected(f"corrupt image: {str(e).strip() or type(e).__name__}") from e
    if width < 1 or height < 1:
        raise ImageRejected(f"image has no pixels ({width}x{height})")
    return CheckedImage(data, hashlib.sha256(data).hexdigest(), fmt, width, height)
