"""Retrieval quality tooling, not product: `pgkb eval` (``evaluate``: load a judged dataset -- ``datasets``:
BEIR sets or labelled document questions -- through the ingest engine, run every search mode and score it
with ``metrics``: Recall/MRR/nDCG) and `pgkb sweep` (``sweep``: a grid of search settings over several
loaded sets)."""
