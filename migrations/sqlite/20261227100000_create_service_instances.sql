-- Every running instance announces itself here every few seconds (src/ledger/instances.rs):
-- its version and the newest version of the persisted formats it reads. A build that
-- writes a new format does so only once every instance seen within a minute reads it.
CREATE TABLE service_instances (
    instance_id TEXT PRIMARY KEY CHECK (length(instance_id) BETWEEN 1 AND 64),
    version     TEXT NOT NULL,
    formats     INTEGER NOT NULL CHECK (formats >= 1),
    started_at  TEXT NOT NULL,
    seen_at     TEXT NOT NULL
);
