-- 001: the shared schema (docs/TEAM_BRIEF.md). Applied by episode_pipeline.db.migrate inside one
-- transaction; IF NOT EXISTS keeps it harmless on a database that already has these tables.

CREATE TABLE IF NOT EXISTS episodes (
    id               text PRIMARY KEY,
    org_id           text NOT NULL,
    status           text NOT NULL DEFAULT 'uploaded',  -- uploaded | processing | processed | failed
    processed_at     timestamptz,
    mp4_s3_path      text,
    parquet_s3_path  text,
    frame_count      integer,
    fps              double precision,
    duration_seconds integer,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Listing an org's episodes and finding work by status are the two common filters.
CREATE INDEX IF NOT EXISTS episodes_org_id_idx ON episodes (org_id);
CREATE INDEX IF NOT EXISTS episodes_status_idx ON episodes (status);

CREATE TABLE IF NOT EXISTS frames (
    id                    bigserial PRIMARY KEY,
    episode_id            text NOT NULL REFERENCES episodes (id) ON DELETE CASCADE,
    frame_order           integer NOT NULL,  -- 0-based position across the upload's data files
    lerobot_episode_index integer,
    frame_index           integer,
    timestamp_ms          bigint NOT NULL,
    observation           jsonb NOT NULL,    -- {"state": [...]}
    action                jsonb,
    UNIQUE (episode_id, frame_order)
);
-- The UNIQUE (episode_id, frame_order) index already serves "frames of an episode, in order" and
-- the ON DELETE CASCADE lookup, so frames gets no extra index (each one slows the bulk COPY).

CREATE TABLE IF NOT EXISTS episode_metadata (
    id         bigserial PRIMARY KEY,
    episode_id text NOT NULL REFERENCES episodes (id) ON DELETE CASCADE,
    meta_key   text NOT NULL,
    value      text,
    status     text NOT NULL CHECK (status IN ('editable', 'non_editable')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (episode_id, meta_key)
);

CREATE TABLE IF NOT EXISTS entity_versions (
    id          bigserial PRIMARY KEY,
    entity_type text NOT NULL,
    entity_id   text NOT NULL,
    version     integer NOT NULL,
    operation   text NOT NULL,
    data        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (entity_type, entity_id, version)
);
