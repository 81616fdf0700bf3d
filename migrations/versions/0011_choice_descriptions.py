"""choice descriptions: autotune_choices, and the tuning history in words

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30

- autotune_choices: what torch says of each autotune choice, keyed by its choice hash
  (``ChoiceCaller.hash_key()``, the key of ``cache[op][inputs][precision]`` the timings name):
  its ``name``, ``description`` and ``info_dict()`` (torch/_inductor/ir.py ``ChoiceCaller``,
  torch/_inductor/select_algorithm.py ``TritonTemplateCaller.info_dict``,
  ``ExternKernelCaller.info_dict``), the whole ``info_dict()`` as JSON and the fields people
  filter by as columns (``backend``, ``kernel_name``, ``tile_shape``, ``num_stages``,
  ``num_warps``, ``group_m``), when it was described and the writer's Ed25519 signature.
- The tuning-history views ``autotune_current``, ``autotune_winners`` and ``autotune_history``
  are created again with revision 0001's columns first, unchanged, and each choice's
  ``choice_name``, ``backend``, ``description``, ``kernel_name``, ``tile_shape``,
  ``num_stages``, ``num_warps`` and ``group_m`` after them (``NULL`` for a choice without a
  row: timings imported from Inductor's files); ``autotune_winners`` also gains the runner-up
  (``runner_up_choice_hash``, ``runner_up_name``, ``runner_up_ms``). ``autotune_timings``
  (revision 0009's) is left as it is.

Data-preserving: adds a table and widens three views. The downgrade restores revision 0004's
views (the SQL 0009 and 0010 kept) and drops the table.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: The choice's columns every tuning-history view shows after revision 0001's (``c``: its
#: ``autotune_choices`` row).
_CHOICE = """c.name AS choice_name, c.backend AS backend, c.description AS description,
       c.kernel_name AS kernel_name, c.tile_shape AS tile_shape, c.num_stages AS num_stages,
       c.num_warps AS num_warps, c.group_m AS group_m"""

_PER_KEY = "PARTITION BY fingerprint_id, op, inputs, hint_override, precision"
_FASTEST_FIRST = f"{_PER_KEY} ORDER BY timing_ms ASC, choice_hash ASC"

#: The tuning-history views of this revision, created in this order, dropped in reverse.
HISTORY_VIEWS: dict[str, str] = {
    "autotune_current": f"""
        SELECT latest.fingerprint_id AS fingerprint_id, latest.op AS op, latest.inputs AS inputs,
               latest.hint_override AS hint_override, latest.precision AS precision,
               latest.choice_hash AS choice_hash, latest.timing_ms AS timing_ms,
               latest.recorded_at AS recorded_at,
               {_CHOICE}
        FROM (
            SELECT t.*, ROW_NUMBER() OVER (
                PARTITION BY fingerprint_id, op, inputs, hint_override, precision, choice_hash
                ORDER BY recorded_at DESC, id DESC) AS rn
            FROM autotune_timings t
        ) latest
        LEFT JOIN autotune_choices c ON c.choice_hash = latest.choice_hash
        WHERE latest.rn = 1
    """,
    "autotune_winners": f"""
        SELECT w.fingerprint_id AS fingerprint_id, f.system_hash AS system_hash,
               f.device_name AS device_name, f.torch_version AS torch_version, f.cpu_model AS cpu_model,
               w.op AS op, w.inputs AS inputs, w.hint_override AS hint_override, w.precision AS precision,
               w.choice_hash AS choice_hash, w.timing_ms AS timing_ms, w.candidates AS candidates,
               w.recorded_at AS recorded_at,
               w.choice_name AS choice_name, w.backend AS backend, w.description AS description,
               w.kernel_name AS kernel_name, w.tile_shape AS tile_shape, w.num_stages AS num_stages,
               w.num_warps AS num_warps, w.group_m AS group_m,
               w.runner_up_choice_hash AS runner_up_choice_hash, r.name AS runner_up_name,
               w.runner_up_ms AS runner_up_ms
        FROM (
            SELECT cur.*,
                   ROW_NUMBER() OVER ({_FASTEST_FIRST}) AS rank,
                   COUNT(*) OVER ({_PER_KEY}) AS candidates,
                   LEAD(choice_hash) OVER ({_FASTEST_FIRST}) AS runner_up_choice_hash,
                   LEAD(timing_ms) OVER ({_FASTEST_FIRST}) AS runner_up_ms
            FROM autotune_current cur
        ) w
        JOIN system_fingerprints f ON f.id = w.fingerprint_id
        LEFT JOIN autotune_choices r ON r.choice_hash = w.runner_up_choice_hash
        WHERE w.rank = 1
    """,
    "autotune_history": f"""
        SELECT t.id AS id, t.op AS op, t.inputs AS inputs, t.hint_override AS hint_override,
               t.precision AS precision, t.choice_hash AS choice_hash, t.timing_ms AS timing_ms,
               t.recorded_at AS recorded_at, f.system_hash AS system_hash, f.device_name AS device_name,
               f.cuda_version AS cuda_version, f.hip_version AS hip_version, f.triton_key AS triton_key,
               f.torch_version AS torch_version, f.torch_key AS torch_key, f.cpu_model AS cpu_model,
               f.isa AS isa,
               {_CHOICE}
        FROM autotune_timings t
        JOIN system_fingerprints f ON f.id = t.fingerprint_id
        LEFT JOIN autotune_choices c ON c.choice_hash = t.choice_hash
    """,
}


def _revision_0004() -> ModuleType:
    """Revision 0004's module, for its frozen view SQL (``HISTORY_VIEWS``)."""
    path = Path(__file__).with_name("0004_compact_timings.py")
    spec = importlib.util.spec_from_file_location("cachedb_migration_0004", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recreate_views(views: dict[str, str]) -> None:
    for name in reversed(list(HISTORY_VIEWS)):  # the same three names in every revision
        op.execute(f"DROP VIEW IF EXISTS {name}")
    for name, sql in views.items():
        op.execute(f"CREATE VIEW {name} AS {sql.strip()}")


def upgrade() -> None:
    name = "autotune_choices"
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("choice_hash", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("backend", sa.Text(), nullable=True),
        sa.Column("kernel_name", sa.Text(), nullable=True),
        sa.Column("tile_shape", sa.Text(), nullable=True),
        sa.Column("num_stages", sa.Integer(), nullable=True),
        sa.Column("num_warps", sa.Integer(), nullable=True),
        sa.Column("group_m", sa.Integer(), nullable=True),
        sa.Column("info_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ed25519_signature", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{name}")),
        sa.UniqueConstraint("choice_hash", name=op.f(f"uq_{name}_choice_hash")),
    )
    _recreate_views(HISTORY_VIEWS)


def downgrade() -> None:
    _recreate_views(_revision_0004().HISTORY_VIEWS)
    op.drop_table("autotune_choices")
