-- 007: each campaign's per-state counts, kept by the statements that change its ledger, so the
-- driver's tick reads a few rows instead of counting the campaign's (0.2 s a tick at a million
-- rows, growing with it). Triggers: every writer of `campaign_episodes` (the claim, the
-- outcomes, the releases, the rejections, the start's INSERT … SELECT, a test's own rows) keeps
-- them in its own transaction, so a ledger transition stays one transaction and the counts
-- never disagree with the rows it sees.
--
-- The counts are the sum of a campaign's rows here, each a change (+/-) a statement appended:
-- appending never waits for another transaction (two ticks claiming at once with SKIP LOCKED
-- never wait for each other's counters) and never rewrites a row (a counter updated 500 times
-- in one claim's transaction walks its 500 versions on each update). The driver folds them into
-- one row a state each tick under the campaign's lock (`db/campaigns.py`'s `fold_counts`), so
-- the sum reads five rows plus a tick's changes, however big the campaign.
-- No foreign key: its check would lock the campaign's row (FOR KEY SHARE) on every change of
-- state, so a transition would wait for a tick holding the campaign (FOR UPDATE) and could
-- deadlock with it; a campaign's delete deletes its counters instead (the trigger below).
CREATE TABLE IF NOT EXISTS campaign_counts (
    campaign_id text NOT NULL,
    state       text NOT NULL,
    episodes    bigint NOT NULL             -- a change (+/-) or, once folded, the count
);
CREATE INDEX IF NOT EXISTS campaign_counts_campaign_idx ON campaign_counts (campaign_id);

-- The rows already in the ledger (a database that had campaigns before this migration).
INSERT INTO campaign_counts (campaign_id, state, episodes)
SELECT campaign_id, state, count(*) FROM campaign_episodes GROUP BY campaign_id, state;

-- A change of state moves one episode between two counters (a row trigger: its WHEN is checked
-- without calling the function, so forgetting a partition or marking one added costs nothing);
-- an INSERT … SELECT or a DELETE appends its net change per (campaign, state) once (a statement
-- trigger over its transition table: a campaign's start counts its million rows in one pass).
-- A delete skips a campaign that is itself being deleted (its counters go with it).
CREATE OR REPLACE FUNCTION campaign_counts_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO campaign_counts (campaign_id, state, episodes)
    VALUES (NEW.campaign_id, NEW.state, 1), (OLD.campaign_id, OLD.state, -1);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION campaign_counts_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO campaign_counts (campaign_id, state, episodes)
        SELECT campaign_id, state, count(*) FROM new_rows GROUP BY campaign_id, state;
    ELSE
        INSERT INTO campaign_counts (campaign_id, state, episodes)
        SELECT campaign_id, state, -count(*) FROM old_rows
         WHERE EXISTS (SELECT 1 FROM campaigns WHERE campaigns.id = old_rows.campaign_id)
         GROUP BY campaign_id, state;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER campaign_counts_insert AFTER INSERT ON campaign_episodes
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_add();
CREATE OR REPLACE TRIGGER campaign_counts_update AFTER UPDATE OF state ON campaign_episodes
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION campaign_counts_move();
CREATE OR REPLACE TRIGGER campaign_counts_delete AFTER DELETE ON campaign_episodes
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_add();

CREATE OR REPLACE FUNCTION campaign_counts_forget() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM campaign_counts WHERE campaign_id = OLD.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER campaign_counts_forget AFTER DELETE ON campaigns
    FOR EACH ROW EXECUTE FUNCTION campaign_counts_forget();
