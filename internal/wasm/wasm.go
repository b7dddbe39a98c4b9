// Package wasm runs prompt builders (docs/builders.md) in-process with wazero, pure Go: each call
// writes one input to a module's stdin and reads its stdout, on an instance made anew for a WASI
// preview 1 command, or, for a reactor, on one set back to the state its start left (reactor.go).
// A module gets nothing else of the host: the wall clock is the request's time,
// the monotonic clock a counter, the random source a fixed seed, and it has no files, no
// environment, no arguments but its name and no network (WASI preview 1 has no sockets). So the
// same module and the same input give the same bytes, which is what lets `prompts verify` run a
// recorded version again.
//
// Limits: memory (pages of 64 KiB, for the whole runtime's modules), time (ctx: the module is
// closed when it ends), the bytes of stdout and stderr, and what a module declares besides its
// memory (tables, globals, segments, locals, functions: budget.go).
package wasm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/podium-llm/podium/internal/panics"
)

// Limits bound one call, and how many run at once.
type Limits struct {
	MemoryPages uint32 // of 64 KiB each, per instance
	OutputBytes int    // stdout
	StderrBytes int    // kept for the reason of a failure
	// Concurrent is how many calls run at once (0: one per CPU); the others wait, within their
	// deadline. Besides its pages, a call may hold up to 400 MB of call stack in the host
	// (wazero's ceiling for a module that recurses deeply): this bounds the sum.
	Concurrent int
	// CacheModules and CacheBytes bound the compiled modules kept besides those served now
	// (Engine.Keep), by count and by their modules' bytes (0: 8 modules, 128 MiB; cache.go).
	CacheModules int
	CacheBytes   int64
	// Start bounds how long a reactor's _initialize and warm-up calls may take when it is loaded
	// (0: 10 s; reactor.go).
	Start time.Duration
}

// Reasons a call fails, recorded with a fallback.
const (
	ReasonLoad     = "load"           // the module does not compile or is not a WASI command
	ReasonTimeout  = "timeout"        // still running when ctx ended (its deadline: the render's)
	ReasonTrap     = "trap"           // a WebAssembly trap: unreachable, out of bounds, stack exhausted
	ReasonExit     = "exit"           // a non-zero exit status (a Go builder out of memory exits 2)
	ReasonTooLarge = "too_large"      // stdout over OutputBytes
	ReasonInvalid  = "invalid_output" // stdout is not the answer the ABI asks for
	ReasonClock    = "clock"          // it read the wall clock
	ReasonMemory   = "memory"         // it ran out of memory (Limits.MemoryPages)
)

// Failure is a call that gave no usable answer: Reason is one of the Reason constants, Detail
// says what happened (with the module's stderr, bounded).
type Failure struct {
	Reason, Detail string
}

func (f *Failure) Error() string { return "builder " + f.Reason + ": " + f.Detail }

// Engine compiles modules once and runs them.
type Engine struct {
	rt     wazero.Runtime
	limits Limits

	mu       sync.Mutex
	compiled map[string]*compiled // by sha256 of the bytes: those kept and the cache (cache.go)
	loading  map[string]*load     // by sha256: the loads running (Load)
	kept     map[string]bool      // sha256 of the modules served now (Keep)
	clock    uint64               // counts loads and calls: the cache's order of use
	mapped   atomic.Int64         // instances' memory mappings not given back yet
	slots    chan struct{}        // one per call running
}

