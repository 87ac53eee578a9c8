"""Images and charts made searchable: image chunks from Markdown references, image files and PDF pages,
captioned by an OpenAI-compatible vision endpoint (a fake one here, answering from the image it gets),
cached per knowledge base, and never costing the document its text when an image or the endpoint is bad."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest
from pgkb.chunking import chunk_bytes, chunk_markdown
from pgkb.config import ConfigError, Settings
from pgkb.images import check
from pgkb.images.check import ImageRejected, check_image
from pgkb.images.index import resolve_references
from pgkb.ingest import IngestOptions, ingest
from pgkb.models.embedding import OFFLINE_MODEL, ModelSpec
from pgkb.models.vision import VisionCaptioner, VisionError, chat_completions_url, load_captioner
from pgvector import Vector
from PIL import Image

pytestmark = pytest.mark.slow  # ingests images with a vision endpoint of its own

SPEC = ModelSpec(OFFLINE_MODEL, 384, "query: ", "passage: ")
# the fake endpoint names an image's dominant colour with a word no document contains
COLOUR_WORDS = {(220, 20, 60): "crimson", (0, 71, 171): "cobalt", (80, 200, 120): "emerald", (255, 191, 0): "amber"}


def colour_word(rgb: tuple[int, int, int]) -> str:
    """The word of the nearest of COLOUR_WORDS (JPEG shifts a flat colour a little)."""
    nearest = min(COLOUR_WORDS, key=lambda c: sum((a - b) ** 2 for a, b in zip(c, rgb, strict=True)))
    return COLOUR_WORDS[nearest]


def png(size: tuple[int, int], colour: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, fmt)
    return out.getvalue()


# ------------------------------------------------------------------------------ fake vision endpoint


class FakeVision:
    """``POST /v1/chat/completions`` on 127.0.0.1: records each request and answers with a caption naming
    the sent image's dominant colour and size (read with Pillow), e.g. "crimson chart, 120x80 pixels".
    ``statuses``: answered first, one per request (OpenAI-style error bodies); ``stall``: never answers."""

    def __init__(self, statuses=(), stall: bool = False) -> None:
        self.requests: list[dict] = []
        self.images: list[tuple[str, tuple[int, int], str]] = []  # (mime, size, colour word) sent
        self.released = threading.Event()
        endpoint, script = self, list(statuses)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if stall:
                    endpoint.released.wait(30)
                    return
                if self.path != "/v1/chat/completions":
                    return self._answer(404, {"error": {"message": "no route"}})
                if script:
                    status = script.pop(0)
                    return self._answer(status, {"error": {"message": f"scripted {status}"}})
                parts = body["messages"][0]["content"]
                url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
                mime, b64 = url.removeprefix("data:").split(";base64,")
                with Image.open(io.BytesIO(base64.b64decode(b64))) as im:
                    rgb = im.convert("RGB")
                    _, colour = max(rgb.getcolors(rgb.width * rgb.height))
                    word = colour_word(colour)
                    endpoint.images.append((mime, rgb.size, word))
                caption = f"{word} chart, {rgb.width}x{rgb.height} pixels"
                self._answer(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": caption}}]})

            def _answer(self, status: int, answer: dict) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def captioner(self, **kw) -> VisionCaptioner:
        kw.setdefault("timeout", 10)
        kw.setdefault("backoff", 0.01)
        return VisionCaptioner(self.url, "fake-vl", "sekrit", **kw)

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_vision():
    started: list[FakeVision] = []

    def start(statuses=(), stall=False) -> FakeVision:
        endpoint = FakeVision(statuses, stall)
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        endpoint.close()


# ------------------------------------------------------------------------------ helpers

GUIDE = """# 季度报告

本文介绍销售数据和部署流程。

## 收入趋势

![季度收入柱状图](img/revenue.png "2024 年各季度收入")

![远程图片](https://example.com/remote.png)

![外部](../outside.png)

## 部署流程

<img src="img/flow%20chart.png" alt="部署流程图">

图 2 部署流程
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "img").mkdir(parents=True)
    (root / "guide.md").write_text(GUIDE, encoding="utf-8")
    (root / "img" / "revenue.png").write_bytes(png((120, 80), (220, 20, 60)))
    (root / "img" / "flow chart.png").write_bytes(png((64, 48), (0, 71, 171)))
    (root / "photos").mkdir()
    (root / "photos" / "team.jpg").write_bytes(png((90, 60), (80, 200, 120), "JPEG"))
    (tmp_path / "outside.png").write_bytes(png((40, 40), (255, 191, 0)))
    return root


