// Package auditlog is the tamper-evident log over PROMPTS: a Merkle tree (RFC 9162, as
// Certificate Transparency logs and the Go checksum database keep) whose leaves are the stream's
// messages in stream order, and signed checkpoints of it (C2SP tlog-checkpoint in a signed note).
// The archiver keeps the tree's right edge only (a compact range: O(log n) hashes) and signs a
// checkpoint every so many records or seconds; an auditor, with nothing but the public key,
// checks that each checkpoint is signed, that the log only grew between two of them, and that the
// stream, the archive and a bundle hold exactly the records the tree holds.
//
// Libraries, chosen over writing any of it by hand: golang.org/x/mod/sumdb/tlog (the tree's
// hashes, its inclusion and consistency proofs), golang.org/x/mod/sumdb/note (ed25519 signed
// notes), github.com/transparency-dev/merkle/compact (the compact range) and
// github.com/transparency-dev/formats/log (the checkpoint's text).
package auditlog

import (
	"crypto/sha256"
	"encoding/binary"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// Subject is where the archiver publishes PROMPTS' checkpoints, in the AUDIT stream.
const Subject = "audit.checkpoint.prompts"

// Origin names one log: a PROMPTS stream, by the name of the deployment and the stream's creation
// time (its identity: a stream made again is a new log, whose positions start again at 0).
func Origin(name string, created time.Time) string {
	return name + "/PROMPTS/" + created.UTC().Format(time.RFC3339Nano)
}

// Position is where the message of PROMPTS sequence seq sits in the log: sequences start at 1,
// positions at 0, and PROMPTS refuses deletes and purges, so the two never part.
func Position(seq uint64) int64 { return int64(seq) - 1 }

// LeafData is what the log commits to for one message: its sequence, its subject and its body
// as the stream stored them (each length-prefixed, so no two messages share a leaf).
func LeafData(seq uint64, subject string, body []byte) []byte {
	b := make([]byte, 0, 8+4+len(subject)+4+len(body))
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, uint32(len(subject)))
	b = append(b, subject...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// LeafHash is the leaf's hash in the tree: RFC 9162's hash of a leaf, SHA-256 of 0x00 and
// LeafData (tlog.RecordHash of it), written piece by piece: a record is not copied to be hashed.
func LeafHash(seq uint64, subject string, body []byte) tlog.Hash {
	var head [1 + 8 + 4]byte
	head[0] = 0x00 // RFC 9162's prefix of a leaf
	binary.BigEndian.PutUint64(head[1:], seq)
	binary.BigEndian.PutUint32(head[9:], uint32(len(subject)))
	h := sha256.New()
	h.Write(head[:])
	h.Write([]byte(subject))
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(body)))
	h.Write(n[:])
	h.Write(body)
	var out tlog.Hash
	h.Sum(out[:0])
	return out
}