// NewEngine starts a runtime with WASI preview 1 and limits.
func NewEngine(ctx context.Context, limits Limits) (*Engine, error) {
	if limits.MemoryPages == 0 || limits.MemoryPages > 65536 || limits.OutputBytes < 1 || limits.StderrBytes < 0 || limits.Concurrent < 0 {
		return nil, fmt.Errorf("wasm: limits %+v: memory pages must be 1-65536, output bytes positive, concurrent calls 0 or more", limits)
	}
	if limits.Concurrent == 0 {
		limits.Concurrent = runtime.GOMAXPROCS(0)
	}
	if limits.CacheModules <= 0 {
		limits.CacheModules = defaultCacheModules
	}
	if limits.CacheBytes <= 0 {
		limits.CacheBytes = defaultCacheBytes
	}
	if limits.Start <= 0 {
		limits.Start = 10 * time.Second
	}
	// Not WithCloseOnContextDone: the compiled code checks the call's end itself (interrupt.go).
	cfg := wazero.NewRuntimeConfig().WithMemoryLimitPages(limits.MemoryPages)
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if err := instantiateWASI(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("wasm: WASI: %w", err)
	}
	return &Engine{rt: rt, limits: limits, compiled: map[string]*compiled{}, loading: map[string]*load{}, slots: make(chan struct{}, limits.Concurrent)}, nil
}

// WASI preview 1's errno values the host answers itself.
const (
	errnoSuccess = 0
	errnoBadf    = 8
	errnoNotsup  = 58
)

// instantiateWASI makes WASI preview 1 as wazero implements it, less what would change an
// instance's descriptors. A builder has stdin, stdout and stderr alone (no directory is mounted),
// and a reactor's instance serves call after call: one that closed its stdout would leave the next
// call none, a state its memory's snapshot cannot set back. So fd_close of those three succeeds and
// closes nothing (a program that checks what closing its stdout answered, as a C one calling
// fclose may, goes on; the descriptors stay for the next call), of any other descriptor answers
// ERRNO_BADF (there is none), and fd_renumber answers ERRNO_NOTSUP.
func instantiateWASI(ctx context.Context, rt wazero.Runtime) error {
	b := rt.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	i32 := api.ValueTypeI32
	closeFD := api.GoFunc(func(_ context.Context, stack []uint64) {
		if fd := uint32(stack[0]); fd <= 2 {
			stack[0] = errnoSuccess
		} else {
			stack[0] = errnoBadf
		}
	})
	b.NewFunctionBuilder().WithGoFunction(closeFD, []api.ValueType{i32}, []api.ValueType{i32}).Export("fd_close")
	refuse := api.GoFunc(func(_ context.Context, stack []uint64) { stack[0] = errnoNotsup })
	b.NewFunctionBuilder().WithGoFunction(refuse, []api.ValueType{i32, i32}, []api.ValueType{i32}).Export("fd_renumber")
	_, err := b.Instantiate(ctx)
	return err
}

// Close frees every compiled module and the runtime.
func (e *Engine) Close(ctx context.Context) error { return e.rt.Close(ctx) }

// SHA256 is the hex sha256 of a module's bytes: its identity.
func SHA256(wasm []byte) string {
	sum := sha256.Sum256(wasm)
	return hex.EncodeToString(sum[:])
}

// Module is a compiled module (with its bytes: a call on a module the cache freed meanwhile
// compiles it again).
type Module struct {
	e      *Engine
	c      *compiled
	SHA256 string
}

// Load compiles wasm, once per content while it stays compiled (cache.go): a module already
// compiled is shared. A module of neither kind (a WASI command exports _start; a reactor
// _initialize and podium_run) is refused here, not at its first call, as is a reactor whose start
// fails. The compilation and a reactor's start run outside the engine's lock: calls of other
// modules go on meanwhile.
func (e *Engine) Load(ctx context.Context, wasm []byte) (*Module, error) {
	sum := SHA256(wasm)
	e.mu.Lock()
	if c := e.cachedLocked(sum); c != nil {
		e.mu.Unlock()
		return &Module{e: e, c: c, SHA256: sum}, nil
	}
	// One load of a module at a time: the others wait for it (calls that found it freed by the
	// cache reload it together), and each module's start runs once.
	if l, ok := e.loading[sum]; ok {
		e.mu.Unlock()
		select {
		case <-l.done:
		case <-ctx.Done():
			return nil, &Failure{Reason: ReasonTimeout, Detail: "the module was still loading when the deadline passed"}
		}
		if l.err != nil {
			return nil, l.err
		}
		return &Module{e: e, c: l.c, SHA256: sum}, nil
	}
	l := &load{done: make(chan struct{})}
	e.loading[sum] = l
	e.mu.Unlock()
	l.c, l.err = e.compile(ctx, sum, wasm)
	e.mu.Lock()
	delete(e.loading, sum)
	if l.err == nil {
		e.addLocked(ctx, l.c)
	}
	e.mu.Unlock()
	close(l.done)
	if l.err != nil {
		return nil, l.err
	}
	return &Module{e: e, c: l.c, SHA256: sum}, nil
}

