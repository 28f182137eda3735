"""An application's own schema of the shared tables."""

from __future__ import annotations

# Only the contract's columns, the way an application might have declared them.
APPLICATION_SCHEMA = """
CREATE TABLE episodes (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    status text NOT NULL,
    processed_at timestamptz,
    mp4_s3_path text,
    parquet_s3_path text,
    frame_count integer,
    fps double precision,
    duration_seconds integer
);
CREATE TABLE frames (
    id bigserial PRIMARY KEY,
    episode_id uuid NOT NULL REFERENCES episodes (id),
    timestamp_ms bigint NOT NULL,
    observation jsonb NOT NULL,
    action jsonb
);
CREATE TABLE episode_metadata (
    id bigserial PRIMARY KEY,
    episode_id uuid NOT NULL REFERENCES episodes (id),
    meta_key text NOT NULL,
    value text,
    status text NOT NULL
);
CREATE TABLE entity_versions (
    id bigserial PRIMARY KEY,
    entity_type text NOT NULL,
    entity_id uuid NOT NULL,
    version integer NOT NULL,
    operation text NOT NULL,
    data jsonb NOT NULL
);
"""
