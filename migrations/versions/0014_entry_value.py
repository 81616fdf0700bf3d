"""entry value: what each stored FX graph and AOTAutograd entry is worth

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

- view ``entry_value``: one row per stored variant of ``guarded_entries`` (``fxgraph`` and
  ``aotautograd``, the kinds torch records a compile time for): ``id``, ``kind``, ``key``,
  ``variant``, ``fingerprint_id``; ``compile_seconds`` (s), the compile time torch recorded
  (``_time_taken_ns``: FX graph ``CompiledFxGraph._time_taken_ns``, AOTAutograd its forward
  and backward compiles) over 10^9, ``NULL`` where torch recorded none; ``hits``, the serves
  of the variant (``hit_count``); ``seconds_saved`` (s) = compile seconds × hits, 0 where the
  compile time is unknown, so that ``SUM(seconds_saved)`` per kind and fingerprint is
  ``cachedb stats``' figure; ``size_bytes`` (the uncompressed payload) and ``stored_bytes``
  (the compressed frame the database holds, what ``cachedb prune --max-bytes`` counts);
  ``created_at`` and ``last_used_at``.

Best configs keep torch's tuning time (``best_configs.time_taken_ms``) but no hits, and
kernels and Dynamo's caches hits but no compile time: none of them is in the view.

Data-preserving: only adds a view; the downgrade drops it.
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

#: The views of this revision, created in this order, dropped in reverse. ``time_taken_ns``
#: is cast to a double first: a BIGINT divided on PostgreSQL would be NUMERIC.
VIEWS: dict[str, str] = {
    "entry_value": """
SELECT g.id AS id,
       g.kind AS kind,
       g.key AS key,
       g.variant AS variant,
       g.fingerprint_id AS fingerprint_id,
       CAST(g.time_taken_ns AS DOUBLE PRECISION) / 1000000000.0 AS compile_seconds,
       g.hit_count AS hits,
       CAST(COALESCE(g.time_taken_ns, 0) AS DOUBLE PRECISION) * g.hit_count / 1000000000.0 AS seconds_saved,
       g.size_bytes AS size_bytes,
       length(g.payload) AS stored_bytes,
       g.created_at AS created_at,
       g.last_used_at AS last_used_at
FROM guarded_entries g
""",
}


def upgrade() -> None:
    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql.strip()}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
