"""schema v1

Revision ID: 0001
Revises:
Create Date: 2026-11-21

The first schema: system fingerprints, guarded entries (FX graph and AOTAutograd), autotune
timings, LocalCache values, best configs, CUTLASS op lists and their ops, and the
tuning-history views. The views are frozen here as portable SQL (SQLite >= 3.25, PostgreSQL).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


# Created in this order, dropped in reverse (autotune_winners reads autotune_current).
VIEWS: dict[str, str] = {
    # The current timing of each choice: its latest benchmark.
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
    # The winning choice per (op, inputs, precision, fingerprint), among current timings.
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
    # Every benchmark with where and under which torch it ran: timings over time and versions.
    "autotune_history": """
        SELECT t.id, t.op, t.inputs, t.hint_override, t.precision, t.choice_hash, t.timing_ms,
               t.recorded_at, f.system_hash, f.device_name, f.cuda_version, f.hip_version,
               f.triton_key, f.torch_version, f.torch_key, f.cpu_model, f.isa
        FROM autotune_timings t
        JOIN system_fingerprints f ON f.id = t.fingerprint_id
    """,
}


def upgrade() -> None:
    op.create_table('cutlass_op_lists',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('request_key', sa.String(length=64), nullable=False),
    sa.Column('arch', sa.Integer(), nullable=True),
    sa.Column('cuda_version', sa.String(length=32), nullable=True),
    sa.Column('instantiation_level', sa.String(length=32), nullable=True),
    sa.Column('op_count', sa.Integer(), nullable=False),
    sa.Column('payload', sa.LargeBinary(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('checksum', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_cutlass_op_lists')),
    sa.UniqueConstraint('request_key', name=op.f('uq_cutlass_op_lists_request_key'))
    )
    op.create_table('system_fingerprints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('fingerprint_key', sa.String(length=64), nullable=False),
    sa.Column('system_hash', sa.String(length=64), nullable=False),
    sa.Column('system_json', sa.Text(), nullable=False),
    sa.Column('device_name', sa.String(length=256), nullable=True),
    sa.Column('triton_key', sa.String(length=256), nullable=True),
    sa.Column('cuda_version', sa.String(length=32), nullable=True),
    sa.Column('hip_version', sa.String(length=64), nullable=True),
    sa.Column('torch_version', sa.String(length=64), nullable=True),
    sa.Column('torch_key', sa.String(length=64), nullable=True),
    sa.Column('cpu_model', sa.String(length=256), nullable=True),
    sa.Column('isa', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_system_fingerprints')),
    sa.UniqueConstraint('fingerprint_key', name=op.f('uq_system_fingerprints_fingerprint_key'))
    )
    with op.batch_alter_table('system_fingerprints', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_system_fingerprints_system_hash'), ['system_hash'], unique=False)

    op.create_table('autotune_timings',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('fingerprint_id', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=256), nullable=False),
    sa.Column('inputs', sa.Text(), nullable=False),
    sa.Column('hint_override', sa.BigInteger(), nullable=True),
    sa.Column('precision', sa.String(length=16), nullable=False),
    sa.Column('choice_hash', sa.Text(), nullable=False),
    sa.Column('timing_ms', sa.Float(), nullable=False),
    sa.Column('position', sa.BigInteger(), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['fingerprint_id'], ['system_fingerprints.id'], name=op.f('fk_autotune_timings_fingerprint_id_system_fingerprints'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_autotune_timings'))
    )
    with op.batch_alter_table('autotune_timings', schema=None) as batch_op:
        batch_op.create_index('ix_autotune_timings_lookup', ['fingerprint_id', 'op', 'inputs', 'precision', 'choice_hash', 'recorded_at'], unique=False)

    op.create_table('best_configs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=256), nullable=False),
    sa.Column('content', sa.Text(), nullable=False),
    sa.Column('configs_hash', sa.String(length=64), nullable=True),
    sa.Column('num_warps', sa.Integer(), nullable=True),
    sa.Column('num_stages', sa.Integer(), nullable=True),
    sa.Column('found_by_coordesc', sa.Boolean(), nullable=True),
    sa.Column('time_taken_ms', sa.BigInteger(), nullable=True),
    sa.Column('triton_cache_hash', sa.String(length=128), nullable=True),
    sa.Column('kernel_kwargs', sa.Text(), nullable=True),
    sa.Column('fingerprint_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['fingerprint_id'], ['system_fingerprints.id'], name=op.f('fk_best_configs_fingerprint_id_system_fingerprints'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_best_configs')),
    sa.UniqueConstraint('key', name=op.f('uq_best_configs_key'))
    )
    with op.batch_alter_table('best_configs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_best_configs_configs_hash'), ['configs_hash'], unique=False)

    op.create_table('cutlass_ops',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('op_list_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('gemm_kind', sa.String(length=64), nullable=True),
    sa.Column('arch', sa.Integer(), nullable=True),
    sa.Column('element_a', sa.String(length=32), nullable=True),
    sa.Column('element_b', sa.String(length=32), nullable=True),
    sa.Column('element_c', sa.String(length=32), nullable=True),
    sa.Column('element_d', sa.String(length=32), nullable=True),
    sa.Column('element_accumulator', sa.String(length=32), nullable=True),
    sa.Column('element_epilogue', sa.String(length=32), nullable=True),
    sa.Column('layout_a', sa.String(length=32), nullable=True),
    sa.Column('layout_b', sa.String(length=32), nullable=True),
    sa.Column('layout_c', sa.String(length=32), nullable=True),
    sa.Column('layout_d', sa.String(length=32), nullable=True),
    sa.Column('alignment_a', sa.Integer(), nullable=True),
    sa.Column('alignment_b', sa.Integer(), nullable=True),
    sa.Column('alignment_c', sa.Integer(), nullable=True),
    sa.Column('alignment_d', sa.Integer(), nullable=True),
    sa.Column('tile_shape', sa.String(length=32), nullable=True),
    sa.Column('cluster_shape', sa.String(length=32), nullable=True),
    sa.Column('stages', sa.Integer(), nullable=True),
    sa.Column('kernel_schedule', sa.String(length=64), nullable=True),
    sa.Column('epilogue_schedule', sa.String(length=64), nullable=True),
    sa.Column('tile_scheduler', sa.String(length=64), nullable=True),
    sa.Column('epilogue_functor', sa.String(length=64), nullable=True),
    sa.Column('swizzling_functor', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['op_list_id'], ['cutlass_op_lists.id'], name=op.f('fk_cutlass_ops_op_list_id_cutlass_op_lists'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_cutlass_ops'))
    )
    with op.batch_alter_table('cutlass_ops', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_cutlass_ops_op_list_id'), ['op_list_id'], unique=False)
        batch_op.create_index('ix_cutlass_ops_types', ['element_a', 'element_b', 'layout_a', 'layout_b'], unique=False)

    op.create_table('guarded_entries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('variant', sa.String(length=64), nullable=False),
    sa.Column('guards_expr', sa.Text(), nullable=True),
    sa.Column('guards_known', sa.Boolean(), nullable=False),
    sa.Column('guards_note', sa.Text(), nullable=True),
    sa.Column('payload', sa.LargeBinary(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('checksum', sa.String(length=64), nullable=False),
    sa.Column('time_taken_ns', sa.BigInteger(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('hit_count', sa.Integer(), nullable=False),
    sa.Column('fingerprint_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['fingerprint_id'], ['system_fingerprints.id'], name=op.f('fk_guarded_entries_fingerprint_id_system_fingerprints'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_guarded_entries')),
    sa.UniqueConstraint('kind', 'key', 'variant', name='uq_guarded_entries_kind_key_variant')
    )
    with op.batch_alter_table('guarded_entries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_guarded_entries_fingerprint_id'), ['fingerprint_id'], unique=False)

    op.create_table('local_cache_values',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('fingerprint_id', sa.Integer(), nullable=False),
    sa.Column('namespace', sa.String(length=256), nullable=False),
    sa.Column('key_path', sa.Text(), nullable=False),
    sa.Column('value_json', sa.Text(), nullable=False),
    sa.Column('position', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['fingerprint_id'], ['system_fingerprints.id'], name=op.f('fk_local_cache_values_fingerprint_id_system_fingerprints'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_local_cache_values')),
    sa.UniqueConstraint('fingerprint_id', 'key_path', name='uq_local_cache_values_fp_key_path')
    )
    with op.batch_alter_table('local_cache_values', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_local_cache_values_namespace'), ['namespace'], unique=False)

    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql.strip()}")


def downgrade() -> None:
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    with op.batch_alter_table('local_cache_values', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_local_cache_values_namespace'))

    op.drop_table('local_cache_values')
    with op.batch_alter_table('guarded_entries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_guarded_entries_fingerprint_id'))

    op.drop_table('guarded_entries')
    with op.batch_alter_table('cutlass_ops', schema=None) as batch_op:
        batch_op.drop_index('ix_cutlass_ops_types')
        batch_op.drop_index(batch_op.f('ix_cutlass_ops_op_list_id'))

    op.drop_table('cutlass_ops')
    with op.batch_alter_table('best_configs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_best_configs_configs_hash'))

    op.drop_table('best_configs')
    with op.batch_alter_table('autotune_timings', schema=None) as batch_op:
        batch_op.drop_index('ix_autotune_timings_lookup')

    op.drop_table('autotune_timings')
    with op.batch_alter_table('system_fingerprints', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_system_fingerprints_system_hash'))

    op.drop_table('system_fingerprints')
    op.drop_table('cutlass_op_lists')
