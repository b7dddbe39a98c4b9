package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/podium-llm/podium/internal/panics"
)

// A reactor is a builder whose runtime starts once (docs/builders.md): a module that exports
// _initialize and podium_run instead of _start (Go: GOOS=wasip1 -buildmode=c-shared and
// //go:wasmexport podium_run). A command starts its runtime in every call (Go's: about 10 ms); a
// reactor's starts at load:
//   - the engine makes one instance, runs _initialize and keeps what it left, the snapshot: the
//     memory's bytes and the value of every mutable global (which the module's own bytes do not
//     export: the bytes compiled export them, under podium.global.N, as the budget bounds its
//     tables; the module keeps its identity, the sha256 of its own bytes);
//   - each call runs podium_run on an instance whose memory and globals were set back to the
//     snapshot just before it, with stdin, stdout, stderr, clocks and random source of its own:
//     nothing one call wrote is seen by the next, and the same input gives the same bytes, as a
//     command's fresh instance does;
//   - an instance is kept for the next call (at most one per call that may run at once) unless
//     its call failed (a trap, an exit, a deadline, an answer other than 0: its state is
//     unknown) or its memory grew past keepBelow (memory cannot shrink back to the snapshot's
//     size: what a call grew into is made zero again, see release): those are closed, and the
//     next call makes one anew from the snapshot, without _initialize;
//   - what an instance holds besides memory and globals cannot be set back, so a reactor may not
//     change it: its descriptors (fd_close and fd_renumber are refused: wasm.go) and its tables
//     and segments (such code is refused at load: code.go).
//
// podium_run takes nothing and returns an i32: 0 when stdout holds the answer, anything else a
// failure (the reason on stderr), as a command's exit status.

// The exports of each kind.
const (
	exportStart      = "_start"
	exportInitialize = "_initialize"
	exportRun        = "podium_run"
	globalExport     = "podium.global."
)

// Kinds of module (Module.Kind).
const (
	KindCommand = "command"
	KindReactor = "reactor"
)

// reactor is what a reactor module's calls share: the snapshot and the instances kept.
type reactor struct {
	e       *Engine
	c       wazero.CompiledModule
	globals []string // the exports of its mutable globals, in index order

	memory []byte   // the snapshot: linear memory after _initialize and the warm-up
	values []uint64 // and each global of globals
	ticks  int64    // the monotonic counter then: where every call's starts

	mu   sync.Mutex
	idle []*instance // ready for a call; at most Limits.Concurrent
	shut bool        // the module was freed: instances are closed, not kept
}

// instance is one instance of a reactor, with the state its calls read and write through the
// host: set anew before each call.
type instance struct {
	mod  api.Module
	run  api.Function
	stop api.MutableGlobal // set to stop the call running (interrupt.go)
	maps *mappings
	call *callState
}

// callState is one call's view of the host: what WASI gives the module reads and writes these.
type callState struct {
	stdin          bytes.Reader
	stdout, stderr *capped
	random         *rand.ChaCha8
	ticks          int64
	now            time.Time
	readClock      bool
}

// The module config routes WASI to whatever call is running on the instance.
type (
	callStdin  struct{ s *callState }
	callStdout struct{ s *callState }
	callStderr struct{ s *callState }
	callRandom struct{ s *callState }
)

func (r callStdin) Read(p []byte) (int, error)   { return r.s.stdin.Read(p) }
func (w callStdout) Write(p []byte) (int, error) { return w.s.stdout.Write(p) }
func (w callStderr) Write(p []byte) (int, error) { return w.s.stderr.Write(p) }
func (r callRandom) Read(p []byte) (int, error)  { return r.s.random.Read(p) }

// seed is where every call's random source starts, command or reactor.
func seed() [32]byte { return sha256.Sum256([]byte("podium prompt builder")) }

// reset makes the state one call's: its input, the request's time, fresh output, and the clocks
// and random source where every call's start.
func (s *callState) reset(input []byte, now time.Time, ticks int64, limits Limits) {
	s.stdin.Reset(input)
	s.stdout = &capped{limit: limits.OutputBytes}
	s.stderr = &capped{limit: limits.StderrBytes}
	s.random = rand.NewChaCha8(seed())
	s.ticks, s.now, s.readClock = ticks, now, false
}

