-- 007: a campaign runs only the assets whose code version changed and those downstream of them
-- (campaigns.selection -> 'assets'); an episode whose record is unknown, or whose stored outputs
-- that selection reads are missing, runs the whole graph: flagged here, per episode.
-- A wave claims episodes of one kind (its backfill has one asset selection).
ALTER TABLE campaign_episodes ADD COLUMN IF NOT EXISTS whole_graph boolean NOT NULL DEFAULT false;
