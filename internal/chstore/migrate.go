package chstore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/podium-llm/podium/schemas"
)

// Migration is one versioned DDL file of schemas/clickhouse.
type Migration struct {
	Version    int
	Name       string
	Statements []string
	Checksum   string
}

// Migrations reads the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	fsys := schemas.ClickHouseMigrations()
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("rank: migrations: %w", err)
	}
	slices.Sort(names)
	var out []Migration
	for _, name := range names {
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("rank: migration %s: name must be NNNN_description.sql", name)
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("rank: migration %s: %w", name, err)
		}
		sum := sha256.Sum256(b)
		out = append(out, Migration{Version: v, Name: name, Statements: splitStatements(string(b)), Checksum: hex.EncodeToString(sum[:])})
	}
	return out, nil
}

// splitStatements cuts a file at semicolons that end a line, dropping comment-only lines; the
// native protocol runs one statement per query.
func splitStatements(src string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || trimmed == "" {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// Migrate applies the migrations not yet recorded in schema_migrations and returns their names.
// Every statement is idempotent (IF NOT EXISTS), so two rankers migrating at once are harmless.
//
// On a cluster each replica keeps its own schema_migrations and is migrated in turn (names are
// then "0001_x.sql on host:port"); a replica that does not answer is skipped with a warning and
// migrated by the next `ranker migrate` (at least one must answer). With a cluster name the DDL
// runs once, ON CLUSTER, through whichever replica answers, and schema_migrations is replicated.
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	if !s.replication.Enabled || s.replication.Cluster != "" {
		var applied []string
		err := s.rs.write(ctx, func(conn driver.Conn) error {
			var err error
			applied, err = s.migrate(ctx, conn)
			return err
		})
		if err != nil {
			return applied, err
		}
		return applied, s.checkReplication(ctx)
	}
	var applied []string
	errs := s.rs.each(func(_ int, r *replica) error {
		return r.do(func(conn driver.Conn) error {
			names, err := s.migrate(ctx, conn)
			for _, n := range names {
				applied = append(applied, n+" on "+r.addr)
			}
			return err
		})
	})
	for i, err := range errs {
		if err != nil {
			s.rs.log.Warn("clickhouse replica not migrated now; run `ranker migrate` when it is back", "replica", s.rs.replicas[i].addr, "error", err)
		}
	}
	if err := reachable(errs); err != nil {
		return applied, err
	}
	return applied, s.checkReplication(ctx)
}

// migrationsTable records what was applied: on each node its own, or on a cluster (ON CLUSTER)
// replicated, so a later run through any replica knows what was applied.
const migrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
    version UInt32, name String, checksum String, applied_at DateTime
) ENGINE = ReplacingMergeTree() ORDER BY version`

// migrate applies the missing migrations through one connection. Nothing that exists is
// created again: ON CLUSTER DDL waits for every host, and a start must not wait for one that
// is down when there is nothing to do.
func (s *Store) migrate(ctx context.Context, conn driver.Conn) ([]string, error) {
	var have uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = 'schema_migrations'", s.db).Scan(&have); err != nil {
		return nil, fmt.Errorf("rank: migrations table: %w", err)
	}
	if have == 0 {
		ddl := migrationsTable
		if s.replication.Cluster != "" {
			var err error
			if ddl, err = s.replication.statement(ddl, s.db); err != nil {
				return nil, err
			}
		}
		if err := conn.Exec(s.replication.ddlContext(ctx), ddl); err != nil {
			return nil, fmt.Errorf("rank: migrations table: %w", err)
		}
	}
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	done, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}
	var applied []string
	for _, m := range migs {
		if done[m.Version] {
			continue
		}
		for _, st := range m.Statements {
			st, err := s.replication.statement(st, s.db)
			if err != nil {
				return applied, fmt.Errorf("rank: migration %s: %w", m.Name, err)
			}
			if err := execDDL(s.replication.ddlContext(ctx), conn, st); err != nil {
				return applied, fmt.Errorf("rank: migration %s: %w", m.Name, err)
			}
		}
		batch, err := conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, checksum, applied_at)")
		if err != nil {
			return applied, fmt.Errorf("rank: record migration %s: %w", m.Name, err)
		}
		if err := batch.Append(uint32(m.Version), m.Name, m.Checksum, time.Now()); err != nil {
			return applied, fmt.Errorf("rank: record migration %s: %w", m.Name, err)
		}
		if err := batch.Send(); err != nil {
			return applied, fmt.Errorf("rank: record migration %s: %w", m.Name, err)
		}
		applied = append(applied, m.Name)
	}
	return applied, nil
}

// execDDL runs one statement of a migration. ClickHouse 18.16 has no ADD COLUMN IF NOT EXISTS:
// a column that already exists (a table made again by Repair, two rankers migrating at once) is
// what the statement wanted, and counts as done.
func execDDL(ctx context.Context, conn driver.Conn, st string) error {
	err := conn.Exec(ctx, st)
	if err != nil && addsColumn(st) && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// addsColumn reports whether a statement adds a column to a table.
func addsColumn(st string) bool {
	up := strings.ToUpper(st)
	return strings.HasPrefix(up, "ALTER TABLE ") && strings.Contains(up, " ADD COLUMN ")
}

func appliedVersions(ctx context.Context, conn driver.Conn) (map[int]bool, error) {
	rows, err := conn.Query(ctx, "SELECT DISTINCT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("rank: read migrations: %w", err)
	}
	defer rows.Close()
	done := map[int]bool{}
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("rank: read migrations: %w", err)
		}
		done[int(v)] = true
	}
	return done, rows.Err()
}

// checkReplication refuses a configuration that does not match the tables: replicated tables
// read as one node (reads would not be quorum reads), tables made for one node under
// CLICKHOUSE_REPLICATED (quorum writes would mean nothing), or replicas CLICKHOUSE_ADDR does not
// list (a quorum read would not cover them). A table not created yet is fine: the ranker makes it.
func (s *Store) checkReplication(ctx context.Context) error {
	var errs []error
	s.rs.each(func(_ int, r *replica) error {
		err := r.do(func(conn driver.Conn) error {
			var engine string
			row := conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = 'evaluations'", s.db)
			if err := row.Scan(&engine); errors.Is(err, sql.ErrNoRows) {
				return nil
			} else if err != nil {
				return err
			}
			replicated := strings.HasPrefix(engine, "Replicated")
			switch {
			case s.replication.Enabled && !replicated:
				return fmt.Errorf("%w: table %s.evaluations is %s, not replicated", errMismatch, s.db, engine)
			case !s.replication.Enabled && replicated:
				return fmt.Errorf("%w: table %s.evaluations is %s: set CLICKHOUSE_REPLICATED=true and list every replica in CLICKHOUSE_ADDR", errMismatch, s.db, engine)
			case !replicated:
				return nil
			}
			var total uint8
			if err := conn.QueryRow(ctx, "SELECT total_replicas FROM system.replicas WHERE database = ? AND table = 'evaluations'", s.db).Scan(&total); err != nil {
				return err
			}
			if int(total) > len(s.rs.replicas) {
				return fmt.Errorf("%w: table %s.evaluations has %d replicas, CLICKHOUSE_ADDR lists %d: list every replica (quorum reads count on it)", errMismatch, s.db, total, len(s.rs.replicas))
			}
			return nil
		})
		if errors.Is(err, errMismatch) {
			errs = append(errs, err)
		}
		return nil // a replica that does not answer is checked when it does
	})
	if len(errs) > 0 {
		return fmt.Errorf("rank: %w (see the README, \"Running on a ClickHouse cluster\")", errors.Join(errs...))
	}
	return nil
}

var errMismatch = errors.New("the ClickHouse settings do not match the tables")
