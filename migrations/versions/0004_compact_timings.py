"""compact autotune timings: strings once per key, timestamps once per run

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23

The table ``autotune_timings`` held every timing with its op, inputs, precision and timestamp
repeated on every row and again in its lookup index (about 600 bytes a timing; Inductor's JSON
document spends about 130). It becomes three tables and a view of the old name:

- ``autotune_keys``: one ``cache[op][inputs][precision]`` of one fingerprint (the strings);
- ``autotune_runs``: one benchmark of a key's choices (``recorded_at``);
- ``autotune_run_timings``: ``(run, choice_hash, timing_ms, position)``, ids kept;
- view ``autotune_timings``: the timings flat, the old table's columns and ids, so SQL written
  against revisions 0001-0003 reads the same rows.

Data-preserving: every timing is moved, history included (timings of one key recorded at the
same instant form one run). The views of 0001 are recreated with their SQL unchanged. The
downgrade rebuilds the flat table from the view.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: The flat view (revision 0004).
TIMINGS_VIEW = """
SELECT t.id AS id, k.fingerprint_id AS fingerprint_id, k.op AS op, k.inputs AS inputs,
       k.hint_override AS hint_override, k.precision AS precision, t.choice_hash AS choice_hash,
       t.timing_ms AS timing_ms, t.position AS position, r.recorded_at AS recorded_at
FROM autotune_run_timings t
JOIN autotune_runs r ON r.id = t.run_id
JOIN autotune_keys k ON k.id = r.key_id
"""

# The tuning-history views of 0001, frozen as written there (they read ``autotune_timings``,
# table or view); created in this order, dropped in reverse.
HISTORY_VIEWS: dict[str, str] = {
    "autotune_current": """
        SELECT fingerprint_id, op, inputs, hint_override, precision, choice_hash,
               timing_ms, recorded_at
        FROM (
            SELECT t.*, ROW_NUMBER() OVER (
                PARTITION BY fingerprint_id, op, inputs, hint_override, precision, choice_hash
                ORDER BY recorded_at DESC, id DESC) AS rn
            FROM autotune_timings t
        ) latest
        WHERE rn = 1
    """,
    "autotune_winners": """
        SELECT w.fingerprint_id, f.system_hash, f.device_name, f.torch_version, f.cpu_model,
               w.op, w.inputs, w.hint_override, w.precision, w.choice_hash, w.timing_ms,
               w.candidates, w.recorded_at
        FROM (
            SELECT c.*,
                   ROW_NUMBER() OVER (
                       PARTITION BY fingerprint_id, op, inputs, hint_override, precision
                       ORDER BY timing_ms ASC, choice_hash ASC) AS rank,
                   COUNT(*) OVER (
                       PARTITION BY fingerprint_id, op, inputs, hint_override, precision
                   ) AS candidates
            FROM autotune_current c
        ) w
        JOIN system_fingerprints f ON f.id = w.fingerprint_id
        WHERE w.rank = 1
    """,
    "autotune_history": """
        SELECT t.id, t.op, t.inputs, t.hint_override, t.precision, t.choice_hash, t.timing_ms,
               t.recorded_at, f.system_hash, f.device_name, f.cuda_version, f.hip_version,
               f.triton_key, f.torch_version, f.torch_key, f.cpu_model, f.isa
        FROM autotune_timings t
        JOIN system_fingerprints f ON f.id = t.fingerprint_id
    """,
}


def _same(a: str, b: str) -> str:
    """NULL-safe equality of two columns."""
    if op.get_bind().dialect.name == "postgresql":
        return f"{a} IS NOT DISTINCT FROM {b}"
    return f"{a} IS {b}"


def _reset_sequence(table: str) -> None:
    """PostgreSQL: the id sequence continues after the ids copied in."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
            f"(SELECT COALESCE(MAX(id), 0) + 1 FROM {table}), false)"
        )


