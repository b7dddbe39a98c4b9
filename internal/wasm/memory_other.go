//go:build !linux

package wasm

import (
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// mappings is wazero's own memory where no mapping is made here.
type mappings struct{}

func newMappings(*atomic.Int64) *mappings { return &mappings{} }

func (*mappings) allocator() experimental.MemoryAllocator { return nil }

func (*mappings) freeAll() {}

func (*mappings) zero(int, int) bool { return false }
