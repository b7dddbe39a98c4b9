package audit

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podium-llm/podium/internal/bounded"
	"github.com/podium-llm/podium/internal/library"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// BundleFormat names the layout of a Bundle; a reader refuses any other.
const BundleFormat = "podium.bundle/1"

// Bundle is one execution exported whole (`podium export`): every stored copy of its
// evaluations, every prompt.composed record byte for byte, and the files of every template
// version the records name. `podium prompts verify --bundle` proves each record from it alone,
// with no NATS and no ClickHouse: the evaluations make exactly the store's reads again
// (rank.FromRecords), and the templates are loaded from their files (compose.LoadFiles).
//
// It is written deterministically (ordered lists, sorted keys, no time of export), so the same
// execution exports to the same bytes.
type Bundle struct {
	Format      string             `json:"format"`
	ExecutionID string             `json:"execution_id"`
	TZ          string             `json:"tz,omitempty"` // the composers' default timezone (TZ)
	Evaluations []BundleEvaluation `json:"evaluations"`  // by EVALUATIONS sequence
	Prompts     []BundlePrompt     `json:"prompts"`      // in the order PROMPTS stored them
	Templates   []BundleTemplate   `json:"templates"`    // by name, then version
	// Builders are the prompt builders' modules the records name (a compatible addition, absent
	// when none), so a built record verifies with no server.
	Builders []BundleBuilder `json:"builders,omitempty"` // by name, then version
	// Log proves each prompt is in the signed audit log over PROMPTS (docs/audit.md; a compatible
	// addition, absent when the export was made without the log's public key).
	Log *BundleLog `json:"log,omitempty"`
}

// BundleLog is a signed checkpoint of the audit log and, per prompt it signs, the proof that the
// prompt is in it.
type BundleLog struct {
	Checkpoint string        `json:"checkpoint"` // the signed note, as AUDIT holds it
	Proofs     []BundleProof `json:"proofs"`     // in the order of Prompts; a prompt the checkpoint does not sign has none
}

// BundleProof is one prompt's inclusion proof: the hashes of RFC 9162's audit path (base64 in
// the JSON), from the leaf of the record at prompts_seq to the checkpoint's root.
type BundleProof struct {
	Seq    uint64   `json:"prompts_seq"`
	Hashes [][]byte `json:"hashes"`
}

// BundleBuilder is one prompt builder version a record names, with its module's bytes (base64 in
// the JSON).
type BundleBuilder struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	SHA256  string `json:"sha256"`
	Module  []byte `json:"module"`
}

// BundleEvaluation is one stored copy of an evaluation.
type BundleEvaluation struct {
	Seq uint64 `json:"evaluations_seq"`
	// Era is the era of the EVALUATIONS stream Seq is of (rank.Pos; absent: 0, a compatible
	// addition): an execution across a stream made again keeps its order.
	Era     uint32                     `json:"evaluations_era,omitempty"`
	EventID string                     `json:"event_id"`
	Source  string                     `json:"source,omitempty"`
	Data    events.EvaluationCompleted `json:"data"`
}

// BundlePrompt is one prompt.composed record as PROMPTS stored it.
type BundlePrompt struct {
	Seq     uint64    `json:"prompts_seq"`
	Stored  time.Time `json:"stored"`
	Subject string    `json:"subject"`
	Event   string    `json:"event"` // the CloudEvent, byte for byte
}

// BundleTemplate is one template version a record names, as its files.
type BundleTemplate struct {
	Name    string            `json:"name"`
	Version int               `json:"version"`
	SHA256  string            `json:"sha256"`
	Files   map[string]string `json:"files"`
}

