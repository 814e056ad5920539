-- The checkpoints of the ledger's replay (Redis mode) saved after a full snapshot of
-- counter_snapshots: each holds only what changed since the checkpoint before it (the state
-- items of the keys that changed, and the keys that went), so that a checkpoint writes what
-- changed rather than the whole state. A rebuild loads the snapshot, then applies its
-- deltas in order. A full snapshot deletes every delta in the transaction that saves it;
-- a delta whose base_seq is not the kept snapshot's covered_seq (a release that does not
-- know this table saved a full snapshot since) is never applied.
CREATE TABLE counter_snapshot_deltas (
    -- The covered_seq of the full snapshot (counter_snapshots) the chain starts from.
    base_seq    BIGINT NOT NULL CHECK (base_seq >= 0),
    -- The covered_seq of the checkpoint this one follows: the snapshot's, or the delta's
    -- before it.
    after_seq   BIGINT NOT NULL CHECK (after_seq >= base_seq),
    -- The highest ledger seq whose entry the state includes.
    covered_seq BIGINT NOT NULL CHECK (covered_seq > after_seq),
    -- This part's number, from 0, and how many parts the delta has.
    part        INTEGER NOT NULL CHECK (part >= 0),
    parts       INTEGER NOT NULL CHECK (parts > part),
    -- The version of the parts' encoding (engine::codec::snapshot, DELTA_FORMAT).
    format      INTEGER NOT NULL,
    -- The id of the entry at covered_seq, to tell another ledger apart.
    covered_id  TEXT,
    -- The key prefix the counters were kept under (QUOTA_REDIS_PREFIX).
    prefix      TEXT NOT NULL,
    taken_at    TIMESTAMPTZ NOT NULL,
    data        BYTEA NOT NULL,
    PRIMARY KEY (covered_seq, part)
);