// load is a module being compiled (and, a reactor, started): done is closed when c or err is set.
type load struct {
	done chan struct{}
	c    *compiled
	err  error
}

// compile checks what a module declares (budget.go), reads its kind, compiles it and, for a
// reactor, starts it once (reactor.go).
func (e *Engine) compile(ctx context.Context, sum string, wasm []byte) (*compiled, error) {
	bounded, err := DefaultBudget.Bound(wasm)
	if err != nil {
		return nil, &Failure{Reason: ReasonLoad, Detail: err.Error()}
	}
	kind, bounded, globals, err := kindOf(bounded)
	if err != nil {
		return nil, &Failure{Reason: ReasonLoad, Detail: err.Error()}
	}
	if bounded, err = interruptible(bounded); err != nil {
		return nil, &Failure{Reason: ReasonLoad, Detail: err.Error()}
	}
	var c wazero.CompiledModule
	// wazero's validator panics on some malformed bodies (FuzzInterruptible found a call to a
	// function index past the module's: an index out of range in its func_validation.go): the
	// module's failure, not the composer's.
	if p := panics.Catch(func() { c, err = e.rt.CompileModule(ctx, bounded) }); p != nil {
		return nil, &Failure{Reason: ReasonLoad, Detail: fmt.Sprintf("the compiler failed on it: %v", p.Value)}
	}
	if err != nil {
		return nil, &Failure{Reason: ReasonLoad, Detail: err.Error()}
	}
	entry := &compiled{sha: sum, c: c, wasm: wasm, kind: kind}
	if kind == KindReactor {
		if entry.reactor, err = e.newReactor(ctx, c, globals); err != nil {
			_ = c.Close(ctx)
			return nil, err
		}
	}
	return entry, nil
}

// Kind is the module's kind: KindCommand (a WASI command, whose runtime starts in every call) or
// KindReactor (whose runtime started once, at load: reactor.go).
func (m *Module) Kind() string { return m.c.kind }

