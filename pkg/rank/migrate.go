package rank

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

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
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	const ddl = `CREATE TABLE IF NOT EXISTS schema_migrations (
    version UInt32, name String, checksum String, applied_at DateTime
) ENGINE = ReplacingMergeTree() ORDER BY version`
	if err := s.conn.Exec(ctx, ddl); err != nil {
		return nil, fmt.Errorf("rank: migrations table: %w", err)
	}
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	done, err := s.appliedVersions(ctx)
	if err != nil {
		return nil, err
	}
	var applied []string
	for _, m := range migs {
		if done[m.Version] {
			continue
		}
		for _, st := range m.Statements {
			if err := s.conn.Exec(ctx, st); err != nil {
				return applied, fmt.Errorf("rank: migration %s: %w", m.Name, err)
			}
		}
		batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, checksum, applied_at)")
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

func (s *Store) appliedVersions(ctx context.Context) (map[int]bool, error) {
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT version FROM schema_migrations")
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
