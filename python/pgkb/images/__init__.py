"""Images and charts made searchable: each image becomes a chunk of type ``image`` at ingest.

Which images: those a Markdown document references with a local relative path inside the ingested folder
(``![alt](img/x.png "title")``, ``<img src>``; remote URLs, data: URLs, absolute paths and paths out of the
folder are left alone), image files found by ``pgkb ingest`` (png, jpg/jpeg, webp, gif; an image file a
Markdown document references is indexed with that document, not again on its own), and the images inside
PDF pages (pypdf ``page.images``, with their 1-based page).

What a chunk holds: the vision model's caption (when a vision endpoint is configured, pgkb.models.vision),
the alt text, the figure caption (title attribute, ``<figcaption>``, a "图 1 …" / "Figure 1: …" line) and
the image's path, under the heading path around the reference; so the vector, BM25 and fuzzy legs all
find it. Metadata: ``image`` (root-relative path, or ``doc.pdf#page-N-K``), ``page`` (PDFs),
``captioned``, ``caption_model``, ``alt``, ``image_sha256``, ``image_format``, ``width``, ``height``.

Captions are cached per knowledge base by image SHA-256, model and language (kb.image_captions, reached
only by writers of that knowledge base): unchanged images cost no vision call when re-ingested. A bad
image (corrupt, over 20 MB or 40 megapixels, another format) is an ingest failure of that image
(``doc.md#img/PATH``, ``doc.pdf#page-N-K``), never of its document. A failing vision endpoint costs only
the caption (the image is indexed without it, and the document is taken again next run).

Modules: ``check`` (validating and preparing image bytes, Pillow), ``captions`` (cache, then endpoint),
``index`` (a document's images as chunks).
"""
