-- 002: `episode-pipeline status` (no episode) pages the most recently changed episodes: keyed on
-- this index instead of sorting the whole table (docs/operations.md).
CREATE INDEX IF NOT EXISTS episodes_updated_at_idx ON episodes (updated_at);