// Run runs the module once: input on stdin, now as its wall clock. It returns stdout, or a
// *Failure.
func (m *Module) Run(ctx context.Context, input []byte, now time.Time) ([]byte, error) {
	c := m.c
	if !m.e.acquire(c) { // freed by the cache since it was loaded: compiled again
		again, err := m.e.Load(ctx, c.wasm)
		if err != nil {
			return nil, err
		}
		if c = again.c; !m.e.acquire(c) {
			return nil, &Failure{Reason: ReasonLoad, Detail: "the compiled module was freed as it was loaded again (the cache is too small for the modules in use)"}
		}
	}
	defer m.e.release(ctx, c)
	select {
	case m.e.slots <- struct{}{}:
		defer func() { <-m.e.slots }()
	case <-ctx.Done():
		return nil, &Failure{Reason: ReasonTimeout, Detail: fmt.Sprintf("every one of the %d builder runs at once was taken until the deadline", cap(m.e.slots))}
	}
	if c.reactor != nil {
		return c.reactor.run(ctx, input, now)
	}
	// A command: a fresh instance runs _start on the input.
	s := &callState{}
	s.reset(input, now, 0, m.e.limits)
	maps := newMappings(&m.e.mapped)
	defer maps.freeAll() // also what an instance that failed while being made did not give back
	var mod api.Module
	var err error
	// wazero panics on an allocator's failure it does not expect: this call's failure, not the
	// composer's.
	if p := panics.Catch(func() {
		mod, err = m.e.rt.InstantiateModule(experimental.WithMemoryAllocator(ctx, maps.allocator()), c.c, config(s))
	}); p != nil {
		return nil, &Failure{Reason: ReasonMemory, Detail: fmt.Sprintf("the instance could not be made: %v", p.Value)}
	}
	if mod != nil {
		defer mod.Close(context.WithoutCancel(ctx))
	}
	if err == nil {
		err = runStart(ctx, mod)
	}
	switch {
	case s.stdout.over: // whatever the module did when its writes were refused
		return nil, &Failure{Reason: ReasonTooLarge, Detail: fmt.Sprintf("the answer is over %d bytes", m.e.limits.OutputBytes)}
	case err != nil:
		return nil, failureOf(ctx, err, s.stderr)
	case s.readClock:
		return nil, &Failure{Reason: ReasonClock, Detail: "the builder read the wall clock; the request's time is context.current_datetime"}
	}
	return s.stdout.buf.Bytes(), nil
}

// runStart runs a command's _start, armed to stop at ctx's end (interrupt.go): nil when it
// returned, or exited with status 0.
func runStart(ctx context.Context, mod api.Module) error {
	start := mod.ExportedFunction(exportStart)
	stop, ok := mod.ExportedGlobal(stopExport).(api.MutableGlobal)
	if start == nil || !ok {
		return &Failure{Reason: ReasonLoad, Detail: "the command exports no " + exportStart}
	}
	disarm := armStop(ctx, stop)
	defer disarm()
	_, err := start.Call(ctx)
	if exit := (*sys.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == 0 {
		return nil
	}
	return err
}

// failureOf names why a run failed, with the first lines of what the module said on stderr.
func failureOf(ctx context.Context, err error, stderr *capped) *Failure {
	var exit *sys.ExitError
	said := firstLines(stderr.buf.String(), 3, 400)
	if said != "" {
		said = ": " + said
	}
	switch {
	case strings.Contains(said, "out of memory") || strings.Contains(said, "memory allocation of"):
		// Go's runtime ("fatal error: out of memory") and Rust's ("memory allocation of N bytes
		// failed") say so before they trap or exit.
		return &Failure{Reason: ReasonMemory, Detail: "the module ran out of its memory" + said}
	case ctx.Err() != nil || errors.As(err, &exit) && (exit.ExitCode() == sys.ExitCodeDeadlineExceeded || exit.ExitCode() == sys.ExitCodeContextCanceled):
		return &Failure{Reason: ReasonTimeout, Detail: "still running when the render's deadline passed" + said}
	case errors.As(err, &exit):
		return &Failure{Reason: ReasonExit, Detail: fmt.Sprintf("exit status %d%s", exit.ExitCode(), said)}
	}
	// A trap's message is wazero's: its first line names it ("wasm error: unreachable").
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return &Failure{Reason: ReasonTrap, Detail: msg + said}
}

// capped keeps the first limit bytes written to it and refuses the rest, so a module that
// prints without end costs no more memory than the limit.
type capped struct {
	buf   bytes.Buffer
	limit int
	over  bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.limit - c.buf.Len(); len(p) > room {
		c.buf.Write(p[:max(room, 0)])
		c.over = true
		return max(room, 0), errors.New("wasm: output over its limit")
	}
	return c.buf.Write(p)
}

// firstLines is s's first n lines, joined by " | ", cut to at most size bytes.
func firstLines(s string, n, size int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	out := strings.Join(lines[:min(n, len(lines))], " | ")
	if len(out) > size {
		out = strings.ToValidUTF8(out[:size], "") + "..."
	}
	return out
}
