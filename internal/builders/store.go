package builders

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/events"
)

// Modules' bytes are kept in two plain streams that only grow, not in object stores. An object
// store cannot refuse a rollup: each object's put is itself a rollup of its metadata subject, so
// its stream must allow rollup headers, and whoever may put an object may also send `Nats-Rollup:
// all` and empty the store (NATS permissions see subjects, not headers). A plain stream made with
// no rollups, no deletes and no purges refuses all three to everyone, so whoever may write it can
// only add: an author cannot remove or change a module anyone pushed, nor the release role one that
// production serves.
//
// A module is stored as chunks on the subject of its sha256 (`<prefix>.<sha256>`), each with its
// index and count ("i/n") and the module's size; every chunk after the first names the sequence
// of its push's first (Podium-Module-Push) and is stored only as the very next message on the
// subject after the chunk before it (the publish expects that last sequence on the subject), so a
// push is a run of consecutive messages that nothing can interleave. A reader takes the first whole
// run of the version's size and sha256, holding one run at a time: what anyone appends under a
// module's subject can make a push fail (it says so and is tried again), never make a read wrong,
// large, or blocked for good.

// Headers of a module's chunks.
const (
	headerChunk = "Podium-Module-Chunk" // "i/n"
	headerSize  = "Podium-Module-Size"  // the whole module's bytes
	headerPush  = "Podium-Module-Push"  // the sequence of the push's first chunk (not on the first)
)

// chunkBytes is the most bytes a chunk holds: under any server's max payload (1 MiB by default).
const chunkBytes = 128 << 10

// Streams of the modules authors push, and of those production serves (copied there by the
// release role when it labels a version production).
const (
	Modules  = "BUILDER_MODULES"
	Releases = "BUILDER_RELEASES"
)

// ModulesConfig is the stream of the modules authors push.
func ModulesConfig(replicas int) jetstream.StreamConfig {
	return storeConfig(Modules, "builders.modules", "podium prompt builders: the modules' bytes authors pushed, by sha256", replicas)
}

// ReleasesConfig is the stream of the modules labelled production: what composers load.
func ReleasesConfig(replicas int) jetstream.StreamConfig {
	return storeConfig(Releases, "builders.releases", "podium prompt builders: the modules production serves, by sha256", replicas)
}

func storeConfig(name, prefix, description string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        name,
		Description: description,
		Subjects:    []string{prefix + ".*"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    max(replicas, 1),
		Duplicates:  2 * time.Minute,
		MaxBytes:    -1,
		MaxMsgs:     -1,
		MaxMsgSize:  -1,
		Discard:     jetstream.DiscardNew,
		// A Go module's bytes compress to about a quarter.
		Compression: jetstream.S2Compression,
		AllowDirect: true,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowRollup: false,
	}
}

// Store is one of the module streams.
type Store struct {
	js     jetstream.JetStream
	stream string
	prefix string
}

// ErrNoStore is a store whose stream does not exist (nothing was pushed, or released, yet).
var ErrNoStore = errors.New("builders: no module store")

// OpenStore opens the store of cfg (ModulesConfig or ReleasesConfig); create makes its stream
// when it is missing (a service under MANAGE_STREAMS, or the operator: never an author, who could
// make it unsealed). A missing stream that is not made is ErrNoStore; one that is not sealed as
// cfg (rollups, a republish, limits that drop modules, sources) is refused, naming how it
// differs: it could not be trusted to hold what was pushed (`podium streams apply` seals what it
// can).
func OpenStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, create bool) (*Store, error) {
	st, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if !create {
			return nil, fmt.Errorf("%w: %s", ErrNoStore, cfg.Name)
		}
		if st, err = js.CreateStream(ctx, cfg); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, err = js.Stream(ctx, cfg.Name) // made meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("builders: module store %s: %w", cfg.Name, err)
	}
	if d := StoreDrift(st.CachedInfo().Config, cfg); len(d.Fields) > 0 || !d.Mendable {
		return nil, fmt.Errorf("builders: module store %s is not sealed as Podium makes it (%s): `podium streams apply` seals it, or, where it cannot (sources, a mirror), the operator makes it again", cfg.Name, strings.Join(d.Fields, "; "))
	}
	return &Store{js: js, stream: cfg.Name, prefix: strings.TrimSuffix(cfg.Subjects[0], ".*")}, nil
}

