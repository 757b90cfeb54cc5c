"""Span rows up to 8,160 bytes stay whole in the table, uncompressed.

A span of an agent that sends message content is 1.5-5 kB, past PostgreSQL's default of about 2 kB from
which it compresses a row's long values (pglz: the embedded server has no lz4). Compressing was most of
PostgreSQL's work per stored span: measured on 2026-11-27 with COPY of the ingest benchmark's spans (500
per transaction, 20,000 per run, 3 runs), the server spent 37-41 µs of CPU per span with it and 15-19 µs
without, and the table took 1.9 times the space."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tracing", "0014_view_document_api_keys"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE tracing_span SET (toast_tuple_target = 8160)",
            "ALTER TABLE tracing_span RESET (toast_tuple_target)",
        )
    ]
