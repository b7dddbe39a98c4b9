package auditlog

import (
	"errors"
	"fmt"

	"github.com/transparency-dev/formats/log"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Checkpoint is a signed statement of the log: which log (its origin), how many records it held,
// and the root of the tree over them.
type Checkpoint struct {
	Origin string
	Size   int64
	Root   tlog.Hash
	Signed []byte // the signed note as published: what an auditor keeps and passes as --since
}

// Sign makes the checkpoint of a log of size records whose tree has root, signed by signer.
func Sign(origin string, size int64, root tlog.Hash, signer note.Signer) (Checkpoint, error) {
	text := log.Checkpoint{Origin: origin, Size: uint64(size), Hash: root[:]}.Marshal()
	signed, err := note.Sign(&note.Note{Text: string(text)}, signer)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("sign the checkpoint of %s at size %d: %w", origin, size, err)
	}
	return Checkpoint{Origin: origin, Size: size, Root: root, Signed: signed}, nil
}

// ErrNotSigned is a checkpoint whose note the verifier does not verify: signed by another key,
// or changed since it was signed.
var ErrNotSigned = errors.New("the checkpoint is not signed by the log's key")

// Open reads a signed checkpoint, checking its signature with verifier.
func Open(signed []byte, verifier note.Verifier) (Checkpoint, error) {
	n, err := note.Open(signed, note.VerifierList(verifier))
	if err != nil {
		var unknown *note.UnverifiedNoteError
		if errors.As(err, &unknown) {
			return Checkpoint{}, ErrNotSigned
		}
		var invalid *note.InvalidSignatureError
		if errors.As(err, &invalid) {
			return Checkpoint{}, fmt.Errorf("%w: %v", ErrNotSigned, err)
		}
		return Checkpoint{}, fmt.Errorf("not a signed checkpoint: %w", err)
	}
	var c log.Checkpoint
	if _, err := c.Unmarshal([]byte(n.Text)); err != nil {
		return Checkpoint{}, fmt.Errorf("not a checkpoint: %w", err)
	}
	if len(c.Hash) != tlog.HashSize || c.Size > 1<<62 {
		return Checkpoint{}, fmt.Errorf("not a checkpoint: a root of %d bytes, size %d", len(c.Hash), c.Size)
	}
	out := Checkpoint{Origin: c.Origin, Size: int64(c.Size), Signed: signed}
	copy(out.Root[:], c.Hash)
	return out, nil
}
