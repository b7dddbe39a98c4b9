-- What the evaluations table was derived from (pkg/rank/lineage.go). The table is a view of the
-- EVALUATIONS stream; a row here says which stream (stream_created: its creation time, which a
-- stream deleted and made again changes) and which derivation (epoch: when the ranker began to
-- fill the table, or adopted one it found) the rows come from, whether that derivation is whole,
-- and one row the table held then (anchor_*: a key of the sort key, looked up through the primary
-- index, and the row's position, which a replay of its evaluation does not have). A table dropped or recreated loses its anchor row; the ranker sees that and refills the
-- table from the stream. The newest version wins: reads take the row with the largest
-- (epoch, version), and merges keep it.
CREATE TABLE IF NOT EXISTS store_lineage (
    epoch UInt64,
    version UInt64,
    stream_created String,
    anchor_execution_id String,
    anchor_team_id String,
    anchor_event_id String,
    through UInt64,
    whole UInt8,
    noted_at DateTime,
    era UInt32 DEFAULT 0, -- added by 0004_eras.sql to tables made before it
    anchor_era UInt32 DEFAULT 0, -- added by 0005_anchor_position.sql to tables made before it
    anchor_seq UInt64 DEFAULT 0,
    floor_era UInt32 DEFAULT 0
) ENGINE = ReplacingMergeTree(version)
ORDER BY epoch;

-- How far `podium store rebuild` got (pkg/rank/rebuild.go): an interrupted rebuild resumes after
-- the last sequence noted, while the evaluations table still holds that row.
CREATE TABLE IF NOT EXISTS rebuild_progress (
    stream_seq UInt64, noted_at DateTime
) ENGINE = ReplacingMergeTree() ORDER BY stream_seq;
