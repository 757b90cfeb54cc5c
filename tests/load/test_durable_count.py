"""bench_ingest's DurableCount: the spans a phase stored, counted as it goes without reading every row of
the phase each time, and still exact while transactions that hold ids below the newest rows are open."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from bench.bench_ingest import DurableCount

TABLE = "bench_durable_count_probe"


@pytest.fixture
def conninfo(transactional_db: None) -> Iterator[str]:
    settings = connection.settings_dict
    info = psycopg.conninfo.make_conninfo(
        host=settings["HOST"], port=settings["PORT"] or None, user=settings["USER"], dbname=settings["NAME"]
    )
    with psycopg.connect(info, autocommit=True) as setup:
        setup.execute(f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, note text)")
        setup.execute(f"INSERT INTO {TABLE} (note) SELECT 'before the phase' FROM generate_series(1, 5)")
    yield info
    with psycopg.connect(info, autocommit=True) as teardown:
        teardown.execute(f"DROP TABLE {TABLE}")


def _highest(reader: psycopg.Connection) -> int:
    row = reader.execute(f"SELECT max(id) FROM {TABLE}").fetchone()
    assert row is not None
    return int(row[0])


def _rows_insert(writer: psycopg.Connection, count: int) -> None:
    writer.execute(f"INSERT INTO {TABLE} (note) SELECT 'phase' FROM generate_series(1, %s)", [count])


def test_a_count_settles_no_ids_an_open_transaction_holds(conninfo):
    with psycopg.connect(conninfo, autocommit=True) as writer, psycopg.connect(conninfo) as slow:
        mark = _highest(writer)
        count = DurableCount(conninfo, TABLE, mark)
        assert count() == 0

        _rows_insert(slow, 1)  # takes the next id and holds it, uncommitted
        _rows_insert(writer, 10)
        assert count() == 10
        assert count() == 10
        # The slow transaction held its id at both counts: nothing below the newest rows is settled yet.
        assert (count.floor, count.settled) == (mark, 0)

        slow.commit()
        assert count() == 11  # the row below the others, seen once its transaction committed
        _rows_insert(writer, 7)
        assert count() == 18
        # Settled past the slow transaction's id.
        assert count.floor > mark + 1
        assert count.settled >= 11

        _rows_insert(slow, 3)
        slow.rollback()  # ids taken and never stored
        _rows_insert(writer, 2)
        assert count() == 20
        assert count() == 20
        assert count.verified() == (20, 20)


def test_each_count_reads_only_the_rows_above_its_floor(conninfo):
    with psycopg.connect(conninfo, autocommit=True) as writer:
        mark = _highest(writer)
        count = DurableCount(conninfo, TABLE, mark)
        totals = []
        for _ in range(4):
            _rows_insert(writer, 100)
            totals.append(count())
        assert totals == [100, 200, 300, 400]
        # Settled up to the highest id of the count before last: the last count read only the newest rows.
        assert (count.settled, count.floor) == (300, mark + 300)
        assert count.verified() == (400, 400)
