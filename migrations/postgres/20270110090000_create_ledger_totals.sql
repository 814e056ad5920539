-- The ledger's totals (docs/ledger-sql.md, "ledger_totals"): per policy, budget and
-- counter period (the calendar period, the rolling window's bucket, or the hour for a
-- lifetime or per-request window, named by when it ends), the units allowed, the requests
-- allowed and the requests denied of the consumes recorded in totals rather than one by
-- one (a policy's `record: totals`). `amount` is NUMERIC: a period's sum may pass BIGINT,
-- and the insert of entries must never fail on a total's arithmetic.
--
-- An entry's `totals` (an array of {policy_id, budget, period_end, amount, allowed,
-- denied}) is what it adds to them; a void adds the negative of what it voids. The
-- rollup trigger (`ledger_roll_up`, once per INSERT or COPY statement, over the rows it
-- added) adds them in the same transaction as the entries: an entry inserted again
-- (ON CONFLICT DO NOTHING) counts once. It is the one trigger of `ledger_entries`, so
-- that a partitioned ledger keeps it as it is.
ALTER TABLE ledger_entries ADD COLUMN totals JSONB;

CREATE TABLE ledger_totals (
    policy_id   TEXT NOT NULL,
    budget      TEXT NOT NULL,
    period_end  TIMESTAMPTZ NOT NULL,
    amount      NUMERIC NOT NULL,
    allowed     BIGINT NOT NULL,
    denied      BIGINT NOT NULL,
    PRIMARY KEY (policy_id, budget, period_end)
);

-- The rows are upserted in key order, so that two transactions adding to the same totals
-- lock them in the same order.
CREATE OR REPLACE FUNCTION ledger_roll_up() RETURNS trigger LANGUAGE plpgsql AS $$
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
