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

// mmapAllocator makes reservations, counting those not given back yet in live.
func mmapAllocator(live *atomic.Int64) experimental.MemoryAllocator {
	return experimental.MemoryAllocatorFunc(func(_, max uint64) experimental.LinearMemory {
		mem, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
		if err != nil {
			return nil
		}
		live.Add(1)
		return &reserved{mem: mem, live: live}
	})
}

// Reallocate opens the memory up to size bytes; nil when the kernel refuses (the module's grow
// fails, as past its limit).
func (r *reserved) Reallocate(size uint64) []byte {
	if size > uint64(len(r.mem)) {
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

// Free gives the mapping back.
func (r *reserved) Free() {
	if r.mem != nil {
		_ = syscall.Munmap(r.mem)
		r.mem = nil
		r.live.Add(-1)
	}
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }
