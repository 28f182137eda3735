-- 003: `status` pages episodes `ORDER BY updated_at DESC NULLS LAST, id DESC`; an ascending
-- index scanned backwards yields NULLS FIRST, so PostgreSQL sorted the whole table instead.
-- This index is in the query's own order.
DROP INDEX IF EXISTS episodes_updated_at_idx;
CREATE INDEX IF NOT EXISTS episodes_newest_first_idx ON episodes (updated_at DESC NULLS LAST, id DESC);
