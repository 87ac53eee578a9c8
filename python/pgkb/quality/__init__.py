"""Retrieval quality tooling, not product: `pgkb eval` (``evaluate``: load a BEIR set or labelled document
questions, run every search mode, Recall/MRR/nDCG) and `pgkb sweep` (``sweep``: a grid of search settings
over several loaded sets)."""
