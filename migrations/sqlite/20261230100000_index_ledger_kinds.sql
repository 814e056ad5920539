-- The query API's filter on a kind, alone (`?kind=refund`) or with an action
-- (`?action=sms&kind=deny`): each read through an index in `seq` order, newest first,
-- rather than by reading every entry of the ledger or of the action (0.9 s over a million
-- entries when none matched).
CREATE INDEX ledger_entries_kind_seq_idx ON ledger_entries (kind, seq);
CREATE INDEX ledger_entries_action_kind_seq_idx ON ledger_entries (action, kind, seq);
