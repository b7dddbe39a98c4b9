-- The era of the EVALUATIONS stream a row came from (pkg/rank/pos.go): EVALUATIONS deleted and
-- made again starts a new era, whose sequences start over at 1, and everything stored in an
-- earlier era comes before anything of a later one. A position in the history of evaluations is
-- (stream_era, stream_seq): a prompt composed as of one counts every row of earlier eras, and
-- the rows of its own era up to its sequence. Rows stored before eras were counted are era 0,
-- the stream the store was first derived from. The lineage names the era of its stream.
-- Tables made since have the columns from 0001 and 0002 (so that every replica of a cluster makes
-- the same table, whichever migration it runs first); ClickHouse 18.16 has no ADD COLUMN IF NOT
-- EXISTS, so the store takes "already exists" as done.
ALTER TABLE evaluations ADD COLUMN stream_era UInt32 DEFAULT 0 AFTER stream_seq;
ALTER TABLE store_lineage ADD COLUMN era UInt32 DEFAULT 0;
