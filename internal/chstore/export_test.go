package chstore

// What the external tests (package rank_test) need of the package's internals: the read queries
// and the migrations table, which TestCurrentClickHouseAgrees runs on a second engine.
var (
	ScoresQuery             = scoresQuery
	AnchoredScores          = anchoredScoresQuery
	TeamScoresQuery         = teamScoresQuery
	ContentsQuery           = contentsQuery
	ExecutionsQuery         = executionsQuery
	AnchoredExecutionsQuery = anchoredExecutionsQuery
	AnchoredTeamScoresQuery = anchoredTeamScoresQuery
	AnchorAt                = anchorAtCondition
	StatusQuery             = statusQuery
	MigrationsTable         = migrationsTable
	RoundLimit              = roundLimit
	QuoteString             = quoteString
	LineageQuery            = evaluationsView.lineageQuery()
	HoldsQuery              = evaluationsView.holdsQuery()
	NewestRowQuery          = evaluationsView.newestRowQuery()
	ArchiveNewestRowQuery   = archiveView.newestRowQuery()
	AddsColumn              = addsColumn
)

// ThreadsRefused reports whether the server refused the store's ReadThreads.
func (s *Store) ThreadsRefused() bool { return s.threadsRefused.Load() }
