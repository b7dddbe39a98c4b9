package registry

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// The layout and rules every registry bucket shares (TEMPLATES, BUILDERS): what a version is,
// what a label names, and which document is served. Keys:
//
//	<name>.v<N>                  version N's document: JSON with at least "name" and "version", written once
//	<name>.label.<label>         what a label names: "N@<sha256>", or a split "N@<sha256>=W,M@<sha256>=W"
//	<name>.pin.<label>.<sha256>  a copy of a document a label was moved to, written by whoever moved it
//
// A version is its document: the sha256 of the stored bytes is its digest, and a label names a
// version with its digest. A version key is written once (a push claims it with a create); a key
// written again is named as such (list, history, console) and its value is never served. A label
// is served from its pinned copy, else from a version key written once whose document has the
// label's digest: so whoever may write versions (an author) but not a label (production) cannot
// change what the label serves, by rewriting, deleting or re-creating a version key. Whoever may
// move a label may write its copies (deploy/nats/nats.conf gives both to the same roles).

// Content is what a registry bucket holds: every key's current value, and how many times each key
// was written (puts and deletes, as far back as the bucket's history reaches).
type Content struct {
	Values map[string][]byte
	Writes map[string]int
}

// Doc is one served document: a version of a name, with its digest.
type Doc struct {
	Name    string
	Version int
	Digest  string
	Value   []byte
}

// Share is one version a label names, with its digest, and its weight in a split.
type Share struct {
	Version int
	Digest  string
	Weight  int
}

// Target is what a label names: one share, or a split between several, by version.
type Target []Share

// Entries are a bucket's content as the rules read it: the documents served, by name and version;
// the labels whose every share is served with its digest; the version keys written again; and
// every entry left out, with why.
type Entries struct {
	Docs      map[string]map[int]Doc
	Labels    map[string]map[string]Target
	Rewritten map[string][]int
	Problems  []error
}

// VersionKey is the key of a version.
func VersionKey(name string, version int) string { return name + ".v" + strconv.Itoa(version) }

// LabelKey is the key of a label.
func LabelKey(name, label string) string { return name + ".label." + label }

// PinKey is the key of a label's copy of a document.
func PinKey(name, label, digest string) string { return name + ".pin." + label + "." + digest }

// Digest is the hex sha256 of a stored document.
func Digest(doc []byte) string {
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:])
}

// Read reads a bucket whole, its history included, to count every key's writes.
func Read(ctx context.Context, kv jetstream.KeyValue) (Content, error) {
	all, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
	if err != nil {
		return Content{}, fmt.Errorf("registry: read %s: %w", kv.Bucket(), err)
	}
	defer all.Stop()
	c := NewContent()
	for {
		select {
		case <-ctx.Done():
			return Content{}, fmt.Errorf("registry: read %s: %w", kv.Bucket(), ctx.Err())
		case e, ok := <-all.Updates():
			if !ok {
				return Content{}, fmt.Errorf("registry: read %s: the watch ended", kv.Bucket())
			}
			if e == nil {
				return c, nil // the history is read: what follows would be live changes
			}
			c.Note(e)
		}
	}
}

// Note adds one entry of the bucket's history, in order.
func (c *Content) Note(e jetstream.KeyValueEntry) {
	c.Writes[e.Key()]++
	if e.Operation() == jetstream.KeyValuePut {
		c.Values[e.Key()] = e.Value()
	} else {
		delete(c.Values, e.Key())
	}
}

// NewContent is an empty content, to Note entries into.
func NewContent() Content {
	return Content{Values: map[string][]byte{}, Writes: map[string]int{}}
}

