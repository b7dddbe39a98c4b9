-- The anchor row's position (stream_era, stream_seq) beside its key: an evaluation sent again
-- after its table was emptied is stored at another sequence, so it cannot pass for the anchor and
-- make a table that lost its rows look whole (internal/chstore/anchored.go). 0 0: an anchor
-- noted before, matched by its key alone.
-- floor_era: the oldest era whose rows the table holds (chstore.Lineage.Floor). Rows of an era
-- before the lineage's stream exist nowhere else, so a table lost with them is a loss, named
-- and waited on (docs/operating.md, "Evaluations lost"), never refilled as if whole. 0 on a
-- lineage noted before: every era since the first counts as held, and a lost table in a later era
-- is named as a loss.
ALTER TABLE store_lineage ADD COLUMN anchor_era UInt32 DEFAULT 0;
ALTER TABLE store_lineage ADD COLUMN anchor_seq UInt64 DEFAULT 0;
ALTER TABLE store_lineage ADD COLUMN floor_era UInt32 DEFAULT 0;
