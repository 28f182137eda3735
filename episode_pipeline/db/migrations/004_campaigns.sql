-- 004: what produced each episode (outlives Dagster's retention), and the reprocessing campaigns'
-- ledger (docs/operations.md#reprocess-the-fleet). Tables the pipeline owns.

-- The latest processing of each episode: the code version of every asset that wrote its outputs
-- (settings such as the ladder folded in), and the figures a campaign's canary compares. Written
-- in the transaction that marks the episode `processed` (defs/assets/episode.py).
CREATE TABLE IF NOT EXISTS episode_outputs (
    org_id        text NOT NULL,
    episode_id    text NOT NULL,
    code_versions jsonb NOT NULL,           -- {"asset": "version", ...}
    code_version  text NOT NULL,            -- one digest of code_versions: the stale selection's key
    figures       jsonb NOT NULL,           -- frame_rows, seconds_by_camera, renditions, sync_findings
    run_id        text,
    wall_seconds  double precision,         -- the run's start to the row: `campaign plan` reads it
    archive_bytes bigint,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, episode_id)
);
CREATE INDEX IF NOT EXISTS episode_outputs_code_version_idx ON episode_outputs (code_version);

CREATE TABLE IF NOT EXISTS campaigns (
    id           text PRIMARY KEY,          -- a partition-key-safe slug, chosen at `start`
    name         text NOT NULL,
    selection    jsonb NOT NULL,            -- what `plan` selected, as given
    target_code_version text NOT NULL,      -- the code version the campaign brings episodes to
    state        text NOT NULL CHECK (state IN ('running', 'paused', 'stopped', 'canceled', 'done')),
    settings     jsonb NOT NULL,            -- wave size, K, canary, governor bounds
    governor     jsonb NOT NULL,            -- limit, paused_until, ok_streak (campaign/governor.py)
    next_wave    integer NOT NULL DEFAULT 0,
    report       jsonb,                     -- why it stopped (the canary's findings)
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per episode of a campaign; the primary key is the idempotency key (campaign × episode).
CREATE TABLE IF NOT EXISTS campaign_episodes (
    campaign_id  text NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
    org_id       text NOT NULL,
    episode_id   text NOT NULL,
    position     bigint NOT NULL,           -- selection order: waves are claimed in it
    state        text NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'requested', 'succeeded', 'failed', 'rejected')),
    attempts     integer NOT NULL DEFAULT 0,
    retry_after  timestamptz,
    last_error   text,
    error_class  text,                      -- campaign/governor.py's classes: throttled, capacity, ...
    wave         integer,
    batch_key    text,
    run_id       text,
    partition_added boolean NOT NULL DEFAULT false,  -- the campaign added it: it prunes it
    previous_figures jsonb,                 -- episode_outputs.figures when claimed: the canary's
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (campaign_id, org_id, episode_id)
);
CREATE INDEX IF NOT EXISTS campaign_episodes_claim_idx
    ON campaign_episodes (campaign_id, state, position);
CREATE INDEX IF NOT EXISTS campaign_episodes_wave_idx ON campaign_episodes (campaign_id, wave);

-- Every decision of the driver and its governor, newest last: `campaign status` shows them.
CREATE TABLE IF NOT EXISTS campaign_decisions (
    id          bigserial PRIMARY KEY,
    campaign_id text NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT now(),
    kind        text NOT NULL,              -- governor, wave, canary, state
    message     text NOT NULL,
    details     jsonb
);
CREATE INDEX IF NOT EXISTS campaign_decisions_campaign_idx ON campaign_decisions (campaign_id, id);