// NewBundle gathers an execution's bundle: its evaluations as the store holds them, its records,
// the template versions they name from lib (a record whose version lib does not hold, with the
// same sha256, cannot be exported), and the modules of the builders that built them from modules
// (nil: there is no builder registry).
func NewBundle(executionID, tz string, evals []rank.Record, recs []Record, lib *compose.Library, modules func(events.BuilderRef) ([]byte, error)) (Bundle, error) {
	b := Bundle{Format: BundleFormat, ExecutionID: executionID, TZ: tz}
	if err := b.addBuilders(recs, modules); err != nil {
		return Bundle{}, err
	}
	for _, r := range evals {
		b.Evaluations = append(b.Evaluations, BundleEvaluation{Seq: r.Seq, Era: r.Era, EventID: r.EventID, Source: r.Source, Data: r.EvaluationCompleted})
	}
	templates := map[string]BundleTemplate{}
	for _, r := range recs {
		if len(r.Raw) == 0 {
			return Bundle{}, fmt.Errorf("record %s has no body to export", r.EventID)
		}
		// At microseconds, as the archive keeps it: a record exports the same before and after.
		b.Prompts = append(b.Prompts, BundlePrompt{Seq: r.Seq, Stored: r.Stored.UTC().Truncate(time.Microsecond), Subject: r.Subject, Event: string(r.Raw)})
		ref := fmt.Sprintf("%s@%d", r.Data.Template.Name, r.Data.Template.Version)
		if _, ok := templates[ref]; ok {
			continue
		}
		t, err := lib.Lookup(ref)
		if err != nil || t.SHA256 != r.Data.Template.SHA256 {
			return Bundle{}, fmt.Errorf("template %s (sha256 %.12s…) of %s %s round %d is not loaded here (set --templates-dir as the composers' COMPOSER_TEMPLATES_DIR): %v",
				ref, r.Data.Template.SHA256, r.Data.ExecutionID, r.Data.TeamID, r.Data.RoundNumber, err)
		}
		files := map[string]string{}
		for p, content := range t.Files() {
			files[p] = string(content)
		}
		templates[ref] = BundleTemplate{Name: r.Data.Template.Name, Version: r.Data.Template.Version, SHA256: t.SHA256, Files: files}
	}
	for _, ref := range slices.SortedFunc(maps.Keys(templates), func(a, b string) int {
		ta, tb := templates[a], templates[b]
		if c := strings.Compare(ta.Name, tb.Name); c != 0 {
			return c
		}
		return ta.Version - tb.Version
	}) {
		b.Templates = append(b.Templates, templates[ref])
	}
	return b, nil
}

// addBuilders adds the module of every builder version that built one of recs.
func (b *Bundle) addBuilders(recs []Record, modules func(events.BuilderRef) ([]byte, error)) error {
	seen := map[string]bool{}
	for _, r := range recs {
		ref := r.Data.Builder
		if ref == nil || ref.Fallback || seen[ref.Name+"@"+strconv.Itoa(ref.Version)] {
			continue
		}
		seen[ref.Name+"@"+strconv.Itoa(ref.Version)] = true
		if modules == nil {
			return fmt.Errorf("builder %s@%d of %s %s round %d: there is no builder registry to export it from", ref.Name, ref.Version, r.Data.ExecutionID, r.Data.TeamID, r.Data.RoundNumber)
		}
		module, err := modules(*ref)
		if err != nil {
			return fmt.Errorf("builder %s@%d of %s %s round %d: %w", ref.Name, ref.Version, r.Data.ExecutionID, r.Data.TeamID, r.Data.RoundNumber, err)
		}
		b.Builders = append(b.Builders, BundleBuilder{Name: ref.Name, Version: ref.Version, SHA256: ref.SHA256, Module: module})
	}
	slices.SortFunc(b.Builders, func(x, y BundleBuilder) int {
		if c := strings.Compare(x.Name, y.Name); c != 0 {
			return c
		}
		return x.Version - y.Version
	})
	return nil
}

// Module is the bytes of the bundle's builder version ref names, if the bundle holds it with
// ref's sha256.
func (b Bundle) Module(ref events.BuilderRef) ([]byte, bool) {
	for _, bb := range b.Builders {
		if bb.Name == ref.Name && bb.Version == ref.Version && bb.SHA256 == ref.SHA256 {
			return bb.Module, true
		}
	}
	return nil, false
}

