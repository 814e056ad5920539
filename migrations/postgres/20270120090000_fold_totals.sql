-- Rows that fold consumes recorded in the ledger's totals (docs/ledger-sql.md, "Folded
-- rows"): `folded` is how many consumes such a row stands for (requests allowed for a
-- `charge`, requests denied for a `deny`), `folded_ids` the ids of their entries
-- (hyphenated, separated by spaces); both NULL for every other row, which stands for
-- itself. A folded row names no subject of its consumes: the hourly roll-up counts it as
-- `folded` charges or denials, and the denials per subject leave it out.
ALTER TABLE ledger_entries ADD COLUMN folded BIGINT CHECK (folded IS NULL OR folded > 0);
ALTER TABLE ledger_entries ADD COLUMN folded_ids TEXT;

CREATE OR REPLACE FUNCTION ledger_roll_up() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_hourly (hour, action, charges, amount, denials)
    SELECT CAST(FLOOR(EXTRACT(EPOCH FROM at) / 3600) AS BIGINT) AS hour, action,
           SUM(CASE WHEN kind = 'deny' THEN 0 ELSE COALESCE(folded, 1) END),
           SUM(CASE WHEN kind = 'deny' THEN 0 ELSE amount END),
           SUM(CASE WHEN kind = 'deny' THEN COALESCE(folded, 1) ELSE 0 END)
    FROM inserted WHERE kind IN ('charge', 'hold', 'deny')
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (hour, action) DO UPDATE SET
        charges = ledger_hourly.charges + EXCLUDED.charges,
        amount = ledger_hourly.amount + EXCLUDED.amount,
        denials = ledger_hourly.denials + EXCLUDED.denials;
    INSERT INTO ledger_hourly_denials (hour, action, subject, denials)
    SELECT CAST(FLOOR(EXTRACT(EPOCH FROM at) / 3600) AS BIGINT) AS hour, action, subject,
           COUNT(*)
    FROM inserted WHERE kind = 'deny' AND folded IS NULL
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (hour, action, subject) DO UPDATE SET
        denials = ledger_hourly_denials.denials + EXCLUDED.denials;
    INSERT INTO ledger_totals (policy_id, budget, period_end, amount, allowed, denied)
    SELECT line->>'policy_id', line->>'budget', CAST(line->>'period_end' AS TIMESTAMPTZ),
           SUM(CAST(line->>'amount' AS NUMERIC)), SUM(CAST(line->>'allowed' AS BIGINT)),
           SUM(CAST(line->>'denied' AS BIGINT))
    FROM inserted CROSS JOIN LATERAL jsonb_array_elements(inserted.totals) AS line
    WHERE inserted.totals IS NOT NULL
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (policy_id, budget, period_end) DO UPDATE SET
        amount = ledger_totals.amount + EXCLUDED.amount,
        allowed = ledger_totals.allowed + EXCLUDED.allowed,
        denied = ledger_totals.denied + EXCLUDED.denied;
    RETURN NULL;
END
$$;
