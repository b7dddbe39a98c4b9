-- The anchor row's position (stream_era, stream_seq) beside its key: an evaluation sent again
-- after its table was emptied is stored at another sequence, so it cannot pass for the anchor and
-- make a table that lost its rows look whole (internal/chstore/anchored.go). 0 0: an anchor
-- noted before, matched by its key alone.
ALTER TABLE store_lineage ADD COLUMN anchor_era UInt32 DEFAULT 0;
ALTER TABLE store_lineage ADD COLUMN anchor_seq UInt64 DEFAULT 0;