def run(db, root: Path, embedder, captioner=None, kb: str = "docs", **kw):
    return ingest(db, db.info.dsn, root, kb, SPEC, embedder, IngestOptions(**kw), captioner=captioner)


def image_chunks(db, kb: str = "docs") -> dict[str, tuple]:
    """metadata image -> (doc_key, content, heading_path, metadata) of the image chunks of kb."""
    rows = db.execute(
        "select d.doc_key, c.content, c.heading_path, c.metadata from kb.chunks c"
        " join kb.documents d on d.id = c.document_id join kb.knowledge_bases k on k.id = c.kb_id"
        " where c.chunk_type = 'image' and k.name = %s order by c.id",
        [kb],
    ).fetchall()
    return {r[3]["image"]: r for r in rows}


def search(db, embedder, query: str, kb: str = "docs") -> list[tuple]:
    vector = Vector(embedder.embed([f"query: {query}"])[0])
    return db.execute(
        "select doc_key, chunk_type, metadata, content, vector_rank, lexical_rank, fuzzy_rank"
        " from kb.hybrid_search(%s, 5, kb => %s, query_embedding => %s)",
        [query, kb, vector],
    ).fetchall()


def failures(db, kb: str = "docs") -> dict[str, str]:
    return dict(db.execute("select doc_key, error from kb.list_ingest_failures(%s)", [kb]).fetchall())


# ------------------------------------------------------------------------------ end to end


def test_markdown_images_and_image_files_are_captioned_and_searchable(db, folder, embedder, fake_vision):
    vision = fake_vision()
    summary = run(db, folder, embedder, vision.captioner())
    assert (summary.added, summary.failed, summary.failures) == (2, 0, [])  # guide.md and photos/team.jpg
    # the two local references and the image file; remote and out-of-folder references were never read
    assert sorted(size for _, size, _ in vision.images) == [(64, 48), (90, 60), (120, 80)]
    assert [m for m, _, _ in vision.images].count("image/jpeg") == 1
    request = vision.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["model"] == "fake-vl"
    assert request["auth"] == "Bearer sekrit"
    prompt = request["messages"][0]["content"][0]["text"]
    assert "图表" in prompt  # a Chinese document gets the Chinese prompt
    images = summary.images
    assert (images.captioned, images.cached, images.uncaptioned, images.caption_failed, images.failed) == (
        3,
        0,
        0,
        0,
        0,
    )
    assert summary.vision_calls == 3

    chunks = image_chunks(db)
    assert set(chunks) == {"img/revenue.png", "img/flow chart.png", "photos/team.jpg"}
    doc_key, content, path, meta = chunks["img/revenue.png"]
    assert doc_key == "guide.md" and path == ["季度报告", "收入趋势"]
    assert content.split("\n\n") == [
        "crimson chart, 120x80 pixels",
        "季度收入柱状图",
        "2024 年各季度收入",
        "图片：img/revenue.png",
    ]
    assert meta["captioned"] is True and meta["caption_model"] == "fake-vl" and meta["alt"] == "季度收入柱状图"
    assert (meta["width"], meta["height"], meta["image_format"]) == (120, 80, "png")
    _, flow, flow_path, _ = chunks["img/flow chart.png"]
    assert flow_path == ["季度报告", "部署流程"] and "cobalt chart" in flow and "图 2 部署流程" in flow
    # a referenced image file is part of its document, not a document of its own
    keys = [r[0] for r in db.execute("select doc_key from kb.list_documents('docs')")]
    assert keys == ["guide.md", "photos/team.jpg"]

    top = search(db, embedder, "crimson chart")[0]
    assert (top[0], top[1], top[2]["image"]) == ("guide.md", "image", "img/revenue.png")
    assert None not in top[4:6]  # the vector and BM25 legs found it
    rows = search(db, embedder, "crimsn chart")  # and the fuzzy leg, through a correction
    assert [r[6] for r in rows if r[2].get("image") == "img/revenue.png"] == [1], rows
    assert search(db, embedder, "emerald")[0][2]["image"] == "photos/team.jpg"


