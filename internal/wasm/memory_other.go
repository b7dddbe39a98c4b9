//go:build !linux

package wasm

import (
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// mmapAllocator is wazero's own growth where no mapping is made here.
func mmapAllocator(*atomic.Int64) experimental.MemoryAllocator { return nil }
