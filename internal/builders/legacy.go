package builders

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/wasm"
)

// Legacy is what a legacy object store holds that store lacks: the modules to copy.
type Legacy struct {
	Bucket  string   // the object store
	Missing []string // sha256s of the modules store lacks
	Foreign []string // objects not named by their bytes' sha256: never copied
	objects jetstream.ObjectStore
}

// FindLegacy compares the object store bucket (LegacyModules or LegacyReleases), if there is one,
// with store; a missing object store is a zero Legacy.
func FindLegacy(ctx context.Context, js jetstream.JetStream, bucket string, store *Store) (Legacy, error) {
	obj, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return Legacy{}, nil
	}
	if err != nil {
		return Legacy{}, fmt.Errorf("builders: the object store %s: %w", bucket, err)
	}
	infos, err := obj.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return Legacy{Bucket: bucket, objects: obj}, nil
	}
	if err != nil {
		return Legacy{}, fmt.Errorf("builders: list the object store %s: %w", bucket, err)
	}
	l := Legacy{Bucket: bucket, objects: obj}
	for _, info := range infos {
		v := Version{Name: info.Name, SHA256: info.Name, Size: int64(info.Size)}
		if len(info.Name) != 64 || v.Size > MaxModuleBytes {
			l.Foreign = append(l.Foreign, info.Name)
			continue
		}
		if store != nil {
			if _, err := store.Module(ctx, v); err == nil {
				continue
			}
		}
		l.Missing = append(l.Missing, info.Name)
	}
	return l, nil
}

// read reads one object, at most MaxModuleBytes of it whatever its metadata says.
func (l Legacy) read(ctx context.Context, name string) ([]byte, error) {
	r, err := l.objects.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, MaxModuleBytes+1))
	if err == nil && len(b) > MaxModuleBytes {
		err = fmt.Errorf("over %d bytes", MaxModuleBytes)
	}
	return b, err
}

// Copy puts every missing module into store, each checked against its name first; one whose bytes
// are not their name is not copied, and is named in the error.
func (l Legacy) Copy(ctx context.Context, store *Store) (int, error) {
	copied := 0
	var errs []error
	for _, name := range l.Missing {
		b, err := l.read(ctx, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", name, err))
			continue
		}
		if got := wasm.SHA256(b); got != name {
			errs = append(errs, fmt.Errorf("%s holds bytes of sha256 %s: not copied", name, got))
			continue
		}
		if err := store.Put(ctx, b); err != nil {
			errs = append(errs, err)
			continue
		}
		copied++
	}
	if err := errors.Join(errs...); err != nil {
		return copied, fmt.Errorf("builders: copy %s into %s: %w", l.Bucket, store.Name(), err)
	}
	return copied, nil
}