// Write writes the bundle as JSON, gzip-compressed when compressed (the same bundle gives the
// same bytes).
func (b Bundle) Write(w io.Writer, compressed bool) error {
	body, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	if !compressed {
		_, err = w.Write(append(body, '\n'))
		return err
	}
	zw := gzip.NewWriter(w)
	if _, err := zw.Write(body); err != nil {
		return err
	}
	return zw.Close()
}

// ReadBundle reads a bundle Write wrote, compressed or not, as a stream: at most limit bytes of
// JSON are read, counted after decompression, so a small file that decompresses to much more ends
// with an error naming the limit instead of taking the memory (docs/security.md).
func ReadBundle(r io.Reader, name string, limit bounded.Limit) (Bundle, error) {
	br := bufio.NewReader(r)
	var in io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return Bundle{}, fmt.Errorf("bundle: %w", err)
		}
		defer zr.Close()
		in = zr
	}
	var b Bundle
	dec := json.NewDecoder(limit.Reader(in, "bundle "+name))
	if err := dec.Decode(&b); err != nil {
		return Bundle{}, fmt.Errorf("bundle: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Bundle{}, fmt.Errorf("bundle: something follows the bundle's object (%v)", err)
	}
	if b.Format != BundleFormat {
		return Bundle{}, fmt.Errorf("bundle: format %q, this podium reads %q", b.Format, BundleFormat)
	}
	return b, nil
}

// Records are the bundle's prompt records, decoded.
func (b Bundle) Records() ([]Record, error) {
	out := make([]Record, 0, len(b.Prompts))
	for _, p := range b.Prompts {
		r, err := Decode(p.Subject, []byte(p.Event))
		if err != nil {
			return nil, err
		}
		if r.Data.ExecutionID != b.ExecutionID {
			return nil, differs("record %s (PROMPTS sequence %d) is of execution %s, the bundle of %s", r.EventID, p.Seq, r.Data.ExecutionID, b.ExecutionID)
		}
		r.Seq, r.Stored, r.Subject, r.Raw = p.Seq, p.Stored, p.Subject, []byte(p.Event)
		out = append(out, r)
	}
	return out, nil
}

// Verifier is a verifier that reads the bundle alone: its evaluations for the store's reads, its
// templates for the records' versions, its timezone unless tz names another.
func (b Bundle) Verifier(tz string) (*Verifier, error) {
	recs := make([]rank.Record, 0, len(b.Evaluations))
	for _, e := range b.Evaluations {
		if e.Data.ExecutionID != b.ExecutionID {
			return nil, differs("evaluation %s is of execution %s, the bundle of %s", e.EventID, e.Data.ExecutionID, b.ExecutionID)
		}
		recs = append(recs, rank.Record{EventID: e.EventID, Source: e.Source, Seq: e.Seq, Era: e.Era, EvaluationCompleted: e.Data})
	}
	evs, contents := rank.FromRecords(recs)
	var templates []*compose.Template
	for _, bt := range b.Templates {
		files := make(map[string][]byte, len(bt.Files))
		for p, content := range bt.Files {
			files[p] = []byte(content)
		}
		t, err := compose.LoadFiles(bt.Name, bt.Version, files)
		if err != nil {
			return nil, differs("template %s@%d of the bundle does not load: %v", bt.Name, bt.Version, err)
		}
		if t.SHA256 != bt.SHA256 {
			return nil, differs("template %s@%d of the bundle is sha256 %.16s…, the bundle says %.16s…: its files were changed", bt.Name, bt.Version, t.SHA256, bt.SHA256)
		}
		templates = append(templates, t)
	}
	if tz == "" {
		tz = b.TZ
	}
	v := NewVerifier(library.Settings{TZ: tz}, registry.State{}, render.Memory{Evs: evs, Contents: contents})
	v.extra = templates
	return v, nil
}