def _drop_history_views() -> None:
    for name in reversed(list(HISTORY_VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")


def _create_history_views() -> None:
    for name, sql in HISTORY_VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql.strip()}")


def upgrade() -> None:
    _drop_history_views()
    op.create_table(
        "autotune_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_id", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=256), nullable=False),
        sa.Column("inputs", sa.Text(), nullable=False),
        sa.Column("hint_override", sa.BigInteger(), nullable=True),
        sa.Column("precision", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["fingerprint_id"], ["system_fingerprints.id"],
            name=op.f("fk_autotune_keys_fingerprint_id_system_fingerprints"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_keys")),
    )
    op.create_index("ix_autotune_keys_lookup", "autotune_keys", ["fingerprint_id", "op", "inputs", "precision"])
    op.create_table(
        "autotune_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"], ["autotune_keys.id"], name=op.f("fk_autotune_runs_key_id_autotune_keys"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_runs")),
    )
    op.create_index("ix_autotune_runs_key_id", "autotune_runs", ["key_id", "recorded_at"])
    op.create_table(
        "autotune_run_timings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("choice_hash", sa.Text(), nullable=False),
        sa.Column("timing_ms", sa.Float(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["autotune_runs.id"], name=op.f("fk_autotune_run_timings_run_id_autotune_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_run_timings")),
    )
    op.create_index("ix_autotune_run_timings_run_id", "autotune_run_timings", ["run_id"])
    op.create_index(op.f("ix_autotune_run_timings_position"), "autotune_run_timings", ["position"])

    # The data, in the old ids' order.
    op.execute(
        "INSERT INTO autotune_keys (fingerprint_id, op, inputs, hint_override, precision) "
        "SELECT fingerprint_id, op, inputs, hint_override, precision FROM autotune_timings "
        "GROUP BY fingerprint_id, op, inputs, hint_override, precision ORDER BY MIN(id)"
    )
    key_of_t = (
        "JOIN autotune_keys k ON k.fingerprint_id = t.fingerprint_id AND k.op = t.op AND k.inputs = t.inputs "
        f"AND k.precision = t.precision AND {_same('k.hint_override', 't.hint_override')}"
    )
    op.execute(
        "INSERT INTO autotune_runs (key_id, recorded_at) "
        f"SELECT k.id, t.recorded_at FROM autotune_timings t {key_of_t} "
        "GROUP BY k.id, t.recorded_at ORDER BY MIN(t.id)"
    )
    op.execute(
        "INSERT INTO autotune_run_timings (id, run_id, choice_hash, timing_ms, position) "
        f"SELECT t.id, r.id, t.choice_hash, t.timing_ms, t.position FROM autotune_timings t {key_of_t} "
        "JOIN autotune_runs r ON r.key_id = k.id AND r.recorded_at = t.recorded_at ORDER BY t.id"
    )
    _reset_sequence("autotune_run_timings")
    op.drop_table("autotune_timings")
    op.execute(f"CREATE VIEW autotune_timings AS {TIMINGS_VIEW.strip()}")
    _create_history_views()


def downgrade() -> None:
    _drop_history_views()
    op.create_table(
        "autotune_timings_flat",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_id", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=256), nullable=False),
        sa.Column("inputs", sa.Text(), nullable=False),
        sa.Column("hint_override", sa.BigInteger(), nullable=True),
        sa.Column("precision", sa.String(length=16), nullable=False),
        sa.Column("choice_hash", sa.Text(), nullable=False),
        sa.Column("timing_ms", sa.Float(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["fingerprint_id"], ["system_fingerprints.id"],
            name=op.f("fk_autotune_timings_fingerprint_id_system_fingerprints"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotune_timings")),
    )
    op.execute(
        "INSERT INTO autotune_timings_flat (id, fingerprint_id, op, inputs, hint_override, precision, "
        "choice_hash, timing_ms, position, recorded_at) SELECT id, fingerprint_id, op, inputs, hint_override, "
        "precision, choice_hash, timing_ms, position, recorded_at FROM autotune_timings ORDER BY id"
    )
    op.execute("DROP VIEW autotune_timings")
    op.drop_table("autotune_run_timings")
    op.drop_table("autotune_runs")
    op.drop_table("autotune_keys")
    op.rename_table("autotune_timings_flat", "autotune_timings")
    _reset_sequence("autotune_timings")
    op.create_index(
        "ix_autotune_timings_lookup", "autotune_timings",
        ["fingerprint_id", "op", "inputs", "precision", "choice_hash", "recorded_at"],
    )
    op.create_index(op.f("ix_autotune_timings_position"), "autotune_timings", ["position"])
    _create_history_views()
