-- One row counting the changes ever made to policies and overrides. Every write bumps it
-- in the same transaction, so an instance can tell with one cheap read whether its
-- in-process policy cache is stale.
CREATE TABLE policy_changes (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL CHECK (version >= 0)
);

INSERT INTO policy_changes (id, version) VALUES (1, 0);