def test_an_image_file_linked_from_outside_is_refused_and_never_captioned(db, folder, embedder, fake_vision):
    """link.png -> ../outside.png: like the Markdown reference to it, the image file is not read, so it never
    reaches the vision endpoint; it is a recorded failure."""
    (folder / "link.png").symlink_to(Path("..") / "outside.png")
    vision = fake_vision()
    summary = run(db, folder, embedder, vision.captioner())
    refused = "a symlink that resolves outside the ingested folder: not read"
    assert (summary.added, summary.failed, summary.failures) == (2, 1, [{"doc_key": "link.png", "error": refused}])
    assert (40, 40) not in [size for _, size, _ in vision.images]
    assert failures(db) == {"link.png": refused}
    assert db.execute("select count(*) from kb.documents where doc_key = 'link.png'").fetchone()[0] == 0


def test_reingest_calls_the_vision_endpoint_zero_times(db, folder, embedder, fake_vision):
    vision = fake_vision()
    run(db, folder, embedder, vision.captioner())
    calls = len(vision.requests)
    again = run(db, folder, embedder, vision.captioner())
    assert (again.unchanged, again.added, again.changed, again.vision_calls) == (2, 0, 0, 0)
    # an edited document is indexed again; its unchanged images' captions come from the cache
    (folder / "guide.md").write_text(GUIDE + "\n新增一段说明。\n", encoding="utf-8")
    edited = run(db, folder, embedder, vision.captioner())
    assert (edited.changed, edited.images.captioned, edited.images.cached, edited.vision_calls) == (1, 2, 2, 0)
    assert len(vision.requests) == calls
    # a changed image file changes its document (the hash covers the images it references)
    (folder / "img" / "revenue.png").write_bytes(png((120, 80), (255, 191, 0)))
    changed = run(db, folder, embedder, vision.captioner())
    assert (changed.changed, changed.vision_calls) == (1, 1)
    assert image_chunks(db)["img/revenue.png"][1].startswith("amber chart, 120x80 pixels")


def test_the_cache_belongs_to_one_knowledge_base(db, folder, embedder, fake_vision):
    vision = fake_vision()
    run(db, folder, embedder, vision.captioner())
    assert run(db, folder, embedder, vision.captioner(), kb="other").vision_calls == 3
    assert db.execute(
        "select count(*), count(distinct kb_id), count(distinct image_sha256) from kb.image_captions"
    ).fetchone() == (6, 2, 3)
    # images no chunk shows any more leave the cache at the next full run
    (folder / "photos" / "team.jpg").unlink()
    run(db, folder, embedder, vision.captioner())
    left = db.execute(
        "select count(*) from kb.image_captions c join kb.knowledge_bases k on k.id = c.kb_id where k.name = 'docs'"
    ).fetchone()[0]
    assert left == 2


def make_pdf() -> bytes:
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    out = io.BytesIO()
    pdf = canvas.Canvas(out)
    pdf.drawString(72, 750, "Annual report: the company grew in every region.")
    pdf.showPage()
    pdf.drawString(72, 750, "Sales by quarter are shown below.")
    pdf.drawImage(ImageReader(io.BytesIO(png((160, 100), (220, 20, 60)))), 72, 500, 160, 100)
    pdf.drawString(72, 480, "Figure 1: Quarterly sales")
    pdf.drawImage(ImageReader(io.BytesIO(png((8, 8), (0, 71, 171)))), 300, 500, 8, 8)  # a bullet: skipped
    pdf.showPage()
    pdf.save()
    return out.getvalue()


def test_pdf_image_chunk_carries_its_page_and_is_found(db, tmp_path, embedder, fake_vision):
    root = tmp_path / "pdfs"
    root.mkdir()
    (root / "report.pdf").write_bytes(make_pdf())
    vision = fake_vision()
    summary = run(db, root, embedder, vision.captioner())
    assert (summary.added, summary.failed, summary.images.captioned, summary.images.skipped) == (1, 0, 1, 1)
    assert [size for _, size, _ in vision.images] == [(160, 100)]
    [(doc_key, content, _, meta)] = image_chunks(db).values()
    k = meta["image"].removeprefix("report.pdf#page-2-")  # pypdf's order of the page's two images
    assert doc_key == "report.pdf" and meta["page"] == 2 and k in ("1", "2")
    assert content.split("\n\n") == [
        "crimson chart, 160x100 pixels",
        "Figure 1: Quarterly sales",
        f"Image: report.pdf, page 2, image {k}",
    ]
    top = search(db, embedder, "crimson chart")[0]
    assert (top[0], top[1], top[2]["page"]) == ("report.pdf", "image", 2)
    # the page text is there too, per page as before
    pages = db.execute("select metadata ->> 'page' from kb.chunks where chunk_type = 'text' order by id").fetchall()
    assert pages == [("1",), ("2",)]
    assert run(db, root, embedder, vision.captioner()).vision_calls == 0


