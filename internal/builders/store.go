package builders

import (
	"bytes"
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
// of its push's first (Podium-Module-Push), so pushes of the same bytes that interleave are told
// apart. What is read is checked against the version's size and sha256: bytes that anyone appended
// under a module's subject can make a read slower, or fail it (a push pushed again mends that),
// never wrong.

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
// when it is missing (never changing one that exists: that is the operator's, `podium streams
// apply`). A missing stream that is not made is ErrNoStore.
func OpenStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig, create bool) (*Store, error) {
	_, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if !create {
			return nil, fmt.Errorf("%w: %s", ErrNoStore, cfg.Name)
		}
		if _, err = js.CreateStream(ctx, cfg); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // made meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("builders: module store %s: %w", cfg.Name, err)
	}
	return &Store{js: js, stream: cfg.Name, prefix: strings.TrimSuffix(cfg.Subjects[0], ".*")}, nil
}

// Name is the store's stream.
func (s *Store) Name() string { return s.stream }

// errFound stops a scan that found the module.
var errFound = errors.New("found")

// Module reads a version's bytes: the first push of them whose chunks are whole, of the
// version's size and sha256.
func (s *Store) Module(ctx context.Context, v Version) ([]byte, error) {
	if v.Size < 0 || v.Size > MaxModuleBytes {
		return nil, fmt.Errorf("builders: the module of %s@%d is said to be %d bytes", v.Name, v.Version, v.Size)
	}
	type push struct {
		parts [][]byte
		have  int
	}
	pushes := map[uint64]*push{}
	var found []byte
	held, bad := 0, 0
	_, err := streamscan.Scan(ctx, s.js, s.stream, s.prefix+"."+v.SHA256, 0, func(m jetstream.Msg) error {
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		i, n, ok := chunkOf(m.Headers())
		size, err := strconv.ParseInt(m.Headers().Get(headerSize), 10, 64)
		if !ok || err != nil || size != v.Size || n > int(v.Size/1024)+1 || len(m.Data()) > int(v.Size) {
			bad++
			return nil
		}
		first := md.Sequence.Stream
		if i > 0 {
			if first, err = strconv.ParseUint(m.Headers().Get(headerPush), 10, 64); err != nil {
				bad++
				return nil
			}
		}
		p := pushes[first]
		switch {
		case i == 0 && p == nil:
			p = &push{parts: make([][]byte, n)}
			pushes[first] = p
		case p == nil || len(p.parts) != n || p.parts[i] != nil:
			bad++ // a chunk of no push read, or one a push already has
			return nil
		}
		if held += len(m.Data()); held > 2*MaxModuleBytes {
			return fmt.Errorf("builders: %s holds over %d bytes of pushes of %.12s… that are not whole", s.stream, 2*MaxModuleBytes, v.SHA256)
		}
		p.parts[i] = m.Data()
		if p.have++; p.have < n {
			return nil
		}
		b := bytes.Join(p.parts, nil)
		delete(pushes, first)
		held -= len(b)
		if int64(len(b)) == v.Size && wasm.SHA256(b) == v.SHA256 {
			found = b
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
		return nil, fmt.Errorf("builders: the module of %s@%d is not in %s whole (%d chunks of other sizes or bytes under its sha256 %.12s…)", v.Name, v.Version, s.stream, bad, v.SHA256)
	}
	return nil, fmt.Errorf("builders: the module of %s@%d (sha256 %.12s…) is not in %s", v.Name, v.Version, v.SHA256, s.stream)
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

// Put stores module's bytes, named by their sha256, unless the store holds them whole already.
func (s *Store) Put(ctx context.Context, module []byte) error {
	v := Version{Name: "the pushed module", SHA256: wasm.SHA256(module), Size: int64(len(module))}
	if _, err := s.Module(ctx, v); err == nil {
		return nil
	}
	size := max(1, min(chunkBytes, int(s.js.Conn().MaxPayload())-4<<10))
	n := max(1, (len(module)+size-1)/size)
	subject := s.prefix + "." + v.SHA256
	var first uint64
	for i := range n {
		msg := nats.NewMsg(subject)
		msg.Data = module[min(i*size, len(module)):min((i+1)*size, len(module))]
		msg.Header.Set(headerChunk, fmt.Sprintf("%d/%d", i, n))
		msg.Header.Set(headerSize, strconv.Itoa(len(module)))
		var opts []jetstream.PublishOpt
		if i > 0 {
			msg.Header.Set(headerPush, strconv.FormatUint(first, 10))
			// A chunk sent again (an ack lost) is stored once.
			opts = append(opts, jetstream.WithMsgID(fmt.Sprintf("%s %d %d", v.SHA256, first, i)))
		}
		ack, err := s.js.PublishMsg(ctx, msg, opts...)
		if err != nil {
			return fmt.Errorf("builders: store the module in %s: %w", s.stream, err)
		}
		if i == 0 {
			first = ack.Sequence
		}
	}
	return nil
}
