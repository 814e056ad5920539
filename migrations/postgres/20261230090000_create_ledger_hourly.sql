-- Hourly rollups of the ledger, for `GET /admin/activity` (the console's Today page):
-- what it answers then costs the hours asked for, never the entries within them.
-- A trigger keeps them in the same transaction as the entries (the drain's and the
-- writer's inserts alike), from the rows an insert really added: an entry inserted again
-- (ON CONFLICT DO NOTHING) counts once. Hours are counted from the Unix epoch, in UTC.
--
-- `ledger_hourly`: per hour and action, the charges and holds, their units, and the
-- recorded denials. `amount` is NUMERIC: an hour's sum may pass BIGINT, and the insert of
-- entries must never fail on a rollup's arithmetic.
CREATE TABLE ledger_hourly (
    hour     BIGINT NOT NULL,
    action   TEXT NOT NULL,
    charges  BIGINT NOT NULL,
    amount   NUMERIC NOT NULL,
    denials  BIGINT NOT NULL,
    PRIMARY KEY (hour, action)
);

-- Per hour, action and subject: the recorded denials (the most-denied subjects).
CREATE TABLE ledger_hourly_denials (
    hour     BIGINT NOT NULL,
    action   TEXT NOT NULL,
    subject  TEXT NOT NULL,
    denials  BIGINT NOT NULL,
    PRIMARY KEY (hour, action, subject)
);

-- Once per INSERT statement, over the rows it added. The rows are upserted in key order,
-- so that two transactions rolling up the same hours lock them in the same order.
CREATE FUNCTION ledger_roll_up() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_hourly (hour, action, charges, amount, denials)
    SELECT CAST(FLOOR(EXTRACT(EPOCH FROM at) / 3600) AS BIGINT) AS hour, action,
           SUM(CASE WHEN kind = 'deny' THEN 0 ELSE 1 END),
           SUM(CASE WHEN kind = 'deny' THEN 0 ELSE amount END),
           SUM(CASE WHEN kind = 'deny' THEN 1 ELSE 0 END)
    FROM inserted WHERE kind IN ('charge', 'hold', 'deny')
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (hour, action) DO UPDATE SET
        charges = ledger_hourly.charges + EXCLUDED.charges,
        amount = ledger_hourly.amount + EXCLUDED.amount,
        denials = ledger_hourly.denials + EXCLUDED.denials;
    INSERT INTO ledger_hourly_denials (hour, action, subject, denials)
    SELECT CAST(FLOOR(EXTRACT(EPOCH FROM at) / 3600) AS BIGINT) AS hour, action, subject,
           COUNT(*)
    FROM inserted WHERE kind = 'deny'
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (hour, action, subject) DO UPDATE SET
        denials = ledger_hourly_denials.denials + EXCLUDED.denials;
    RETURN NULL;
END
$$;

CREATE TRIGGER ledger_entries_roll_up AFTER INSERT ON ledger_entries
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_roll_up();

-- The entries already there.
INSERT INTO ledger_hourly (hour, action, charges, amount, denials)
SELECT CAST(FLOOR(EXTRACT(EPOCH FROM at) / 3600) AS BIGINT), action,
       SUM(CASE WHEN kind = 'deny' THEN 0 ELSE 1 END),
       SUM(CASE WHEN kind = 'deny' THEN 0 ELSE amount END),
       SUM(CASE WHEN kind = 'deny' THEN 1 ELSE 0 END)
FROM ledger_entries WHERE kind IN ('charge', 'hold', 'deny')
GROUP BY 1, 2;
INSERT INTO ledger_hourly_denials (hour, action, subject, denials)
SELECT CAST(FLOOR(EXTRACT(EPOCH FROM at) / 3600) AS BIGINT), action, subject, COUNT(*)
FROM ledger_entries WHERE kind = 'deny'
GROUP BY 1, 2, 3;
