package auditlog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

func leaves(n int) []tlog.Hash {
	out := make([]tlog.Hash, n)
	for i := range out {
		out[i] = LeafHash(uint64(i+1), fmt.Sprintf("prompt.composed.x.t%d", i%3), []byte(fmt.Sprintf(`{"id":"p-%d"}`, i)))
	}
	return out
}

func key(t testing.TB, name string) (path, public string) {
	t.Helper()
	private, public, err := NewKey(name)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(private+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, public
}

// TestTheKeepersTreeIsTheAuditorsTree: the keeper's compact range and the auditor's whole tree
// give the same root at every size; a tree resumed from a checkpoint and its edge goes on to the
// same roots; an edge that does not give the checkpoint's root is refused.
func TestTheKeepersTreeIsTheAuditorsTree(t *testing.T) {
	ls := leaves(300)
	keeper, auditor := NewTree(), &Hashes{}
	signerPath, _ := key(t, "podium-test")
	signer, verifier, err := LoadKey(signerPath)
	if err != nil {
		t.Fatal(err)
	}
	var resumed *Tree
	for i, l := range ls {
		if err := keeper.Append(l); err != nil {
			t.Fatal(err)
		}
		if err := auditor.Add(l); err != nil {
			t.Fatal(err)
		}
		if resumed != nil {
			if err := resumed.Append(l); err != nil {
				t.Fatal(err)
			}
		}
		size := int64(i + 1)
		kr, err := keeper.Root()
		if err != nil {
			t.Fatal(err)
		}
		ar, err := auditor.Root(size)
		if err != nil || kr != ar {
			t.Fatalf("size %d: the keeper's root %v, the auditor's %v (%v)", size, kr, ar, err)
		}
		if resumed != nil {
			if rr, _ := resumed.Root(); rr != kr {
				t.Fatalf("size %d: the resumed tree's root differs", size)
			}
		}
		if size == 137 {
			c, err := Sign("podium-test/PROMPTS/x", size, kr, signer)
			if err != nil {
				t.Fatal(err)
			}
			opened, err := Open(c.Signed, verifier)
			if err != nil || opened.Size != size || opened.Root != kr {
				t.Fatalf("open: %+v, %v", opened, err)
			}
			if resumed, err = ResumeTree(opened, keeper.Edge()); err != nil {
				t.Fatal(err)
			}
			forged := keeper.Edge()
			forged[0][0] ^= 1
			if _, err := ResumeTree(opened, forged); err == nil {
				t.Fatal("an edge that does not give the checkpoint's root was taken")
			}
		}
	}
}

// TestProofs: an inclusion proof checks for the leaf it was made for and no other; a consistency
// proof checks between a tree and its extension, and fails against a tree with a leaf changed.
func TestProofs(t *testing.T) {
	ls := leaves(100)
	h := &Hashes{}
	for _, l := range ls {
		if err := h.Add(l); err != nil {
			t.Fatal(err)
		}
	}
	root, _ := h.Root(100)
	for _, i := range []int64{0, 1, 37, 63, 64, 99} {
		p, err := h.Inclusion(i, 100)
		if err != nil {
			t.Fatal(err)
		}
		if err := tlog.CheckRecord(p, 100, root, i, ls[i]); err != nil {
			t.Errorf("leaf %d: %v", i, err)
		}
		if err := tlog.CheckRecord(p, 100, root, i, ls[(i+1)%100]); err == nil {
			t.Errorf("leaf %d: the proof checked for another leaf", i)
		}
	}
	old, _ := h.Root(40)
	p, err := h.Consistency(40, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := tlog.CheckTree(p, 100, root, 40, old); err != nil {
		t.Fatalf("a log that only grew: %v", err)
	}
	changed := &Hashes{}
	for i, l := range ls {
		if i == 17 {
			l[0] ^= 1
		}
		if err := changed.Add(l); err != nil {
			t.Fatal(err)
		}
	}
	p2, _ := changed.Consistency(40, 100)
	root2, _ := changed.Root(100)
	if err := tlog.CheckTree(p2, 100, root2, 40, old); err == nil {
		t.Fatal("a log with position 17 changed checked as an extension of the one signed at 40")
	}
}

// TestCheckpointsAreSigned: a checkpoint opens with its key; with another key, or changed by one
// byte, it is refused as not signed.
func TestCheckpointsAreSigned(t *testing.T) {
	signerPath, _ := key(t, "podium-test")
	signer, verifier, err := LoadKey(signerPath)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPublic := key(t, "podium-test")
	other, err := Verifier(otherPublic)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Sign(Origin("podium-test", time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)), 12, leaves(1)[0], signer)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(c.Signed, []byte("podium-test/PROMPTS/2026-11-28T00:00:00Z\n12\n")) {
		t.Errorf("the checkpoint's text:\n%s", c.Signed)
	}
	if _, err := Open(c.Signed, other); !errors.Is(err, ErrNotSigned) {
		t.Errorf("opened with another key: %v", err)
	}
	changed := bytes.Replace(c.Signed, []byte("\n12\n"), []byte("\n13\n"), 1)
	if _, err := Open(changed, verifier); !errors.Is(err, ErrNotSigned) {
		t.Errorf("a checkpoint changed after signing: %v", err)
	}
	if _, _, err := LoadKey(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing key file was read")
	}
	bad := filepath.Join(t.TempDir(), "bad")
	_ = os.WriteFile(bad, []byte("PRIVATE+KEY+x+00000000+AAAA"), 0o600)
	if _, _, err := LoadKey(bad); err == nil || bytes.Contains([]byte(err.Error()), []byte("AAAA")) {
		t.Errorf("a bad key: %v (the key's text must not be printed)", err)
	}
}

// TestLeafHashIsTheRecordHashOfLeafData: the leaf's hash, written piece by piece, is RFC 9162's
// hash of LeafData (tlog.RecordHash), the rule docs/audit.md states.
func TestLeafHashIsTheRecordHashOfLeafData(t *testing.T) {
	for _, body := range []string{"", "{}", strings.Repeat("x", 70000)} {
		if got, want := LeafHash(42, "prompt.composed.a.b", []byte(body)), tlog.RecordHash(LeafData(42, "prompt.composed.a.b", []byte(body))); got != want {
			t.Errorf("a body of %d bytes: %v, want %v", len(body), got, want)
		}
	}
}
