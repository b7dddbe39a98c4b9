package builders_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
)

// moduleBytes are n bytes that do not repeat in any short period (a compressed stream cannot make
// them small).
func moduleBytes(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// chunk publishes one chunk of a push by hand: what a writer of the stream may append.
func chunk(t *testing.T, js jetstream.JetStream, sha string, i, n, size int, push uint64, data []byte, header ...string) uint64 {
	t.Helper()
	m := nats.NewMsg("builders.modules." + sha)
	m.Data = data
	m.Header.Set("Podium-Module-Chunk", fmt.Sprintf("%d/%d", i, n))
	m.Header.Set("Podium-Module-Size", strconv.Itoa(size))
	if push > 0 {
		m.Header.Set("Podium-Module-Push", strconv.FormatUint(push, 10))
	}
	for k := 0; k+1 < len(header); k += 2 {
		m.Header.Set(header[k], header[k+1])
	}
	ack, err := js.PublishMsg(t.Context(), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestModuleStoreOnlyGrows on a real JetStream: a module of several chunks reads back whole and is
// stored once however often it is put; pushes of the same bytes that interleave are told apart;
// chunks appended under a module's sha256 by anyone who may write the stream never make a read
// wrong (at worst it fails, and a put mends it); and nobody, whatever their permissions, can roll
// the store up, purge it or delete a message of it.
func TestModuleStoreOnlyGrows(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	store, err := builders.OpenStore(ctx, js, builders.ModulesConfig(1), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builders.OpenStore(ctx, js, builders.ReleasesConfig(1), false); err == nil {
		t.Fatal("a missing store was opened without being made")
	}
	msgs := func() uint64 {
		st, err := js.Stream(ctx, builders.Modules)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().State.Msgs
	}
	version := func(b []byte) builders.Version {
		return builders.Version{Name: "m", Version: 1, SHA256: wasm.SHA256(b), Size: int64(len(b))}
	}

	// Several chunks, stored once.
	big := moduleBytes(300<<10, 1)
	for range 2 {
		if err := store.Put(ctx, big); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := store.Module(ctx, version(big)); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read %d bytes, %v; want the %d put", len(got), err, len(big))
	}
	if n := msgs(); n != 3 {
		t.Fatalf("the store holds %d messages after putting 300 KiB twice; want its 3 chunks once", n)
	}

	// Two pushes of the same bytes, interleaved: each whole one is the module.
	small := moduleBytes(3000, 2)
	sha, half := wasm.SHA256(small), small[:1500]
	a := chunk(t, js, sha, 0, 2, len(small), 0, half)
	b := chunk(t, js, sha, 0, 2, len(small), 0, half)
	chunk(t, js, sha, 1, 2, len(small), b, small[1500:])
	if got, err := store.Module(ctx, version(small)); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("interleaved pushes (first chunks at %d and %d): %v", a, b, err)
	}

	// Chunks appended by a writer of the stream: other bytes under the sha256, a chunk that claims
	// another push's place, a size that is not the version's, no headers at all.
	victim := moduleBytes(3000, 3)
	vsha := wasm.SHA256(victim)
	first := chunk(t, js, vsha, 0, 2, len(victim), 0, victim[:1500])
	chunk(t, js, vsha, 1, 2, len(victim), first, moduleBytes(1500, 9)) // takes the place of the real second chunk
	chunk(t, js, vsha, 1, 2, len(victim), first, victim[1500:])
	chunk(t, js, vsha, 0, 1, 10, 0, []byte("0123456789"))
	plain := nats.NewMsg("builders.modules." + vsha)
	plain.Data = victim
	if _, err := js.PublishMsg(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Module(ctx, version(victim)); err == nil {
		t.Fatalf("read %d bytes of a push whose second chunk was forged", len(got))
	} else if !strings.Contains(err.Error(), "not in BUILDER_MODULES whole") {
		t.Fatalf("a push whose second chunk was forged: %v", err)
	}
	if err := store.Put(ctx, victim); err != nil { // the author pushes again
		t.Fatal(err)
	}
	if got, err := store.Module(ctx, version(victim)); err != nil || !bytes.Equal(got, victim) {
		t.Fatalf("after pushing again: %v", err)
	}
	forged := moduleBytes(3000, 4)
	chunk(t, js, wasm.SHA256(forged), 0, 1, len(forged), 0, moduleBytes(3000, 5))
	if _, err := store.Module(ctx, version(forged)); err == nil {
		t.Fatal("bytes under a sha256 that are not its module were read as it")
	}

	// Sealed: a rollup, a purge and a message's delete are refused by the stream itself.
	before := msgs()
	rollup := nats.NewMsg("builders.modules." + sha)
	rollup.Header.Set("Nats-Rollup", "all")
	if _, err := js.PublishMsg(ctx, rollup); err == nil || !strings.Contains(err.Error(), "rollup") {
		t.Errorf("a rollup of the store: %v, want it refused", err)
	}
	st, err := js.Stream(ctx, builders.Modules)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err == nil {
		t.Error("the store was purged")
	}
	if err := st.DeleteMsg(ctx, 1); err == nil {
		t.Error("a message of the store was deleted")
	}
	if n := msgs(); n != before {
		t.Errorf("the store holds %d messages, %d before the rollup, purge and delete", n, before)
	}
	if got, err := store.Module(ctx, version(big)); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("after the rollup, purge and delete: %v", err)
	}
}

// TestLegacyObjectStoreIsCopied: an older Podium's object store of modules is copied into the
// module stream, each module checked against its name; an object not named by its bytes' sha256
// is left.
func TestLegacyObjectStoreIsCopied(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	old, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: builders.LegacyModules})
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := moduleBytes(200<<10, 6), []byte("a small module")
	for _, m := range [][]byte{m1, m2} {
		if _, err := old.PutBytes(ctx, wasm.SHA256(m), m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := old.PutBytes(ctx, "notes.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	liar := strings.Repeat("ab", 32)
	if _, err := old.PutBytes(ctx, liar, []byte("not the bytes of its name")); err != nil {
		t.Fatal(err)
	}
	l, err := builders.FindLegacy(ctx, js, builders.LegacyModules, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Missing) != 3 || len(l.Foreign) != 1 || l.Foreign[0] != "notes.txt" {
		t.Fatalf("missing %v, foreign %v; want 3 named by a sha256 and notes.txt", l.Missing, l.Foreign)
	}
	store, err := builders.OpenStore(ctx, js, builders.ModulesConfig(1), true)
	if err != nil {
		t.Fatal(err)
	}
	n, err := l.Copy(ctx, store)
	if n != 2 || err == nil || !strings.Contains(err.Error(), liar+" holds bytes of sha256") {
		t.Fatalf("copied %d, %v; want 2 and the one whose bytes are not its name refused", n, err)
	}
	for _, m := range [][]byte{m1, m2} {
		v := builders.Version{Name: "m", SHA256: wasm.SHA256(m), Size: int64(len(m))}
		if got, err := store.Module(ctx, v); err != nil || !bytes.Equal(got, m) {
			t.Fatalf("the copy of %.12s…: %v", v.SHA256, err)
		}
	}
	if l, err = builders.FindLegacy(ctx, js, builders.LegacyModules, store); err != nil || len(l.Missing) != 1 || l.Missing[0] != liar {
		t.Fatalf("after the copy: missing %v, %v; want only the liar", l.Missing, err)
	}
}

// TestAStoreNotSealedIsRefused: a module stream made by hand with rollups allowed and a republish
// into the releases' subjects (what an author who could make the stream first would do) is not
// opened: it could not be trusted to keep what was pushed.
func TestAStoreNotSealedIsRefused(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	cfg := builders.ModulesConfig(1)
	cfg.AllowRollup, cfg.DenyPurge = true, false // the server takes rollups only where purges are allowed
	cfg.RePublish = &jetstream.RePublish{Source: "builders.modules.*", Destination: "builders.releases.{{wildcard(1)}}"}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	_, err := builders.OpenStore(ctx, js, builders.ModulesConfig(1), false)
	if err == nil || !strings.Contains(err.Error(), "not sealed") || !strings.Contains(err.Error(), "allow_rollup_hdrs") || !strings.Contains(err.Error(), "republish") {
		t.Fatalf("an unsealed store opened: %v", err)
	}
}

// TestJunkUnderAModuleNeitherBlocksNorBloatsAReader: thousands of first chunks that each claim a
// module of many chunks, appended before a module's push, hold the reader to one run at a time:
// the push after them is read, quickly, and a push pushed again after junk is found.
func TestJunkUnderAModuleNeitherBlocksNorBloatsAReader(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	store, err := builders.OpenStore(ctx, js, builders.ModulesConfig(1), true)
	if err != nil {
		t.Fatal(err)
	}
	module := moduleBytes(64<<10, 7)
	sha := wasm.SHA256(module)
	for range 2000 {
		chunk(t, js, sha, 0, 64, len(module), 0, nil) // a first chunk of 64, never followed
	}
	if err := store.Put(ctx, module); err != nil {
		t.Fatal(err)
	}
	v := builders.Version{Name: "m", SHA256: sha, Size: int64(len(module))}
	if got, err := store.Module(ctx, v); err != nil || !bytes.Equal(got, module) {
		t.Fatalf("the module after 2000 junk first chunks: %v", err)
	}
	bad := builders.Version{Name: "m", SHA256: strings.ToUpper(sha), Size: v.Size}
	if _, err := store.Module(ctx, bad); err == nil || !strings.Contains(err.Error(), "not a sha256") {
		t.Fatalf("a version named by no sha256: %v", err)
	}
}
