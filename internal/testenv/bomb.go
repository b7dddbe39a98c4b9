package testenv

import (
	"bytes"
	"compress/gzip"
)

// BundleBomb is an export bundle's header followed by mib MiB of blanks, gzip-compressed: a small
// file that unfolds to far more, as an auditor may be handed (docs/security.md).
func BundleBomb(mib int) []byte {
	var bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&bomb, gzip.BestSpeed) // blanks compress well at any level; this one is cheap
	zw.Write([]byte(`{"format": "podium-bundle/1", "execution_id": "x", "padding": "`))
	blanks := bytes.Repeat([]byte(" "), 1<<20)
	for range mib {
		zw.Write(blanks)
	}
	zw.Write([]byte(`"}`))
	zw.Close()
	return bomb.Bytes()
}