// Drift is how a module store's stream differs from its sealed configuration.
type Drift struct {
	events.Drift
	// Mendable is false when an update cannot seal it (a mirror or sources: the stream must be
	// made again).
	Mendable bool
}

// StoreDrift is how have differs from cfg in what a module store must be: its subjects, no
// rollups, deletes or purges, no republish, no limit that would drop a module, direct gets.
func StoreDrift(have, cfg jetstream.StreamConfig) Drift {
	next := have
	next.Description, next.Subjects, next.Replicas = cfg.Description, cfg.Subjects, cfg.Replicas
	next.AllowRollup, next.DenyDelete, next.DenyPurge, next.AllowDirect = false, true, true, true
	next.RePublish, next.MaxAge, next.MaxMsgs, next.MaxBytes, next.MaxMsgsPerSubject = nil, 0, -1, -1, -1
	next.MaxMsgSize, next.Discard = -1, jetstream.DiscardNew
	if have.MaxMsgsPerSubject == 0 {
		next.MaxMsgsPerSubject = 0 // the server's "no limit" as it reports it
	}
	if have.MaxMsgSize == 0 {
		next.MaxMsgSize = 0
	}
	return Drift{Drift: events.Drift{Stream: have.Name, Fields: events.ConfigDiff(have, next), Next: next},
		Mendable: have.Mirror == nil && len(have.Sources) == 0}
}

// Name is the store's stream.
func (s *Store) Name() string { return s.stream }

// errFound stops a scan that found the module.
var errFound = errors.New("found")

// minChunk is the least chunk a push cuts (a server's max payload under it refuses the push),
// and so the most chunks a module of n bytes has: n/minChunk + 1.
const minChunk = 1 << 10

// Module reads a version's bytes: the first whole push of them (its chunks consecutive on the
// subject) of the version's size and sha256.
func (s *Store) Module(ctx context.Context, v Version) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("builders: the module of %s@%d: %w", v.Name, v.Version, ErrNoStore)
	}
	if !isDigest(v.SHA256) {
		return nil, fmt.Errorf("builders: the module of %s@%d is named by %s, not a sha256", v.Name, v.Version, events.Quote(v.SHA256))
	}
	if v.Size < 0 || v.Size > MaxModuleBytes {
		return nil, fmt.Errorf("builders: the module of %s@%d is said to be %d bytes", v.Name, v.Version, v.Size)
	}
	// run is the push being read: its first chunk's sequence, its count, the bytes so far.
	var run struct {
		first uint64
		n, i  int
		bytes []byte
	}
	var found []byte
	bad := 0
	_, err := streamscan.Scan(ctx, s.js, s.stream, s.prefix+"."+v.SHA256, 0, func(m jetstream.Msg) error {
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		i, n, ok := chunkOf(m.Headers())
		size, err := strconv.ParseInt(m.Headers().Get(headerSize), 10, 64)
		if !ok || err != nil || size != v.Size || n > int(v.Size/minChunk)+1 || len(m.Data()) > int(v.Size) {
			run.n, bad = 0, bad+1
			return nil
		}
		if i == 0 {
			run.first, run.n, run.i, run.bytes = md.Sequence.Stream, n, 0, run.bytes[:0]
		} else if push, err := strconv.ParseUint(m.Headers().Get(headerPush), 10, 64); err != nil || run.n != n || run.i != i || push != run.first {
			// Not the next chunk of the run being read: that run is broken; a new one starts
			// at the next first chunk.
			run.n, bad = 0, bad+1
			return nil
		}
		if len(run.bytes)+len(m.Data()) > int(v.Size) {
			run.n, bad = 0, bad+1
			return nil
		}
		run.bytes, run.i = append(run.bytes, m.Data()...), i+1
		if run.i < run.n {
			return nil
		}
		run.n = 0
		if int64(len(run.bytes)) == v.Size && wasm.SHA256(run.bytes) == v.SHA256 {
			found = run.bytes
			return errFound
		}
		bad++
		return nil
	})
	switch {
	case errors.Is(err, errFound):
		return found, nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("builders: the module of %s@%d: %w: %s", v.Name, v.Version, ErrNoStore, s.stream)
	case err != nil:
		return nil, fmt.Errorf("builders: the module of %s@%d: %w", v.Name, v.Version, err)
	case bad > 0:
		return nil, fmt.Errorf("builders: the module of %s@%d is not in %s whole (%d chunks or pushes of other sizes or bytes under its sha256 %.12s…)", v.Name, v.Version, s.stream, bad, v.SHA256)
	}
	return nil, fmt.Errorf("builders: the module of %s@%d (sha256 %.12s…) is not in %s", v.Name, v.Version, v.SHA256, s.stream)
}

