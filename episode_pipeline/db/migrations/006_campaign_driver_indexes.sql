-- 006: the campaign driver's reads per tick cost what it drives, not the campaign's size.
-- The claim reads its rows in claim order (fewest attempts first, then the
-- selection's order) from an index that holds only the claimable states, instead of sorting
-- every claimable row of the campaign on each wave (64 ms at 100,000 rows, growing with the
-- campaign). `campaign_episodes_claim_idx` (004) still serves the per-state counts.
CREATE INDEX IF NOT EXISTS campaign_episodes_claim_order_idx
    ON campaign_episodes (campaign_id, attempts, position)
    WHERE state IN ('pending', 'failed');

-- The partitions a campaign added and has not pruned (at most its live budget, ~a wave): the
-- driver counts them and finds the settled ones each tick without reading the campaign's rows.
CREATE INDEX IF NOT EXISTS campaign_episodes_added_idx
    ON campaign_episodes (campaign_id, state)
    WHERE partition_added;
