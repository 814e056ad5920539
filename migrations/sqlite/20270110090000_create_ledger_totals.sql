-- The ledger's totals (docs/ledger-sql.md, "ledger_totals"): per policy, budget and
-- counter period (the calendar period, the rolling window's bucket, or the hour for a
-- lifetime or per-request window, named by when it ends), the units allowed, the requests
-- allowed and the requests denied of the consumes recorded in totals rather than one by
-- one (a policy's `record: totals`).
--
-- An entry's `totals` (JSON text: an array of {policy_id, budget, period_end, amount,
-- allowed, denied}) is what it adds to them; a void adds the negative of what it voids.
-- A trigger adds it in the same transaction as the entry, from the rows an insert really
-- added: an entry inserted again (ON CONFLICT DO NOTHING) counts once.
ALTER TABLE ledger_entries ADD COLUMN totals TEXT;

CREATE TABLE ledger_totals (
    policy_id   TEXT NOT NULL,
    budget      TEXT NOT NULL,
    -- RFC 3339 in UTC, as the ledger's `at`: text order is time order.
    period_end  TEXT NOT NULL,
    amount      INTEGER NOT NULL,
    allowed     INTEGER NOT NULL,
    denied      INTEGER NOT NULL,
    PRIMARY KEY (policy_id, budget, period_end)
) WITHOUT ROWID;

CREATE TRIGGER ledger_entries_add_totals AFTER INSERT ON ledger_entries
WHEN NEW.totals IS NOT NULL
BEGIN
    INSERT INTO ledger_totals (policy_id, budget, period_end, amount, allowed, denied)
    SELECT json_extract(value, '$.policy_id'), json_extract(value, '$.budget'),
           json_extract(value, '$.period_end'), json_extract(value, '$.amount'),
           json_extract(value, '$.allowed'), json_extract(value, '$.denied')
    FROM json_each(NEW.totals) WHERE true
    ON CONFLICT (policy_id, budget, period_end) DO UPDATE SET
        amount = amount + excluded.amount,
        allowed = allowed + excluded.allowed,
        denied = denied + excluded.denied;
END;
