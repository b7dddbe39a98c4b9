package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// chUsers are the users of deploy/clickhouse/users.d/podium.xml, as the ClickHouse roles table
// of docs/operating.md has them.
var chUsers = []string{"ranker", "archiver", "composer", "console", "auditor"}

// chAction is one thing a ClickHouse user may try, on Podium's database (rounds) or another.
type chAction struct {
	name string
	q    func(user string) string
}

// chActions are the rows of the ClickHouse roles table. Each user's objects are named after it,
// so that no user's try changes another's.
var chActions = []chAction{
	{"read rounds", func(string) string { return "SELECT count() FROM rounds.cells" }},
	{"insert into rounds", func(string) string { return "INSERT INTO rounds.cells SELECT 1" }},
	{"create a table in rounds", func(u string) string {
		return "CREATE TABLE rounds.cells_" + u + " (x UInt8) ENGINE = MergeTree ORDER BY x"
	}},
	{"delete rows in rounds (a mutation)", func(string) string { return "ALTER TABLE rounds.cells DELETE WHERE x = 2" }},
	{"truncate a table in rounds", func(u string) string { return "TRUNCATE TABLE rounds.cells_truncate_" + u }},
	{"drop a table in rounds", func(u string) string { return "DROP TABLE rounds.cells_drop_" + u }},
	{"read another database", func(string) string { return "SELECT count() FROM other.cells" }},
	{"create another database", func(u string) string { return "CREATE DATABASE cells_" + u }},
}

// TestEveryClickHouseCell starts ClickHouse with deploy/clickhouse/users.d/podium.xml as shipped
// and tries every row of the ClickHouse roles table of docs/operating.md as every user: what the
// table does not list must be refused, and what it lists let through. With PODIUM_ROLES_PRINT=1 it
// prints the table as the server answers it.
func TestEveryClickHouseCell(t *testing.T) {
	t.Parallel()
	ch := shippedClickHouse(t)
	for _, q := range []string{"CREATE DATABASE rounds", "CREATE DATABASE other",
		"CREATE TABLE rounds.cells (x UInt8) ENGINE = MergeTree ORDER BY x", "CREATE TABLE other.cells (x UInt8) ENGINE = MergeTree ORDER BY x"} {
		if err := chAs(t, ch, "default", q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, u := range chUsers {
		for _, table := range []string{"cells_truncate_", "cells_drop_"} {
			if err := chAs(t, ch, "default", "CREATE TABLE rounds."+table+u+" (x UInt8) ENGINE = MergeTree ORDER BY x"); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := chRolesTable(t)
	observed := map[string][]string{}
	for _, a := range chActions {
		for _, u := range chUsers {
			err := chAs(t, ch, u, a.q(u))
			if err == nil {
				observed[a.name] = append(observed[a.name], u)
			}
			if allowed, listed := err == nil, slices.Contains(want[a.name], u); allowed != listed {
				t.Errorf("%s: %s: the table says allowed=%v, the server allowed=%v (%v)", u, a.name, listed, allowed, err)
			}
		}
	}
	for name := range want {
		if !slices.ContainsFunc(chActions, func(a chAction) bool { return a.name == name }) {
			t.Errorf("the table has a row %q that the test does not try", name)
		}
	}
	if os.Getenv("PODIUM_ROLES_PRINT") != "" || t.Failed() {
		var b strings.Builder
		fmt.Fprintf(&b, "| | %s |\n|---%s|\n", strings.Join(quoted(chUsers), " | "), strings.Repeat("|---", len(chUsers)))
		for _, a := range chActions {
			fmt.Fprintf(&b, "| %s |", a.name)
			for _, u := range chUsers {
				if slices.Contains(observed[a.name], u) {
					b.WriteString(" yes |")
				} else {
					b.WriteString(" – |")
				}
			}
			b.WriteString("\n")
		}
		t.Logf("the ClickHouse roles table as the server answers it:\n%s", b.String())
	}
}

// chRolesTable reads the ClickHouse roles table of docs/operating.md: by action, the users allowed.
func chRolesTable(t *testing.T) map[string][]string {
	t.Helper()
	text, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(text), "<!-- clickhouse roles table -->")
	if !ok {
		t.Fatal("docs/operating.md has no ClickHouse roles table (<!-- clickhouse roles table -->)")
	}
	table, _, _ = strings.Cut(table, "<!-- end of the clickhouse roles table -->")
	var users []string
	out := map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(table), "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cols {
			cols[i] = strings.Trim(strings.TrimSpace(cols[i]), "`")
		}
		if users == nil {
			users = cols[1:]
			if !slices.Equal(users, chUsers) {
				t.Fatalf("the ClickHouse table's users are %v, deploy/clickhouse's %v", users, chUsers)
			}
			continue
		}
		out[cols[0]] = []string{}
		for i, u := range users {
			if cols[i+1] == "yes" {
				out[cols[0]] = append(out[cols[0]], u)
			}
		}
	}
	return out
}
