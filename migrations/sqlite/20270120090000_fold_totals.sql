-- Rows that fold consumes recorded in the ledger's totals (docs/ledger-sql.md, "Folded
-- rows"): `folded` is how many consumes such a row stands for (requests allowed for a
-- `charge`, requests denied for a `deny`), `folded_ids` the ids of their entries
-- (hyphenated, separated by spaces); both NULL for every other row, which stands for
-- itself. A folded row names no subject of its consumes: the hourly roll-up counts it as
-- `folded` charges or denials, and the denials per subject leave it out.
ALTER TABLE ledger_entries ADD COLUMN folded INTEGER CHECK (folded IS NULL OR folded > 0);
ALTER TABLE ledger_entries ADD COLUMN folded_ids TEXT;

DROP TRIGGER ledger_entries_roll_up;
CREATE TRIGGER ledger_entries_roll_up AFTER INSERT ON ledger_entries
WHEN NEW.kind IN ('charge', 'hold', 'deny')
BEGIN
    INSERT INTO ledger_hourly (hour, action, charges, amount, denials)
    VALUES (CAST(strftime('%s', NEW.at) AS INTEGER) / 3600, NEW.action,
            CASE WHEN NEW.kind = 'deny' THEN 0 ELSE COALESCE(NEW.folded, 1) END,
            CASE WHEN NEW.kind = 'deny' THEN 0 ELSE NEW.amount END,
            CASE WHEN NEW.kind = 'deny' THEN COALESCE(NEW.folded, 1) ELSE 0 END)
    ON CONFLICT (hour, action) DO UPDATE SET
        charges = charges + excluded.charges,
        amount = amount + excluded.amount,
        denials = denials + excluded.denials;
END;

DROP TRIGGER ledger_entries_roll_up_denials;
CREATE TRIGGER ledger_entries_roll_up_denials AFTER INSERT ON ledger_entries
WHEN NEW.kind = 'deny' AND NEW.folded IS NULL
BEGIN
    INSERT INTO ledger_hourly_denials (hour, action, subject, denials)
    VALUES (CAST(strftime('%s', NEW.at) AS INTEGER) / 3600, NEW.action, NEW.subject, 1)
    ON CONFLICT (hour, action, subject) DO UPDATE SET denials = denials + 1;
END;