// config is the module config of an instance whose WASI reads and writes s.
func config(s *callState) wazero.ModuleConfig {
	cfg := wazero.NewModuleConfig().
		WithName(""). // anonymous: instances live side by side
		WithArgs("builder").
		WithStdin(callStdin{s}).
		WithStdout(callStdout{s}).
		WithStderr(callStderr{s}).
		WithRandSource(callRandom{s}).
		// The wall clock reads the request's time, and a module that reads it fails: its answer
		// must follow from its input alone (the request's time is context.current_datetime).
		WithWalltime(func() (int64, int32) {
			s.readClock = true
			return s.now.Unix(), int32(s.now.Nanosecond())
		}, sys.ClockResolution(1)).
		// A counter, not a clock: runtimes that loop on it until time passes (Go's sleep) still
		// end, and the same run reads the same values.
		WithNanotime(func() int64 { s.ticks += int64(time.Microsecond); return s.ticks }, sys.ClockResolution(1))
	// Started by the engine, armed to stop at the call's end (interrupt.go): a command's
	// _start in each call, a reactor's _initialize once, for the snapshot.
	return cfg.WithStartFunctions()
}

// warmUp are the calls a reactor's snapshot is taken after, besides _initialize: what a runtime
// does in its first call (Go's encoding/json builds its encoders for each type it meets, and its
// heap grows to a call's size) is then done once per module, not in every call (measured on the
// example: 1.9 ms a call from the state _initialize left, 0.7 ms from this one). The inputs are
// fixed, so the snapshot follows from the module alone, and every call starts from the same state.
func warmUp() []string {
	return []string{
		`{"op":"build","model":"warm-up","context":{"team":{"id":"warm-up","name":"Warm-up"},"user_prompt":"Warm up.","round_number":2,"is_first_round":false,"current_datetime":"2000-01-01T00:00:00",` +
			`"history":[{"round_number":1,"score":1,"score_text":"1","feedback":"Warm.","preview":"Warm."}],"leaderboard":[{"position":1,"rank":1,"team_name":"Warm-up","best_score":1,"best_score_text":"1","best_round":1,"is_self":true}]},"vars":{}}`,
		`{"op":"parse","model":"warm-up","output":"Warm up."}`,
	}
}

// newReactor makes the snapshot of a compiled reactor: one instance, _initialize run on it, then
// the warm-up calls, all within Limits.Start. A warm-up call that fails (a trap, an answer other
// than 0: the builder refuses its input) leaves the snapshot as _initialize left it, as does one
// that reads the wall clock; an _initialize that fails, and a start not finished within
// Limits.Start, refuse the module: how far it got would depend on the machine, and so would the
// snapshot.
func (e *Engine) newReactor(ctx context.Context, c wazero.CompiledModule, globals []string) (*reactor, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, e.limits.Start)
	defer cancel()
	late := func() error {
		if parent.Err() != nil { // the caller's deadline, not the module's
			return &Failure{Reason: ReasonTimeout, Detail: "the deadline passed while the reactor was starting"}
		}
		return &Failure{Reason: ReasonLoad, Detail: fmt.Sprintf("its _initialize and warm-up did not finish within %s", e.limits.Start)}
	}
	r := &reactor{e: e, c: c, globals: globals}
	in, err := r.instantiate(ctx)
	if err != nil {
		return nil, err
	}
	kept := false // the instance serves the first call, when it ended its warm-up well
	defer func() {
		if !kept {
			in.close(ctx)
		}
	}()
	in.call.reset(nil, time.Time{}, 0, e.limits)
	if _, err := in.invoke(ctx, in.mod.ExportedFunction(exportInitialize)); err != nil {
		if ctx.Err() != nil {
			return nil, late()
		}
		return nil, &Failure{Reason: ReasonLoad, Detail: "_initialize failed: " + failureOf(ctx, err, in.call.stderr).Detail}
	}
	if in.call.readClock {
		return nil, &Failure{Reason: ReasonLoad, Detail: "_initialize read the wall clock: a reactor's state must follow from the module alone"}
	}
	if !r.snapshot(in) {
		return nil, &Failure{Reason: ReasonLoad, Detail: "the memory after _initialize could not be read"}
	}
	for _, input := range warmUp() {
		in.call.reset([]byte(input), time.Time{}, in.call.ticks, e.limits)
		res, err := in.invoke(ctx, in.run)
		if ctx.Err() != nil {
			return nil, late()
		}
		if err != nil || len(res) != 1 || uint32(res[0]) != 0 || in.call.stdout.over || in.call.readClock {
			return r, nil // the state _initialize left
		}
	}
	if r.snapshot(in) { // else the state _initialize left
		kept = true
		r.give(ctx, in)
	}
	return r, nil
}