def test_a_corrupt_image_is_a_failure_of_that_image_not_of_the_document(db, folder, embedder, fake_vision):
    good = (folder / "img" / "revenue.png").read_bytes()
    (folder / "img" / "revenue.png").write_bytes(good[: len(good) // 2])  # truncated
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")  # an image file of its own
    vision = fake_vision()
    summary = run(db, folder, embedder, vision.captioner())
    assert summary.added == 2 and summary.failed == 1  # broken.png is a document: failed; guide.md went in
    assert summary.images.failed == 2 and summary.images.captioned == 2
    recorded = failures(db)
    assert set(recorded) == {"guide.md#img/img/revenue.png", "broken.png"}
    assert recorded["guide.md#img/img/revenue.png"].startswith("image img/revenue.png: corrupt image")
    text = " ".join(r[0] for r in db.execute("select content from kb.chunks where chunk_type = 'text'"))
    assert "本文介绍销售数据" in text
    # the bad image's alt text still goes in, uncaptioned
    _, content, _, meta = image_chunks(db)["img/revenue.png"]
    assert meta["captioned"] is False and "季度收入柱状图" in content and "image_sha256" not in meta
    # once the image is fixed, its document is taken again and the failure goes
    (folder / "img" / "revenue.png").write_bytes(good)
    fixed = run(db, folder, embedder, vision.captioner())
    assert (fixed.changed, fixed.images.failed) == (1, 1)  # broken.png is still broken
    assert set(failures(db)) == {"broken.png"}
    assert image_chunks(db)["img/revenue.png"][3]["captioned"] is True


def test_without_a_vision_endpoint_alt_text_is_searchable(db, folder, embedder, fake_vision):
    summary = run(db, folder, embedder)
    assert (summary.images.uncaptioned, summary.images.captioned, summary.vision_calls) == (3, 0, 0)
    _, content, _, meta = image_chunks(db)["img/revenue.png"]
    assert meta == {
        **meta,
        "captioned": False,
        "caption_model": None,
        "image": "img/revenue.png",
    }
    hits = search(db, embedder, "季度收入柱状图")
    assert (hits[0][1], hits[0][2]["image"]) == ("image", "img/revenue.png")
    team = image_chunks(db)["photos/team.jpg"][1]
    assert team == "Image: photos/team.jpg"
    lexical = db.execute("select doc_key, chunk_type from kb.lexical_search('team.jpg', 3, kb => 'docs')").fetchall()
    assert lexical[0] == ("photos/team.jpg", "image")
    # configuring an endpoint later captions the images of the next run
    vision = fake_vision()
    later = run(db, folder, embedder, vision.captioner())
    assert (later.changed, later.images.captioned, later.vision_calls) == (2, 3, 3)


def test_vision_endpoint_errors_cost_only_the_caption(db, folder, embedder, fake_vision):
    failing = fake_vision(statuses=[500] * 100)
    summary = run(db, folder, embedder, failing.captioner(retries=1))
    assert (summary.added, summary.failed, summary.stopped) == (2, 0, None)
    assert (summary.images.caption_failed, summary.images.captioned) == (3, 0)
    assert failures(db) == {}  # not a recorded failure: the next run tries again
    assert all(meta["captioned"] is False for *_, meta in image_chunks(db).values())
    # two requests (one retry) per image until three images in a row failed: then no more calls
    assert len(failing.requests) == 6 and summary.vision_down and "looks down" in summary.vision_down
    healthy = fake_vision()
    again = run(db, folder, embedder, healthy.captioner())
    assert (again.changed, again.images.captioned, again.vision_calls) == (2, 3, 3)


def test_a_hung_vision_endpoint_times_out_and_the_run_goes_on(db, folder, embedder, fake_vision):
    hung = fake_vision(stall=True)
    summary = run(db, folder, embedder, hung.captioner(timeout=0.3, retries=0))
    assert (summary.added, summary.images.caption_failed, summary.vision_calls) == (2, 3, 3)
    assert "unreachable" in summary.vision_down or "timed out" in summary.vision_down


def test_cli_json_summary_counts_images(db, folder, fake_vision):
    (folder / "broken.md").write_text("![坏图](img/broken.png)\n\n正文还在。\n", encoding="utf-8")
    (folder / "img" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\ngarbage")
    vision = fake_vision()
    env = dict(os.environ, PGKB_DATABASE_URL=db.info.dsn, PGKB_VISION_URL=vision.url, PGKB_VISION_MODEL="fake-vl")
    cli = [sys.executable, "-m", "pgkb.cli", "ingest", str(folder), "--kb", "docs", "--json", "--defer-embedding"]
    result = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr  # a bad image is listed, not a failed run
    summary = json.loads(result.stdout)
    assert summary["added"] == 3 and summary["failed"] == 0 and summary["vision_calls"] == 3
    assert summary["images"] == {
        "captioned": 3,
        "cached": 0,
        "uncaptioned": 0,
        "caption_failed": 0,
        "failed": 1,
        "skipped": 0,
    }
    assert [f["doc_key"] for f in summary["failures"]] == ["broken.md#img/img/broken.png"]
    again = json.loads(subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120).stdout)
    assert (again["unchanged"], again["vision_calls"]) == (3, 0)
    assert len(vision.requests) == 3
    plain = subprocess.run(cli[:-2], env=env, capture_output=True, text=True, timeout=120)
    assert "images:" not in plain.stdout  # nothing indexed this time: no image counts to show
    (folder / "guide.md").write_text(GUIDE + "\n补充。\n", encoding="utf-8")
    plain = subprocess.run(cli[:-2] + ["--defer-embedding"], env=env, capture_output=True, text=True, timeout=120)
    assert "images: 2 captioned (2 from the cache, 0 vision calls)" in plain.stdout, plain.stdout


# ------------------------------------------------------------------------------ units


def test_image_checks(tmp_path):
    ok = check_image(png((50, 40), (220, 20, 60)))
    assert (ok.format, ok.width, ok.height, ok.small) == ("PNG", 50, 40, False)
    assert ok.for_vision() == (ok.data, "image/png")
    webp = check_image(png((3000, 20), (0, 71, 171), "WEBP"))
    data, mime = webp.for_vision()  # converted and scaled for the endpoint
    assert mime == "image/png" and Image.open(io.BytesIO(data)).width == 2048
    assert check_image(png((10, 10), (0, 0, 0))).small
    with pytest.raises(ImageRejected, match="megapixels"):
        out = io.BytesIO()
        Image.new("1", (8000, 6000)).save(out, "PNG")  # 48 megapixels, a few kB
        check_image(out.getvalue())
    with pytest.raises(ImageRejected, match="limit is 20 MB"):
        check_image(b"\x89PNG\r\n\x1a\n" + bytes(check.MAX_IMAGE_BYTES))
    with pytest.raises(ImageRejected, match="accepted format"):
        check_image(png((10, 10), (0, 0, 0), "BMP"))
    with pytest.raises(ImageRejected, match="accepted format"):
        check_image(b"<svg xmlns='http://www.w3.org/2000/svg'/>")
    good = png((200, 200), (220, 20, 60))
    with pytest.raises(ImageRejected):
        check_image(good[:-40])  # truncated


def test_references_stay_inside_the_folder(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "img").mkdir(parents=True)
    (root / "a" / "img" / "x.png").write_bytes(b"x")
    (root / "a" / "图 1.png").write_bytes(b"y")
    (tmp_path / "secret.png").write_bytes(b"s")
    (root / "a" / "link.png").symlink_to(tmp_path / "secret.png")
    doc = chunk_markdown(
        "![a](img/x.png) ![b](http://x/y.png) ![c](data:image/png;base64,AAAA) ![d](/abs.png) "
        "![e](../../secret.png) ![f](link.png) ![g](%E5%9B%BE%201.png) ![h](<图 1.png>) ![i](missing.png) "
        "![j](diagram.svg) ![k](img/x.png#frag)",
        "doc.md",
    )
    found = {(i.rel, i.error) for i in resolve_references(root, root / "a" / "doc.md", doc.images)}
    assert found == {
        ("a/img/x.png", ""),
        ("a/图 1.png", ""),
        ("a/missing.png", "image file not found"),
        ("a/diagram.svg", "unsupported image type '.svg' (supported: png, jpg, jpeg, webp, gif)"),
    }


def test_image_file_chunker_and_pdf_images_only_on_request():
    doc = chunk_bytes(png((5, 5), (0, 0, 0)), "x.png", images=True)
    assert (doc.source_type, doc.chunks, doc.images[0].source) == ("image", [], "x.png")
    with pytest.raises(Exception, match="unsupported file type"):
        chunk_bytes(b"x", "x.png")
    pdf = make_pdf()
    assert chunk_bytes(pdf, "r.pdf").images == []
    refs = chunk_bytes(pdf, "r.pdf", images=True).images
    # one "Figure" line for two images: both get it
    assert [(r.source, r.page, r.caption, r.error) for r in refs] == [
        ("page-2-1", 2, "Figure 1: Quarterly sales", ""),
        ("page-2-2", 2, "Figure 1: Quarterly sales", ""),
    ]


def test_vision_client(fake_vision):
    assert chat_completions_url("https://h/compatible-mode/v1/") == "https://h/compatible-mode/v1/chat/completions"
    assert chat_completions_url("http://h:11434/v1/chat/completions") == "http://h:11434/v1/chat/completions"
    with pytest.raises(VisionError, match="http"):
        chat_completions_url("ftp://h")
    vision = fake_vision(statuses=[400])
    with pytest.raises(VisionError, match="HTTP 400"):  # a refused request is not retried
        vision.captioner(retries=3).caption(png((40, 40), (220, 20, 60)), "image/png")
    assert len(vision.requests) == 1
    assert vision.captioner().caption(png((40, 40), (220, 20, 60)), "image/png", "en") == "crimson chart, 40x40 pixels"
    assert vision.requests[-1]["messages"][0]["content"][0]["text"].startswith("Describe this image")


def test_vision_settings(monkeypatch):
    for name in ("PGKB_VISION_URL", "PGKB_VISION_MODEL", "PGKB_VISION_API_KEY", "PGKB_VISION_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings.from_env()
    assert (settings.vision_url, settings.vision_model, load_captioner(settings)) == (None, "qwen-vl-max", None)
    monkeypatch.setenv("PGKB_VISION_URL", "https://dashscope.example/compatible-mode/v1")
    monkeypatch.setenv("PGKB_VISION_MODEL", "qwen-vl-plus")
    monkeypatch.setenv("PGKB_VISION_TIMEOUT", "12.5")
    captioner = load_captioner(Settings.from_env())
    assert (captioner.url, captioner.model, captioner.timeout) == (
        "https://dashscope.example/compatible-mode/v1/chat/completions",
        "qwen-vl-plus",
        12.5,
    )
    monkeypatch.setenv("PGKB_VISION_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="PGKB_VISION_TIMEOUT"):
        Settings.from_env()
    monkeypatch.setenv("PGKB_VISION_TIMEOUT", "5")
    monkeypatch.setenv("PGKB_VISION_URL", "dashscope")
    with pytest.raises(ConfigError, match="PGKB_VISION_URL"):
        Settings.from_env()


def test_chunk_type_image_is_accepted_and_old_types_stay_valid(db):
    for chunk_type in ("image", "image_caption", "text"):
        db.execute(
            "select * from kb.replace_document('t', %s, 't', %s::jsonb)",
            [f"{chunk_type}.md", json.dumps([{"content": "x", "chunk_type": chunk_type}])],
        )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"unknown chunk_type \"picture\".*image,"):
        db.execute(
            "select * from kb.replace_document('t', 'p.md', 't', %s::jsonb)",
            [json.dumps([{"content": "x", "chunk_type": "picture"}])],
        )


def test_cache_functions_check_their_input(db):
    db.execute("select kb.create_knowledge_base('t')")
    sha = "a" * 64
    db.execute("select kb.store_image_caption('t', %s, 'm', 'zh', 'caption one')", [sha])
    db.execute("select kb.store_image_caption('t', %s, 'm', 'zh', 'caption two')", [sha])  # replaces
    assert db.execute("select * from kb.cached_image_captions('t', 'm', 'zh', %s)", [[sha, "b" * 64]]).fetchall() == [
        (sha, "caption two")
    ]
    assert db.execute("select * from kb.cached_image_captions('t', 'm', 'en', %s)", [[sha]]).fetchall() == []
    for args, message in [
        (("t", "ABC", "m", "zh", "c"), "image_sha256"),
        (("t", sha, " ", "zh", "c"), "model"),
        (("t", sha, "m", "Chinese", "c"), "language"),
        (("t", sha, "m", "zh", "\u200b"), "caption"),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            db.execute("select kb.store_image_caption(%s, %s, %s, %s, %s)", list(args))
    with pytest.raises(psycopg.errors.NoDataFound):
        db.execute("select kb.store_image_caption('nope', %s, 'm', 'zh', 'c')", [sha])
    assert db.execute("select count(*) from kb.image_captions").fetchone()[0] == 1
