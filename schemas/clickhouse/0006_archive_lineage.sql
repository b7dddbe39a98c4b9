-- The prompts archive is a view of the PROMPTS stream as the evaluations table is of EVALUATIONS,
-- kept whole by the same keeper (internal/sink): its lineage (archive_lineage, the columns of
-- store_lineage: 0002_lineage.sql) names the stream the rows were derived from, the derivation,
-- whether it is whole, the oldest era its rows hold, and one row the table held at its position
-- (the anchor, which a table dropped or emptied has lost and a record sent again cannot fake).
-- stream_era is the era of the PROMPTS stream a row came from: PROMPTS deleted and made again
-- starts a new era, whose sequences start over. Rows archived before eras were counted are era 0.
-- Tables made since have the column from 0003 (so that every replica of a cluster makes the same
-- table, whichever migration it runs first); ClickHouse 18.16 has no ADD COLUMN IF NOT EXISTS, so
-- the store takes "already exists" as done.
ALTER TABLE prompts ADD COLUMN stream_era UInt32 DEFAULT 0 AFTER stream_seq;
CREATE TABLE IF NOT EXISTS archive_lineage (
    epoch UInt64,
    version UInt64,
    stream_created String,
    anchor_execution_id String,
    anchor_team_id String,
    anchor_event_id String,
    through UInt64,
    whole UInt8,
    noted_at DateTime,
    era UInt32 DEFAULT 0,
    anchor_era UInt32 DEFAULT 0,
    anchor_seq UInt64 DEFAULT 0,
    floor_era UInt32 DEFAULT 0
) ENGINE = ReplacingMergeTree(version)
ORDER BY epoch;