// snapshot keeps the instance's memory and globals as the state every call starts from.
func (r *reactor) snapshot(in *instance) bool {
	mem, ok := in.mod.Memory().Read(0, in.mod.Memory().Size())
	if !ok {
		return false
	}
	values := make([]uint64, 0, len(r.globals))
	for _, name := range r.globals {
		values = append(values, in.mod.ExportedGlobal(name).Get())
	}
	r.memory, r.values, r.ticks = bytes.Clone(mem), values, in.call.ticks
	return true
}

// instantiate makes an instance of the reactor, its memory and globals as the module declares
// them: restore sets them to the snapshot.
func (r *reactor) instantiate(ctx context.Context) (*instance, error) {
	in := &instance{maps: newMappings(&r.e.mapped), call: &callState{}}
	in.call.reset(nil, time.Time{}, 0, r.e.limits)
	var err error
	if p := panics.Catch(func() {
		in.mod, err = r.e.rt.InstantiateModule(experimental.WithMemoryAllocator(ctx, in.maps.allocator()), r.c, config(in.call))
	}); p != nil {
		in.maps.freeAll()
		return nil, &Failure{Reason: ReasonMemory, Detail: fmt.Sprintf("the instance could not be made: %v", p.Value)}
	}
	if err != nil {
		in.maps.freeAll()
		return nil, failureOf(ctx, err, in.call.stderr)
	}
	in.stop, _ = in.mod.ExportedGlobal(stopExport).(api.MutableGlobal)
	if in.run = in.mod.ExportedFunction(exportRun); in.run == nil || in.mod.Memory() == nil || in.stop == nil {
		in.close(ctx)
		return nil, &Failure{Reason: ReasonLoad, Detail: "a reactor must export " + exportRun + " and its memory"}
	}
	return in, nil
}

// restore sets the instance's memory and globals to the snapshot. Memory cannot shrink: what a
// call grew past the snapshot's size is made zero again, as fresh memory is (Go's runtime, set back
// to the snapshot, knows nothing of it and grows the memory again past it when it needs more: the
// memory creeps, and an instance is kept only while it stays under keepBelow). False when the
// memory could not be set back.
func (r *reactor) restore(in *instance) bool {
	mem := in.mod.Memory()
	size := uint32(len(r.memory))
	if mem.Size() < size {
		if _, ok := mem.Grow((size - mem.Size()) / 65536); !ok {
			return false
		}
	}
	if grown := mem.Size(); grown > size && !in.maps.zero(int(size), int(grown)) && !mem.Write(size, make([]byte, grown-size)) {
		return false
	}
	if !mem.Write(0, r.memory) {
		return false
	}
	for i, name := range r.globals {
		in.mod.ExportedGlobal(name).(api.MutableGlobal).Set(r.values[i])
	}
	return true
}

// release gives back to the kernel what the call grew the memory into past the snapshot (an idle
// instance holds the snapshot's size, not what its last call needed), as restore would before the
// next call; false when the memory grew past keepBelow: the instance is not kept.
func (r *reactor) release(in *instance) bool {
	size, grown := uint32(len(r.memory)), in.mod.Memory().Size()
	if grown > r.keepBelow() {
		return false
	}
	if grown > size {
		in.maps.zero(int(size), int(grown)) // where it cannot, restore writes the zeros
	}
	return true
}

