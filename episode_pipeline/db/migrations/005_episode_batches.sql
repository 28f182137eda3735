-- 005: the episodes of each batch run (a campaign processes K episodes in one task; see
-- docs/architecture.md#batch-runs). A pipeline-owned table: written by the campaign driver when
-- it creates a wave's batches, read by the batch run and by the run coordinator that sizes it.
CREATE TABLE IF NOT EXISTS episode_batches (
    batch_key  text NOT NULL,
    position   integer NOT NULL CHECK (position >= 0),
    org_id     text NOT NULL,
    episode_id text NOT NULL,
    PRIMARY KEY (batch_key, position),
    UNIQUE (batch_key, org_id, episode_id)
);
