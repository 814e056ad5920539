-- Hourly rollups of the ledger, for `GET /admin/activity` (the console's Today page):
-- what it answers then costs the hours asked for, never the entries within them.
-- Triggers keep them in the same transaction as the entries, from the rows an insert
-- really added: an entry inserted again (ON CONFLICT DO NOTHING) counts once. Hours are
-- counted from the Unix epoch, in UTC.
--
-- `ledger_hourly`: per hour and action, the charges and holds, their units, and the
-- recorded denials.
CREATE TABLE ledger_hourly (
    hour     INTEGER NOT NULL,
    action   TEXT NOT NULL,
    charges  INTEGER NOT NULL,
    amount   INTEGER NOT NULL,
    denials  INTEGER NOT NULL,
    PRIMARY KEY (hour, action)
) WITHOUT ROWID;

-- Per hour, action and subject: the recorded denials (the most-denied subjects).
CREATE TABLE ledger_hourly_denials (
    hour     INTEGER NOT NULL,
    action   TEXT NOT NULL,
    subject  TEXT NOT NULL,
    denials  INTEGER NOT NULL,
    PRIMARY KEY (hour, action, subject)
) WITHOUT ROWID;

CREATE TRIGGER ledger_entries_roll_up AFTER INSERT ON ledger_entries
WHEN NEW.kind IN ('charge', 'hold', 'deny')
BEGIN
    INSERT INTO ledger_hourly (hour, action, charges, amount, denials)
    VALUES (CAST(strftime('%s', NEW.at) AS INTEGER) / 3600, NEW.action,
            NEW.kind <> 'deny', CASE WHEN NEW.kind = 'deny' THEN 0 ELSE NEW.amount END,
            NEW.kind = 'deny')
    ON CONFLICT (hour, action) DO UPDATE SET
        charges = charges + excluded.charges,
        amount = amount + excluded.amount,
        denials = denials + excluded.denials;
END;

CREATE TRIGGER ledger_entries_roll_up_denials AFTER INSERT ON ledger_entries
WHEN NEW.kind = 'deny'
BEGIN
    INSERT INTO ledger_hourly_denials (hour, action, subject, denials)
    VALUES (CAST(strftime('%s', NEW.at) AS INTEGER) / 3600, NEW.action, NEW.subject, 1)
    ON CONFLICT (hour, action, subject) DO UPDATE SET denials = denials + 1;
END;

-- The entries already there.
INSERT INTO ledger_hourly (hour, action, charges, amount, denials)
SELECT CAST(strftime('%s', at) AS INTEGER) / 3600, action,
       SUM(kind <> 'deny'), SUM(CASE WHEN kind = 'deny' THEN 0 ELSE amount END),
       SUM(kind = 'deny')
FROM ledger_entries WHERE kind IN ('charge', 'hold', 'deny')
GROUP BY 1, 2;
INSERT INTO ledger_hourly_denials (hour, action, subject, denials)
SELECT CAST(strftime('%s', at) AS INTEGER) / 3600, action, subject, COUNT(*)
FROM ledger_entries WHERE kind = 'deny'
GROUP BY 1, 2, 3;
