package auditlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// NewKey makes a signing key for a log named name: the private key (only the archiver reads it,
// from a file) and the public key (all an auditor needs), each in signed-note form.
func NewKey(name string) (private, public string, err error) {
	return note.GenerateKey(rand.Reader, name)
}

// LoadKey reads the private key from path: the signer, and the verifier of what it signs (a
// keeper checks the checkpoint it resumes from with it).
func LoadKey(path string) (note.Signer, note.Verifier, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("the audit log's signing key: %w", err)
	}
	private := strings.TrimSpace(string(b))
	// The key's text is never printed: it is the secret.
	notKey := fmt.Errorf("the audit log's signing key in %s is not a signed-note ed25519 private key (podium audit keygen makes one)", path)
	s, err := note.NewSigner(private)
	if err != nil {
		return nil, nil, notKey
	}
	// PRIVATE+KEY+<name>+<hash>+<base64 of the algorithm byte and the ed25519 seed>
	parts := strings.SplitN(private, "+", 5) // the key itself is base64: it may hold a +
	if len(parts) != 5 {
		return nil, nil, notKey
	}
	key, err := base64.StdEncoding.DecodeString(parts[4])
	if err != nil || len(key) != 1+ed25519.SeedSize || key[0] != 1 {
		return nil, nil, notKey
	}
	public, err := note.NewEd25519VerifierKey(s.Name(), ed25519.NewKeyFromSeed(key[1:]).Public().(ed25519.PublicKey))
	if err != nil {
		return nil, nil, notKey
	}
	v, err := note.NewVerifier(public)
	if err != nil || v.KeyHash() != s.KeyHash() {
		return nil, nil, notKey
	}
	return s, v, nil
}

// Verifier reads a public key.
func Verifier(public string) (note.Verifier, error) {
	v, err := note.NewVerifier(strings.TrimSpace(public))
	if err != nil {
		return nil, fmt.Errorf("the audit log's public key %q: %w (podium audit keygen prints one)", public, err)
	}
	return v, nil
}
