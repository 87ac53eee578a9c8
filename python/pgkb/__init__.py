"""pgkb: a private knowledge base inside PostgreSQL.

The pipeline, one module per step: config -> cluster (embedded PostgreSQL) -> migrate (schema + SQL API)
-> db (connections) -> cli.
"""

__version__ = "0.1.0"
