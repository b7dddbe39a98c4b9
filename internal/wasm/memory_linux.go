package wasm

import (
	"sync/atomic"
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// reserved backs a module's linear memory with its own mapping: the whole maximum is reserved as
// address space at once (no access, nothing committed) and each growth opens more of it in
// place. wazero's own growth copies the memory into a new slice each time, and a Go module's
// runtime grows its memory many times as its heap grows; fresh anonymous pages are zero already,
// and the mapping goes back to the kernel when the instance closes.
type reserved struct {
	mem  []byte // the whole reservation
	open int    // bytes readable and writable
	live *atomic.Int64
}

// mappings makes the reservations of one run and gives back, in freeAll, any that the instance
// did not (wazero leaves an instance that failed while it was being made unclosed). live counts
// the reservations not given back yet, engine-wide. wazero calls the allocator while it makes the
// instance, on the goroutine of Run, which calls freeAll after: made needs no lock.
type mappings struct {
	live *atomic.Int64
	made []*reserved
}

func newMappings(live *atomic.Int64) *mappings { return &mappings{live: live} }

func (ms *mappings) allocator() experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(capacity, max uint64) experimental.LinearMemory {
		mem, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
		if err != nil {
			return &inHeap{} // no address space to reserve: wazero's kind of memory, copied on growth
		}
		r := &reserved{mem: mem, live: ms.live}
		// wazero needs the initial size at once and cannot take a refusal of it: a mapping that
		// cannot open it is given back for memory in the heap.
		if r.Reallocate(capacity) == nil {
			_ = syscall.Munmap(mem)
			return &inHeap{}
		}
		ms.live.Add(1)
		ms.made = append(ms.made, r)
		return r
	})
}

// freeAll gives back every reservation of the run; one the instance gave back already is skipped.
func (ms *mappings) freeAll() {
	for _, r := range ms.made {
		r.Free()
	}
	ms.made = nil
}

// zero gives the bytes [from, to) of the instance's memory back to the kernel, which reads them
// as zero again (a reactor's memory past its snapshot, which its last call grew into), without
// writing them; false when the memory is not one mapping of this run.
func (ms *mappings) zero(from, to int) bool {
	if len(ms.made) != 1 {
		return false
	}
	r := ms.made[0]
	page := syscall.Getpagesize()
	if r.mem == nil || from%page != 0 || to > r.open || from > to {
		return false
	}
	return syscall.Madvise(r.mem[from:roundUp(to, page)], syscall.MADV_DONTNEED) == nil
}

// Reallocate opens the memory up to size bytes; nil when the kernel refuses (the module's grow
// fails, as past its limit).
func (r *reserved) Reallocate(size uint64) []byte {
	if r.mem == nil || size > uint64(len(r.mem)) {
		return nil
	}
	if want := roundUp(int(size), syscall.Getpagesize()); want > r.open {
		if err := syscall.Mprotect(r.mem[r.open:want], syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
			return nil
		}
		r.open = want
	}
	return r.mem[:size:size]
}

// Free gives the mapping back; a second call does nothing.
func (r *reserved) Free() {
	if r.mem != nil {
		_ = syscall.Munmap(r.mem)
		r.mem = nil
		if r.live != nil {
			r.live.Add(-1)
		}
	}
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// inHeap is memory in the Go heap, grown by copying: where no mapping could be made.
type inHeap struct{ buf []byte }

func (h *inHeap) Reallocate(size uint64) []byte {
	if size > uint64(cap(h.buf)) {
		grown := make([]byte, size, max(size, 2*uint64(cap(h.buf))))
		copy(grown, h.buf)
		h.buf = grown
	}
	h.buf = h.buf[:size]
	return h.buf
}

func (h *inHeap) Free() { h.buf = nil }
