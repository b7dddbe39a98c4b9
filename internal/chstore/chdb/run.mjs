// Runs statements in an embedded current ClickHouse (chDB) and prints each SELECT's rows. Reads a
// JSON array of {"sql": "...", "select": bool} on stdin; writes a JSON array with, for each
// statement, its rows as ClickHouse's JSONCompactEachRow lines (one JSON array a row, as text), []
// for DDL and inserts, or {"error": "..."}.
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Session, query } from "chdb";

const statements = JSON.parse(readFileSync(0, "utf8"));
const dir = mkdtempSync(join(tmpdir(), "podium-chdb-"));
const session = new Session(dir);
const out = [];
for (const st of statements) {
  try {
    const text = session.query(st.sql, st.select ? "JSONCompactEachRow" : "CSV");
    // Lines as ClickHouse wrote them: JSON.parse would round 64-bit integers.
    out.push(st.select ? text.split("\n").filter((l) => l.trim()) : []);
  } catch (e) {
    out.push({ error: String(e.message ?? e) });
  }
}
session.cleanup?.();
rmSync(dir, { recursive: true, force: true });
process.stdout.write(JSON.stringify({ version: query("SELECT version()", "CSV").trim().replaceAll('"', ""), results: out }));
