-- The floor of each Redis shard's write generation (src/counters/redis/generations.rs): the
-- generation the ledger drain read after it moved a batch of the shard's stream into SQL.
-- A shard whose generation in Redis is below it came back older than the ledger (restarted
-- from an older snapshot), and is rebuilt from the ledger before it decides again.
CREATE TABLE redis_generations (
    prefix     TEXT NOT NULL,
    shard      BIGINT NOT NULL CHECK (shard >= 0),
    generation BIGINT NOT NULL CHECK (generation >= 0),
    PRIMARY KEY (prefix, shard)
);
