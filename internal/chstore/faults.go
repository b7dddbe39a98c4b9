package chstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Fault is what an error of ClickHouse means for a write, and so what the writer does about it.
type Fault int

const (
	// Transient: the server is down, busy or out of a resource for now; the same rows will be
	// taken later (the default for anything not known to be otherwise).
	Transient Fault = iota
	// Missing: the database or a table the migrations own is gone (dropped by an operator):
	// Repair recreates it, then the same rows are taken.
	Missing
	// Refused: the table as it is now refuses the rows (a column dropped or retyped, a value it
	// cannot take); retrying the same rows changes nothing.
	Refused
)

func (f Fault) String() string { return [...]string{"transient", "missing", "refused"}[f] }

// ClickHouse error codes of faults that retrying does not mend.
const (
	codeNotFoundColumnInBlock = 10
	codeNoSuchColumnInTable   = 16
	codeCannotParseText       = 6
	codeCannotParseNumber     = 72
	codeIllegalColumn         = 44
	codeTypeMismatch          = 53
	codeUnknownTable          = 60
	codeUnknownDatabase       = 81
	codeIllegalTypeOfArgument = 43
	codeTooLargeStringSize    = 131
	codeNoSuchColumnInBlock   = 8
	codeUnknownIdentifier     = 47
)

// ErrTableMismatch is a table that is not what the migrations made.
var ErrTableMismatch = errors.New("rank: the table is not what the migrations made")

// FaultOf classifies an error of a write. Errors the client raises before anything is sent
// (a value the batch cannot convert to a column's type) are Refused too.
func FaultOf(err error) Fault {
	switch exceptionCode(err) {
	case codeUnknownTable, codeUnknownDatabase:
		return Missing
	case codeNotFoundColumnInBlock, codeNoSuchColumnInTable, codeNoSuchColumnInBlock, codeIllegalColumn, codeTypeMismatch,
		codeCannotParseText, codeCannotParseNumber, codeIllegalTypeOfArgument, codeTooLargeStringSize, codeUnknownIdentifier:
		return Refused
	}
	var conv *clientConversion
	if errors.As(err, &conv) {
		return Refused
	}
	return Transient
}

// codeNotEnoughSpace is ClickHouse's refusal to reserve disk for a part.
const codeNotEnoughSpace = 243

// NoSpace reports whether a write failed for want of disk on the ClickHouse server: a transient
// fault (the same rows are taken once space is freed), which an operator must act on.
func NoSpace(err error) bool {
	if err == nil {
		return false
	}
	return exceptionCode(err) == codeNotEnoughSpace || strings.Contains(err.Error(), "No space left on device") ||
		strings.Contains(err.Error(), "not enough space")
}

// clientConversion marks an error of the client's batch: a value it could not append to a
// column of the table as the server described it.
type clientConversion struct{ err error }

func (e *clientConversion) Error() string { return e.err.Error() }
func (e *clientConversion) Unwrap() error { return e.err }

// Repair recreates what the migrations create and is missing now, whatever schema_migrations
// says: a table dropped by hand is made again (empty; the ranker's stream is the log to refill
// it from: `podium store rebuild`). Only CREATE ... IF NOT EXISTS statements run again, so
// nothing that exists changes. The database itself is CreateDatabase's to make.
func (s *Store) Repair(ctx context.Context) ([]string, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	var made []string
	err = s.rs.write(ctx, func(conn driver.Conn) error {
		for _, m := range migs {
			for _, st := range m.Statements {
				if !strings.HasPrefix(strings.ToUpper(st), "CREATE TABLE IF NOT EXISTS") {
					continue // a CREATE holds every column later migrations added (0004_eras.sql)
				}
				st, err := s.replication.statement(st, s.db)
				if err != nil {
					return err
				}
				if err := conn.Exec(s.replication.ddlContext(ctx), st); err != nil {
					return fmt.Errorf("rank: repair %s: %w", m.Name, err)
				}
			}
			made = append(made, m.Name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	_, err = s.Migrate(ctx) // schema_migrations too, when it went with the database
	return made, err
}

// evaluationColumns are the columns Insert writes, with the types the migrations give them.
var evaluationColumns = [][2]string{
	{"execution_id", "String"}, {"team_id", "String"}, {"round_number", "UInt32"}, {"event_id", "String"},
	{"team_name", "String"}, {"overall_score", "Float64"}, {"metrics", "String"}, {"feedback", "String"},
	{"submission", "String"}, {"submission_format", "String"}, {"evaluated_at", "String"},
	{"evaluated_at_us", "Int64"}, {"event_source", "String"}, {"stream_seq", "UInt64"}, {"stream_era", "UInt32"},
}

// CheckTable compares the evaluations table with what the migrations made: nil when every column
// Insert writes is there with its type, else an error naming each difference. It tells a table
// altered by hand (which refuses every row) from rows the table refuses for what they hold.
func (s *Store) CheckTable(ctx context.Context) error {
	have := map[string]string{}
	err := s.query(ctx, "SELECT name, type FROM system.columns WHERE database = ? AND table = 'evaluations'", []any{s.db}, func(rows driver.Rows) error {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return err
		}
		have[name] = typ
		return nil
	})
	if err != nil {
		return fmt.Errorf("rank: check table: %w", err)
	}
	if len(have) == 0 {
		return fmt.Errorf("%w: %s.evaluations does not exist", ErrTableMismatch, s.db)
	}
	var diffs []string
	for _, c := range evaluationColumns {
		switch typ, ok := have[c[0]]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("column %s is missing", c[0]))
		case typ != c[1]:
			diffs = append(diffs, fmt.Sprintf("column %s is %s, not %s", c[0], typ, c[1]))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%w: %s.evaluations: %s", ErrTableMismatch, s.db, strings.Join(diffs, "; "))
	}
	return nil
}