// keepBelow is the memory size up to which an instance is kept for the next call: half-way from
// the snapshot to the limit, so that a builder whose calls grow the memory a little each (see
// restore) makes a new instance once in many calls, not at every one.
func (r *reactor) keepBelow() uint32 {
	limit := uint64(r.e.limits.MemoryPages) * 65536
	snap := uint64(len(r.memory))
	return uint32(snap + (max(limit, snap)-snap)/2)
}

// take is an instance ready for a call: one kept, or one made anew.
func (r *reactor) take(ctx context.Context) (*instance, error) {
	r.mu.Lock()
	if n := len(r.idle); n > 0 {
		in := r.idle[n-1]
		r.idle = r.idle[:n-1]
		r.mu.Unlock()
		return in, nil
	}
	r.mu.Unlock()
	return r.instantiate(ctx)
}

// give keeps an instance whose call ended well for the next call, or closes it.
func (r *reactor) give(ctx context.Context, in *instance) {
	r.mu.Lock()
	if !r.shut && len(r.idle) < r.e.limits.Concurrent {
		r.idle = append(r.idle, in)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	in.close(ctx)
}

// close closes every instance kept, and those given back later: the module is being freed.
func (r *reactor) close(ctx context.Context) {
	r.mu.Lock()
	idle := r.idle
	r.idle, r.shut = nil, true
	r.mu.Unlock()
	for _, in := range idle {
		in.close(ctx)
	}
}

// invoke calls fn on the instance, armed to stop at ctx's end (interrupt.go).
func (in *instance) invoke(ctx context.Context, fn api.Function) ([]uint64, error) {
	disarm := armStop(ctx, in.stop)
	defer disarm()
	return fn.Call(ctx)
}

func (in *instance) close(ctx context.Context) {
	_ = in.mod.Close(context.WithoutCancel(ctx))
	in.maps.freeAll()
}

// run is one call of a reactor: podium_run on an instance set back to the snapshot.
func (r *reactor) run(ctx context.Context, input []byte, now time.Time) ([]byte, error) {
	in, err := r.take(ctx)
	if err != nil {
		return nil, err
	}
	if !r.restore(in) {
		in.close(ctx)
		if in, err = r.instantiate(ctx); err != nil {
			return nil, err
		}
		if !r.restore(in) {
			in.close(ctx)
			return nil, &Failure{Reason: ReasonMemory, Detail: "a fresh instance could not take the snapshot's memory"}
		}
	}
	s := in.call
	s.reset(input, now, r.ticks, r.e.limits)
	var res []uint64
	if p := panics.Catch(func() { res, err = in.invoke(ctx, in.run) }); p != nil {
		err = fmt.Errorf("the call panicked in the host: %v", p.Value)
	}
	// Kept only after an answer: a call that failed, even by its status alone, may have left its
	// instance in any state; and wazero may have closed it at the deadline as the call returned.
	kept := err == nil && len(res) == 1 && uint32(res[0]) == 0 && !s.stdout.over && !in.mod.IsClosed() && r.release(in)
	if kept {
		r.give(ctx, in)
	} else {
		in.close(ctx)
	}
	switch {
	case s.stdout.over:
		return nil, &Failure{Reason: ReasonTooLarge, Detail: fmt.Sprintf("the answer is over %d bytes", r.e.limits.OutputBytes)}
	case err != nil:
		return nil, failureOf(ctx, err, s.stderr)
	case s.readClock:
		return nil, &Failure{Reason: ReasonClock, Detail: "the builder read the wall clock; the request's time is context.current_datetime"}
	case len(res) != 1 || uint32(res[0]) != 0:
		said := firstLines(s.stderr.buf.String(), 3, 400)
		if said != "" {
			said = ": " + said
		}
		status := "none"
		if len(res) == 1 {
			status = strconv.Itoa(int(int32(res[0])))
		}
		return nil, &Failure{Reason: ReasonExit, Detail: "status " + status + said}
	}
	return bytes.Clone(s.stdout.buf.Bytes()), nil
}

// kindOf reads which kind a module is from its exports, and for a reactor returns the bytes to
// compile: its own, with every mutable global it defines exported (podium.global.N) so that the
// snapshot can be read and set again, and those exports' names in index order.
func kindOf(wasm []byte) (kind string, compile []byte, globals []string, err error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return KindCommand, wasm, nil, nil // not a module: the compiler says so
	}
	importedGlobals := 0
	var mutable []int    // indices, in the global index space, of the mutable globals defined
	var globalsErr error // what the global section says against a reactor (a command's is the compiler's)
	exports := map[string]bool{}
	exportsAt, exportsEnd := -1, -1
	err = eachSection(wasm, func(id byte, r *reader) error {
		switch id {
		case 2:
			imported, err := importsOf(r)
			if err != nil {
				globalsErr = err
			}
			importedGlobals = imported.globals
		case 6:
			mutable, globalsErr = mutableGlobals(r, importedGlobals)
		case 7:
			exportsAt, exportsEnd = r.pos, len(r.b)
			return eachExport(r, func(name string, _ byte, _ uint32) error {
				exports[name] = true
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return "", nil, nil, err
	}
	switch {
	case exports[exportStart]:
		return KindCommand, wasm, nil, nil
	case exports[exportInitialize] && exports[exportRun]:
	case exports[exportRun]:
		return "", nil, nil, fmt.Errorf("the module exports %s but no %s: a reactor (Go: -buildmode=c-shared) exports both", exportRun, exportInitialize)
	default:
		return "", nil, nil, fmt.Errorf("the module exports neither _start (a WASI command: Go's GOOS=wasip1 GOARCH=wasm) nor %s and %s (a reactor: Go's -buildmode=c-shared with //go:wasmexport %s)", exportInitialize, exportRun, exportRun)
	}
	if globalsErr != nil {
		return "", nil, nil, fmt.Errorf("a reactor's globals: %w", globalsErr)
	}
	if err := refuseStatefulCode(wasm); err != nil {
		return "", nil, nil, fmt.Errorf("a reactor may not use it (code.go; build it as a command): %w", err)
	}
	// Every mutable global exported under a name of ours, appended to the export section.
	var body []byte
	old := &reader{b: wasm[:exportsEnd], pos: exportsAt}
	n, _ := old.u32()
	body = AppendU32(body, n+uint32(len(mutable)))
	body = append(body, wasm[old.pos:exportsEnd]...)
	for _, idx := range mutable {
		name := globalExport + strconv.Itoa(idx)
		if exports[name] {
			return "", nil, nil, fmt.Errorf("the module exports %s itself, a name Podium keeps for its own", name)
		}
		body = AppendU32(body, uint32(len(name)))
		body = append(body, name...)
		body = append(body, 3) // a global
		body = AppendU32(body, uint32(idx))
		globals = append(globals, name)
	}
	return KindReactor, splice(wasm, 7, exportsAt, exportsEnd, body), globals, nil
}

// eachExport calls fn with each export of the export section r reads: its name, kind and index.
func eachExport(r *reader, fn func(name string, kind byte, idx uint32) error) error {
	n, err := r.u32()
	if err != nil {
		return fmt.Errorf("the export section: %w", err)
	}
	for range n {
		name, err := r.name()
		if err != nil {
			return fmt.Errorf("the export section: %w", err)
		}
		kind, err := r.byte()
		if err != nil {
			return fmt.Errorf("the export section: %w", err)
		}
		idx, err := r.u32()
		if err != nil {
			return fmt.Errorf("the export section: %w", err)
		}
		if err := fn(name, kind, idx); err != nil {
			return err
		}
	}
	return nil
}

// imports counts what an import section imports of the kinds whose index spaces the engine
// extends: globals and memories (the imported come first in each).
type imports struct{ globals, memories int }

// importsOf reads the import section.
func importsOf(r *reader) (imports, error) {
	var in imports
	n, err := r.u32()
	if err != nil {
		return in, err
	}
	for i := range n {
		if err := r.skipName(); err != nil {
			return in, err
		}
		if err := r.skipName(); err != nil {
			return in, err
		}
		kind, err := r.byte()
		if err != nil {
			return in, err
		}
		switch kind {
		case 0: // a function: its type
			_, err = r.u32()
		case 1: // a table: its reference type and limits
			if _, err = r.byte(); err == nil {
				err = r.skipLimits()
			}
		case 2: // a memory: its limits
			in.memories++
			err = r.skipLimits()
		case 3: // a global: its type and mutability
			in.globals++
			if _, err = r.byte(); err == nil {
				_, err = r.byte()
			}
		default:
			return in, fmt.Errorf("import %d is of kind 0x%02x, which a builder may not import", i, kind)
		}
		if err != nil {
			return in, err
		}
	}
	return in, nil
}

// mutableGlobals reads the global section: the indices of the mutable globals it defines.
func mutableGlobals(r *reader, imported int) ([]int, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	var out []int
	for i := range int(n) {
		typ, err := r.byte()
		if err != nil {
			return nil, err
		}
		mut, err := r.byte()
		if err != nil {
			return nil, err
		}
		if mut == 1 {
			if typ == 0x7b { // wazero sets a global from 64 bits: a v128's high half would be lost
				return nil, fmt.Errorf("global %d is a mutable v128, which its snapshot cannot set back", imported+i)
			}
			out = append(out, imported+i)
		}
		if err := r.skipConstExpr(); err != nil {
			return nil, fmt.Errorf("global %d: %w", imported+i, err)
		}
	}
	return out, nil
}

// skipConstExpr skips a constant expression up to and with its end (0x0b).
func (r *reader) skipConstExpr() error {
	for {
		op, err := r.byte()
		if err != nil {
			return err
		}
		switch op {
		case 0x0b: // end
			return nil
		case 0x41, 0x42: // i32.const, i64.const: a signed LEB128
			err = r.skipLEB()
		case 0x23, 0xd2: // global.get, ref.func: an index
			_, err = r.u32()
		case 0x43: // f32.const
			err = r.skip(4)
		case 0x44: // f64.const
			err = r.skip(8)
		case 0xd0: // ref.null: a reference type
			_, err = r.byte()
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // extended constants: add, sub, mul
		default:
			return fmt.Errorf("an initializer with opcode 0x%02x, which Podium does not read", op)
		}
		if err != nil {
			return err
		}
	}
}

func (r *reader) skipLEB() error {
	for range 10 {
		c, err := r.byte()
		if err != nil {
			return err
		}
		if c&0x80 == 0 {
			return nil
		}
	}
	return errTruncated
}

func (r *reader) skip(n int) error {
	if r.pos+n > len(r.b) {
		return errTruncated
	}
	r.pos += n
	return nil
}

func (r *reader) skipLimits() error {
	flags, err := r.u32()
	if err != nil {
		return err
	}
	if _, err := r.u32(); err != nil {
		return err
	}
	if flags&1 != 0 {
		_, err = r.u32()
	}
	return err
}

// name reads a name (a length and its bytes).
func (r *reader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	if r.pos+int(n) > len(r.b) {
		return "", errTruncated
	}
	s := string(r.b[r.pos : r.pos+int(n)])
	r.pos += int(n)
	return s, nil
}

// splice writes wasm again with the section of id whose body spans [at, end) replaced by body.
func splice(wasm []byte, id byte, at, end int, body []byte) []byte {
	// at is just past the section's size; the section starts one id byte and the size before.
	start := at - 1
	for start > 0 && wasm[start-1]&0x80 != 0 {
		start--
	}
	start-- // the id
	out := make([]byte, 0, len(wasm)+len(body)-(end-at)+8)
	out = append(out, wasm[:start]...)
	out = append(out, id)
	out = AppendU32(out, uint32(len(body)))
	out = append(out, body...)
	return append(out, wasm[end:]...)
}

// SnapshotBytes is the size of a reactor's snapshot (its memory after the warm-up), what the engine
// keeps of it besides its instances; 0 for a command.
func (m *Module) SnapshotBytes() int {
	if m.c.reactor == nil {
		return 0
	}
	return len(m.c.reactor.memory)
}
