"""Image captions from an OpenAI-compatible vision chat endpoint (``POST …/chat/completions``).

One request per image: a system-less user message whose content parts are the prompt
(``{"type": "text"}``) and the image as a data URL (``{"type": "image_url", "image_url": {"url":
"data:image/png;base64,…"}}``); the caption is ``choices[0].message.content``. This is the shape of Qwen-VL
on DashScope's compatible mode, OpenAI, vLLM, LM Studio and Ollama's ``/v1`` API. Retries (connection
errors, timeouts, 429, 5xx) come from ``models.http_json``; any failure raises VisionError.

The prompt asks for a faithful description for search: what the image shows, every readable text, for a
chart its type, axes, series and key numbers, for a table its cells. It is written in Chinese for
``language="zh"`` (the surrounding document is Chinese) and in English otherwise. The prompt carries no
document context, so a caption depends only on the image, the model and the language (the cache key).

Configuration (``pgkb.config.Settings``): PGKB_VISION_URL (base URL such as ``…/v1`` or the full
``…/chat/completions`` URL; nothing is called while it is unset), PGKB_VISION_MODEL (default
``qwen-vl-max``), PGKB_VISION_API_KEY, PGKB_VISION_TIMEOUT (seconds per request, default 60).
"""

from __future__ import annotations

import base64

from pgkb.models.http_json import JsonEndpoint, shown_url

DEFAULT_VISION_MODEL = "qwen-vl-max"
DEFAULT_VISION_TIMEOUT = 60.0
MAX_CAPTION_CHARS = 2000  # a longer answer is cut (at a line end when one is near)

PROMPTS = {
    "zh": (
        "请忠实、具体地描述这张图片，供知识库检索使用。写出图中所有可读的文字。"
        "如果是图表：说明图表类型、横轴和纵轴（含单位）、各数据系列，以及关键数值和趋势。"
        "如果是表格：逐行写出单元格内容。如果是截图或示意图：说明界面或结构中的各个部分。"
        "不要猜测图中没有的信息，不要寒暄，直接输出描述。"
    ),
    "en": (
        "Describe this image faithfully and specifically, for search in a knowledge base. Transcribe all "
        "readable text. For a chart: its type, the x and y axes (with units), each data series, and the key "
        "numbers and trends. For a table: the cells, row by row. For a screenshot or diagram: its parts. "
        "Do not guess what is not shown; no preamble, only the description."
    ),
}


class VisionError(RuntimeError):
    """A caption could not be obtained (endpoint down, timeout, refusal, empty or malformed answer)."""


def chat_completions_url(url: str) -> str:
    """The ``…/chat/completions`` URL for a base URL (``http://host:11434/v1``) or the full URL itself."""
    if not url.startswith(("http://", "https://")):
        raise VisionError(f"vision URL must be http(s), got {shown_url(url)}")
    base = url.split("?", 1)[0].rstrip("/")
    return base if base.endswith("/chat/completions") else base + "/chat/completions"


class VisionCaptioner(JsonEndpoint):
    """Captions images through one OpenAI-compatible vision chat endpoint."""

    error = VisionError

    def __init__(
        self,
        url: str,
        model: str = DEFAULT_VISION_MODEL,
        api_key: str = "",
        *,
        timeout: float = DEFAULT_VISION_TIMEOUT,
        retries: int = 1,
        backoff: float = 1.0,
        max_tokens: int = 1024,
    ) -> None:
        url = chat_completions_url(url)
        if not model.strip():
            raise VisionError("vision model name must not be empty")
        super().__init__(url, api_key, what="vision", timeout=timeout, retries=retries, backoff=backoff)
        self.model, self.max_tokens = model, max_tokens

    def caption(self, image: bytes, mime: str, language: str = "en") -> str:
        """The model's description of ``image`` (bytes of type ``mime``, e.g. image/png) in ``language``."""
        data_url = f"data:{mime};base64,{base64.b64encode(image).decode('ascii')}"
        body = {
            "model": self.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": PROMPTS.get(language, PROMPTS["en"])},
                        {"type": "image_url", "image_url": {"url": data_url}},
                    ],
                }
            ],
            "max_tokens": self.max_tokens,
            "temperature": 0,
        }
        return _caption_text(self.post(body), self)


def _caption_text(answer: object, endpoint: JsonEndpoint) -> str:
    """The caption in ``answer``, redacted (it becomes searchable text), then cut to MAX_CAPTION_CHARS."""
    try:
        content = answer["choices"][0]["message"]["content"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError) as e:
        raise VisionError(f"{endpoint.shown} returned no choices[0].message.content") from e
    if isinstance(content, list):  # content parts, as some servers answer
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str) or not content.strip():
        raise VisionError(f"{endpoint.shown} returned an empty caption")
    text = endpoint.redact(content.replace("\x00", "")).strip()
    if len(text) > MAX_CAPTION_CHARS:
        cut = text.rfind("\n", MAX_CAPTION_CHARS - 300, MAX_CAPTION_CHARS)
        text = text[: cut if cut > 0 else MAX_CAPTION_CHARS].rstrip()
    return text


def load_captioner(settings) -> VisionCaptioner | None:
    """The captioner the settings configure, or None while PGKB_VISION_URL is unset."""
    if not settings.vision_url:
        return None
    return VisionCaptioner(
        settings.vision_url, settings.vision_model, settings.vision_api_key, timeout=settings.vision_timeout
    )
