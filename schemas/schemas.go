// Package schemas holds the machine-readable forms of the contract: a JSON Schema (2020-12) per
// event type under events/, and the versioned ClickHouse migrations under clickhouse/. They are
// embedded so that the services, the tests and external readers all use the same files.
package schemas

import (
	"embed"
	"io/fs"
)

//go:embed clickhouse/*.sql
var clickhouseFiles embed.FS

//go:embed events/*.json
var eventFiles embed.FS

// ClickHouseMigrations returns the migrations, named NNNN_description.sql, applied in name order.
func ClickHouseMigrations() fs.FS {
	sub, err := fs.Sub(clickhouseFiles, "clickhouse")
	if err != nil {
		panic(err) // the directory is embedded at build time; this cannot fail
	}
	return sub
}

// Events returns the JSON Schemas, one <event type>.schema.json per event type.
func Events() fs.FS {
	sub, err := fs.Sub(eventFiles, "events")
	if err != nil {
		panic(err)
	}
	return sub
}
