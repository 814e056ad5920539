-- The newest snapshot of the embedded default's in-process counters (usage, open holds,
-- kept answers), written at graceful shutdown so that the next start replays only the
-- ledger entries after it. One snapshot is split into parts of a few MiB each; every part
-- repeats the snapshot's header. Saving deletes every older row in the same transaction,
-- so the table holds one snapshot at most.
CREATE TABLE counter_snapshots (
    -- The highest ledger seq whose entry the snapshot includes (0: the ledger was empty).
    covered_seq BIGINT NOT NULL CHECK (covered_seq >= 0),
    -- This part's number, from 0, and how many parts the snapshot has.
    part        INTEGER NOT NULL CHECK (part >= 0),
    parts       INTEGER NOT NULL CHECK (parts > part),
    -- The version of the parts' encoding (engine::codec::snapshot).
    format      INTEGER NOT NULL,
    -- The id of the entry at covered_seq, to tell another ledger apart.
    covered_id  TEXT,
    -- The key prefix the counters were kept under (QUOTA_REDIS_PREFIX).
    prefix      TEXT NOT NULL,
    taken_at    TIMESTAMPTZ NOT NULL,
    data        BYTEA NOT NULL,
    PRIMARY KEY (covered_seq, part)
);