// isDigest reports whether d is a sha256 as the registry writes it: 64 lowercase hex digits.
func isDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	for _, c := range d {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// chunkOf is a chunk's index and count.
func chunkOf(h nats.Header) (i, n int, ok bool) {
	a, b, ok := strings.Cut(h.Get(headerChunk), "/")
	if !ok {
		return 0, 0, false
	}
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	return i, n, err1 == nil && err2 == nil && n > 0 && i >= 0 && i < n
}

// pushTries bounds how often a push whose run something interleaved is tried again.
const pushTries = 3

// Put stores module's bytes, named by their sha256, unless the store holds them whole already; it
// returns once they read back whole, or with why they could not be stored.
func (s *Store) Put(ctx context.Context, module []byte) error {
	v := Version{Name: "the pushed module", SHA256: wasm.SHA256(module), Size: int64(len(module))}
	if v.Size > MaxModuleBytes {
		return fmt.Errorf("builders: the module is %d bytes, over %d", v.Size, MaxModuleBytes)
	}
	size := min(chunkBytes, int(s.js.Conn().MaxPayload())-4<<10)
	if size < minChunk {
		return fmt.Errorf("builders: the server's max payload (%d bytes) leaves no room for a module's chunk of %d bytes", s.js.Conn().MaxPayload(), minChunk)
	}
	var err error
	for range pushTries {
		if _, err = s.Module(ctx, v); err == nil {
			return nil
		}
		if err = s.push(ctx, module, v.SHA256, size); err != nil {
			continue
		}
		if _, err = s.Module(ctx, v); err == nil {
			return nil
		}
	}
	return fmt.Errorf("builders: store the module in %s (tried %d times): %w", s.stream, pushTries, err)
}

// push publishes module's chunks as one run: each after the first only as the next message on the
// subject after the one before it.
func (s *Store) push(ctx context.Context, module []byte, sha string, size int) error {
	n := max(1, (len(module)+size-1)/size)
	subject := s.prefix + "." + sha
	var first, prev uint64
	for i := range n {
		msg := nats.NewMsg(subject)
		msg.Data = module[min(i*size, len(module)):min((i+1)*size, len(module))]
		msg.Header.Set(headerChunk, fmt.Sprintf("%d/%d", i, n))
		msg.Header.Set(headerSize, strconv.Itoa(len(module)))
		var opts []jetstream.PublishOpt
		if i > 0 {
			msg.Header.Set(headerPush, strconv.FormatUint(first, 10))
			opts = append(opts, jetstream.WithExpectLastSequencePerSubject(prev))
		}
		ack, err := s.js.PublishMsg(ctx, msg, opts...)
		if err != nil {
			return fmt.Errorf("chunk %d of %d: %w", i+1, n, err)
		}
		if ack.Duplicate {
			return fmt.Errorf("chunk %d of %d was taken for a duplicate", i+1, n)
		}
		if i == 0 {
			first = ack.Sequence
		}
		prev = ack.Sequence
	}
	return nil
}