// Resolve applies the rules to a bucket's content.
func Resolve(c Content) Entries {
	en := Entries{Docs: map[string]map[int]Doc{}, Labels: map[string]map[string]Target{}, Rewritten: map[string][]int{}}
	keyDocs := map[string]map[int]Doc{}      // version keys written once
	pins := map[string]map[string][]Doc{}    // name -> label -> its copies
	labels := map[string]map[string]Target{} // as stored, before they are checked
	for _, key := range slices.Sorted(maps.Keys(c.Values)) {
		value := c.Values[key]
		name, rest, _ := strings.Cut(key, ".")
		switch {
		case strings.HasPrefix(rest, "label."):
			label := strings.TrimPrefix(rest, "label.")
			l, err := ParseTarget(string(value))
			if err != nil {
				en.Problems = append(en.Problems, fmt.Errorf("registry: label %s holds %s: %v", key, events.Quote(string(value)), err))
				continue
			}
			setIn(labels, name, label, l)
		case strings.HasPrefix(rest, "pin."):
			label, digest, _ := strings.Cut(strings.TrimPrefix(rest, "pin."), ".")
			d, err := decodeDoc(name, 0, value)
			switch {
			case err != nil:
				en.Problems = append(en.Problems, fmt.Errorf("registry: %s is not a document of %s (%v)", key, name, err))
			case d.Digest != digest:
				en.Problems = append(en.Problems, fmt.Errorf("registry: %s holds a document of sha256 %.12s…, not the one its key names", key, d.Digest))
			default:
				pins[name] = appendIn(pins[name], label, d)
			}
		case strings.HasPrefix(rest, "v"):
			n, err := strconv.Atoi(rest[1:])
			if err != nil || n < 1 {
				en.Problems = append(en.Problems, fmt.Errorf("registry: unknown key %s", key))
				continue
			}
			if c.Writes[key] > 1 {
				en.Rewritten[name] = append(en.Rewritten[name], n)
				continue
			}
			d, err := decodeDoc(name, n, value)
			if err != nil {
				en.Problems = append(en.Problems, fmt.Errorf("registry: %s is not a version of %s (%v)", key, name, err))
				continue
			}
			setIn(keyDocs, name, n, d)
		default:
			en.Problems = append(en.Problems, fmt.Errorf("registry: unknown key %s", key))
		}
	}
	// A version key written again, then deleted, has no value but was still written again.
	for key, writes := range c.Writes {
		name, rest, _ := strings.Cut(key, ".")
		n, err := strconv.Atoi(strings.TrimPrefix(rest, "v"))
		if _, current := c.Values[key]; !current && writes > 1 && strings.HasPrefix(rest, "v") && err == nil {
			en.Rewritten[name] = append(en.Rewritten[name], n)
		}
	}
	for name := range en.Rewritten {
		slices.Sort(en.Rewritten[name])
		en.Rewritten[name] = slices.Compact(en.Rewritten[name])
	}
	// Served: every version key written once, and every version a label's copy holds.
	for name, docs := range keyDocs {
		for n, d := range docs {
			setIn(en.Docs, name, n, d)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(labels)) {
		for _, label := range slices.Sorted(maps.Keys(labels[name])) {
			l := labels[name][label]
			served := true
			for _, sh := range l {
				d, err := find(keyDocs[name], pins[name][label], name, label, sh)
				if err != nil {
					en.Problems = append(en.Problems, err)
					served = false
					continue
				}
				if have, ok := en.Docs[name][sh.Version]; ok && have.Digest != d.Digest {
					en.Problems = append(en.Problems, fmt.Errorf("registry: label %s of %s names version %d as sha256 %.12s…, another label as %.12s…: label it again", label, name, sh.Version, d.Digest, have.Digest))
					served = false
					continue
				}
				setIn(en.Docs, name, sh.Version, d)
			}
			if served {
				setIn(en.Labels, name, label, l)
			}
		}
	}
	return en
}

// find is the document a label's share names: its copy, else the version key written once with
// that digest.
func find(keyDocs map[int]Doc, copies []Doc, name, label string, sh Share) (Doc, error) {
	if sh.Digest == "" {
		return Doc{}, fmt.Errorf("registry: label %s of %s names version %d without its digest (moved before labels pinned one): label it again", label, name, sh.Version)
	}
	for _, d := range copies {
		if d.Digest == sh.Digest && d.Version == sh.Version {
			return d, nil
		}
	}
	if d, ok := keyDocs[sh.Version]; ok && d.Digest == sh.Digest {
		return d, nil
	}
	return Doc{}, fmt.Errorf("registry: label %s of %s names version %d as sha256 %.12s…, which the registry does not hold (the version was written again, and the label has no copy): label a version again", label, name, sh.Version, sh.Digest)
}

// decodeDoc reads a document's name and version; version 0 takes the document's own.
func decodeDoc(name string, version int, value []byte) (Doc, error) {
	var head struct {
		Name    string `json:"name"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(value, &head); err != nil {
		return Doc{}, err
	}
	if head.Name != name || head.Version < 1 || (version != 0 && head.Version != version) {
		return Doc{}, fmt.Errorf("it says %s version %d", events.Quote(head.Name), head.Version)
	}
	return Doc{Name: name, Version: head.Version, Digest: Digest(value), Value: value}, nil
}

// setIn sets m[a][b] = v, making m[a] when missing.
func setIn[K1, K2 comparable, V any](m map[K1]map[K2]V, a K1, b K2, v V) {
	if m[a] == nil {
		m[a] = map[K2]V{}
	}
	m[a][b] = v
}

// appendIn appends v to m[k], making m when nil.
func appendIn[K comparable, V any](m map[K][]V, k K, v V) map[K][]V {
	if m == nil {
		m = map[K][]V{}
	}
	m[k] = append(m[k], v)
	return m
}

// Next claims the next version number of name and stores the document doc(n) makes for it: with
// a create, so two pushes never share a number, and a number once written (deleted since, or
// written again) is never taken again.
func Next(ctx context.Context, kv jetstream.KeyValue, name string, doc func(n int) ([]byte, error)) (int, error) {
	c, err := Read(ctx, kv)
	if err != nil {
		return 0, err
	}
	next := 1
	for key := range c.Writes {
		if n, err := strconv.Atoi(strings.TrimPrefix(key, name+".v")); err == nil && strings.HasPrefix(key, name+".v") {
			next = max(next, n+1)
		}
	}
	for ; ; next++ {
		value, err := doc(next)
		if err != nil {
			return 0, err
		}
		_, err = kv.Create(ctx, VersionKey(name, next), value)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // pushed by someone else meanwhile: take the next number
		}
		if err != nil {
			return 0, fmt.Errorf("registry: push %s: %w", name, err)
		}
		return next, nil
	}
}

// Move points a label of name at shares (one, or a split), each naming a version and, where the
// mover reviewed one, its digest. Each version is taken as the rules serve it; a share whose
// digest is not that version's document is refused (it changed since it was reviewed). copied is
// called with each document before the label moves (a builder copies its module). A copy of each
// document is written under the label, then the label, which names each version with its digest:
// the shares returned.
func Move(ctx context.Context, kv jetstream.KeyValue, name, label string, shares Target, copied func(Doc) error) (Target, error) {
	if !events.ValidIdentifier(label) || label == "latest" {
		return nil, fmt.Errorf("registry: label %s must be an identifier other than latest", events.Quote(label))
	}
	if len(shares) == 0 {
		return nil, fmt.Errorf("registry: label %s: no version", label)
	}
	c, err := Read(ctx, kv)
	if err != nil {
		return nil, err
	}
	en := Resolve(c)
	out := slices.Clone(shares)
	for i, sh := range out {
		d, ok := en.Docs[name][sh.Version]
		switch {
		case !ok && slices.Contains(en.Rewritten[name], sh.Version):
			return nil, fmt.Errorf("registry: version %d of %s was written again after it was pushed, and no label holds a copy of it: it is never served; push a new version", sh.Version, name)
		case !ok:
			return nil, fmt.Errorf("registry: %s has no version %d", name, sh.Version)
		case sh.Digest != "" && sh.Digest != d.Digest:
			return nil, fmt.Errorf("registry: version %d of %s is sha256 %s, not %s: it is not what was reviewed", sh.Version, name, d.Digest, sh.Digest)
		}
		out[i].Digest = d.Digest
		if copied != nil {
			if err := copied(d); err != nil {
				return nil, err
			}
		}
		key := PinKey(name, label, d.Digest)
		if _, err := kv.Create(ctx, key, d.Value); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("registry: copy version %d of %s for label %s: %w", sh.Version, name, label, err)
		} else if err != nil {
			// A copy is there: rewritten (it fails its digest) or deleted since, it is written again.
			if e, gerr := kv.Get(ctx, key); gerr != nil || Digest(e.Value()) != d.Digest {
				if _, err := kv.Put(ctx, key, d.Value); err != nil {
					return nil, fmt.Errorf("registry: copy version %d of %s for label %s: %w", sh.Version, name, label, err)
				}
			}
		}
	}
	if _, err := kv.Put(ctx, LabelKey(name, label), []byte(out.String())); err != nil {
		return nil, fmt.Errorf("registry: label %s: %w", label, err)
	}
	return out, nil
}

// ParseTarget reads a label's value: "N@<sha256>", or a split "N@<sha256>=W,M@<sha256>=W", each
// version once, each weight positive. Values from before labels pinned a digest read with none
// ("5", "5=50,6=50") and are not served; a builder label's "N:<sha256>" reads as "N@<sha256>".
func ParseTarget(value string) (Target, error) {
	var l Target
	for part := range strings.SplitSeq(value, ",") {
		v, w, weighted := strings.Cut(part, "=")
		v, digest, pinned := strings.Cut(v, "@")
		if !pinned {
			v, digest, _ = strings.Cut(v, ":")
		}
		version, err := strconv.Atoi(v)
		if err != nil || version < 1 {
			return nil, fmt.Errorf("%s is not a version", events.Quote(v))
		}
		if digest != "" && !validDigest(digest) {
			return nil, fmt.Errorf("%s is not a sha256 in hex", events.Quote(digest))
		}
		weight := 1
		if weighted {
			if weight, err = strconv.Atoi(w); err != nil || weight < 1 {
				return nil, fmt.Errorf("the weight of version %d must be a positive number, got %s", version, events.Quote(w))
			}
		} else if strings.Contains(value, ",") {
			return nil, fmt.Errorf("version %d has no weight: a split gives every version one (5=50,6=50)", version)
		}
		if slices.ContainsFunc(l, func(sh Share) bool { return sh.Version == version }) {
			return nil, fmt.Errorf("version %d twice", version)
		}
		l = append(l, Share{Version: version, Digest: digest, Weight: weight})
	}
	slices.SortFunc(l, func(a, b Share) int { return cmp.Compare(a.Version, b.Version) })
	return l, nil
}

// String is the label's stored form.
func (l Target) String() string {
	if len(l) == 1 {
		return l[0].ref()
	}
	parts := make([]string, len(l))
	for i, sh := range l {
		parts[i] = sh.ref() + "=" + strconv.Itoa(sh.Weight)
	}
	return strings.Join(parts, ",")
}

// ref is "N@<sha256>", or "N" without a digest.
func (sh Share) ref() string {
	if sh.Digest == "" {
		return strconv.Itoa(sh.Version)
	}
	return strconv.Itoa(sh.Version) + "@" + sh.Digest
}

// validDigest reports whether s is a sha256 in lowercase hex.
func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
